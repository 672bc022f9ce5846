"""`sketchrec serve`: the newest checkpoint served read-only, or a fleet's model followed from its
model topic (``--bootstrap``). How a server starts and stops: ``cli.serving``."""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

from sketchrec.privacy.admin_token import add_admin_token_args
from sketchrec.cli.config import ServingSettings
from sketchrec.cli.feedback import add_items_arg
from sketchrec.models.capabilities import DEFAULT_KIND
from sketchrec.cli.options import (ACCESS, add_access_args, add_max_items_arg, add_workers_arg,
                                  parse_host_port)
from sketchrec.cli.serving import serve_until_interrupted, start_server
from sketchrec.stream.serving.server import ServerThread


def serve_main(argv: list[str] | None = None) -> int:
    from sketchrec.stream.serving.joint import open_checkpoint
    ap = argparse.ArgumentParser(prog="sketchrec serve", description="Serve the newest checkpoint "
                                 "read-only, reloading when a newer one is written; or, with "
                                 "--bootstrap and --topic, a fleet's model (snapshot + model topic). "
                                 "It serves the learner the checkpoint holds: the default learner of "
                                 f"replay and consume is {DEFAULT_KIND} (`sketchrec modes`).")
    source = ap.add_mutually_exclusive_group(required=True)
    source.add_argument("--checkpoint", metavar="DIR", type=Path)
    source.add_argument("--bootstrap", metavar="HOST:PORT", help="a fleet's broker (with --topic)")
    ap.add_argument("--topic", help="the fleet's input topic (its model topic is TOPIC.model)")
    ap.add_argument("--model-topic", metavar="TOPIC", help="the fleet's model topic, if not TOPIC.model")
    ap.add_argument("--wait", type=float, default=60.0, metavar="S",
                    help="fleet: wait up to S seconds for the first snapshot")
    ap.add_argument("--listen", metavar="HOST:PORT", default="127.0.0.1:8000")
    ap.add_argument("--reload-every", type=float, default=5.0, metavar="S",
                    help="seconds between checks for a newer checkpoint")
    add_workers_arg(ap)
    add_admin_token_args(ap)
    add_access_args(ap)
    add_items_arg(ap)
    add_max_items_arg(ap)
    args = ap.parse_args(argv)
    serving = ServingSettings(parse_host_port(args.listen), args.admin_token, args.checkpoint,
                              ACCESS[args.access_control], args.workers, args.worker_nice,
                              Path(args.items) if args.items else None, args.max_items)
    if args.max_items and args.bootstrap is None:   # a checkpoint's catalogue is its learner's
        ap.error("--max-items bounds the catalogue of a fleet replica (--bootstrap); a served "
                 "checkpoint keeps its learner's: give --max-items to replay or consume")
    if args.bootstrap is not None:
        if not args.topic:
            ap.error("--bootstrap needs --topic (the fleet's input topic)")
        from sketchrec.cli.fleet import serve_replica
        return serve_replica(args, serving)
    try:
        service = open_checkpoint(args.checkpoint)   # a joint-DP model's or a learning model's
    except (FileNotFoundError, ValueError) as exc:  # none, none verifies, or a ledger refused
        print(f"sketchrec serve: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    server = start_server(service, serving, reload_every=args.reload_every)
    if not isinstance(server, ServerThread):   # the worker pool reloads into shared memory itself
        serve_until_interrupted(server)
        return 0

    def reload_loop():
        while server.thread.is_alive():
            time.sleep(args.reload_every)
            service.reload_if_newer()  # the app reads service.recommender on every request

    threading.Thread(target=reload_loop, daemon=True).start()
    serve_until_interrupted(server)
    return 0
