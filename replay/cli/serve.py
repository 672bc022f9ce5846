"""`sketchrec serve`: the newest checkpoint served read-only, and what every serving command
shares: starting the HTTP server and stopping on SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Callable

from sketchrec.replay.cli.options import parse_host_port


def on_stop_signal(action: Callable[[], None]) -> None:
    """Call ``action`` on SIGINT or SIGTERM (no KeyboardInterrupt traceback). It runs in the main
    thread between two bytecodes, so it must only set a flag (no lock)."""
    def handler(signum, frame):
        action()

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)


def start_server(service, where: tuple[str, int], admin_token: str | None):
    """The live endpoint over ``service``, listening on ``where`` = (host, port)."""
    from sketchrec.stream.serving.http import create_app
    from sketchrec.stream.serving.server import ServerThread
    server = ServerThread(create_app(service, admin_token), *where).start()
    print(f"serving {server.url} (admin endpoints {'enabled' if admin_token else 'disabled'})",
          file=sys.stderr, flush=True)
    return server


def serve_until_interrupted(server) -> None:
    """Block until SIGINT/SIGTERM (or the server's end), then stop the server."""
    stopped: list[bool] = []
    on_stop_signal(lambda: stopped.append(True))
    while not stopped and server.thread.is_alive():
        time.sleep(0.2)
    server.stop()


def serve_main(argv: list[str] | None = None) -> int:
    from sketchrec.stream.serving.service import LearningService
    ap = argparse.ArgumentParser(prog="sketchrec serve", description="Serve the newest checkpoint "
                                 "read-only, reloading when a newer one is written.")
    ap.add_argument("--checkpoint", metavar="DIR", type=Path, required=True)
    ap.add_argument("--listen", metavar="HOST:PORT", default="127.0.0.1:8000")
    ap.add_argument("--reload-every", type=float, default=5.0, metavar="S",
                    help="seconds between checks for a newer checkpoint")
    args = ap.parse_args(argv)
    listen = parse_host_port(args.listen)
    try:
        service = LearningService.from_checkpoint(args.checkpoint)
    except FileNotFoundError as exc:
        print(f"sketchrec serve: {exc}", file=sys.stderr)
        return 2
    server = start_server(service, listen, admin_token=None)

    def reload_loop():
        while server.thread.is_alive():
            time.sleep(args.reload_every)
            service.reload_if_newer()  # the app reads service.recommender on every request

    threading.Thread(target=reload_loop, daemon=True).start()
    serve_until_interrupted(server)
    return 0
