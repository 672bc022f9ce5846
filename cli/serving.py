"""What every serving command shares: starting the HTTP server over a service and stopping on
SIGINT/SIGTERM (`serve`, `replay --serve`, `consume --serve`, a fleet's replicas).

Every serving command listens the same way (``start_server``): on an address that is not
loopback, /predict and /recommend need a credential unless ``--open`` (said in one start-up line);
a busy port is one line and exit code 2; SIGINT/SIGTERM while the serving workers start ends the
command quietly."""

from __future__ import annotations

import signal
import sys
import threading
import time
from typing import Callable

from sketchrec.cli.config import ServingSettings
from sketchrec.stream.serving.server import ServerThread


def on_stop_signal(action: Callable[[], None]) -> None:
    """Call ``action`` on SIGINT or SIGTERM (no KeyboardInterrupt traceback). It runs in the main
    thread between two bytecodes, so it must only set a flag (no lock)."""
    def handler(signum, frame):
        action()

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)


def start_server(service, serving: ServingSettings, reload_every: float | None = None):
    """The live endpoint over ``service``, listening on ``serving.listen`` = (host, port): with
    ``serving.workers`` > 1 (and a model that can be shared), that many reader processes over the
    model in shared memory (``stream.serving.workers``), else a server thread in this process.
    SystemExit(2) with one line when the address cannot be bound; SystemExit(0) on SIGINT/SIGTERM
    while the workers start (they are stopped)."""
    from sketchrec.cli.feedback import load_titles
    from sketchrec.stream.serving.http import access_for, loopback
    from sketchrec.stream.serving.server import PortInUse
    load_titles(service, serving.items)
    accountant_first(service)
    host = serving.listen[0]
    access = access_for(serving.access, host)
    try:
        server = _start(service, serving, access, reload_every)
    except PortInUse as exc:
        print(f"sketchrec: {exc.strerror} (stop the process using it, or choose another --listen/--serve port)",
              file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    except KeyboardInterrupt:
        print("sketchrec: stopped while the serving workers started", file=sys.stderr, flush=True)
        raise SystemExit(0) from None
    if access is False and not loopback(host):
        print(f"sketchrec: --open: /predict and /recommend answer anyone who reaches {host} about any "
              "user (no credential needed)", file=sys.stderr, flush=True)
    return server


def accountant_first(service) -> None:
    """A DP model's /privacy composes its epsilon in an HTTP thread: its accountant is imported
    here first, on the main thread (``privacy.accounting.load_accountant``). A joint-DP service
    (no ``privacy_mode``) is always DP; a service in no central mode loads nothing. Without the dp
    extra, /privacy says so itself when asked."""
    mode = getattr(service, "privacy_mode", None)
    if mode is None or mode.central:
        from sketchrec.extras import MissingExtra
        from sketchrec.privacy.accounting import load_accountant
        try:
            load_accountant()
        except MissingExtra:
            pass


def _start(service, serving: ServingSettings, access, reload_every: float | None):
    from sketchrec.stream.serving.http import create_app
    from sketchrec.stream.serving.workers.pool import WorkerPool, default_workers, shareable
    workers = serving.workers or default_workers()
    if workers > 1 and not shareable(service.recommender):   # never silently: the table's line
        from sketchrec.cli.config import refuse
        from sketchrec.models.capabilities import one_process_line
        if serving.workers:   # asked for: refused
            refuse("sketchrec", [one_process_line(service.recommender)])
        print(f"sketchrec: serving from one process: {one_process_line(service.recommender)}",
              file=sys.stderr, flush=True)
    if workers > 1 and shareable(service.recommender):
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:   # end as on Ctrl-C: workers stopped
            signal.signal(signal.SIGTERM, signal.default_int_handler)
        pool = WorkerPool(service, serving.listen, workers, serving.admin_token, access,
                          reload_every=reload_every, nice=serving.worker_nice).start()
        print(f"serving {pool.url} from {workers} worker processes (admin endpoints "
              f"{'enabled' if pool.app.state.admin else 'disabled'}, answered by the learner; "
              f"per-user access control {pool.access_flag})", file=sys.stderr, flush=True)
        return pool
    app = create_app(service, serving.admin_token, access)
    server = ServerThread(app, *serving.listen)   # binds now: a busy port is PortInUse
    # until the prediction kernels are compiled, /predict answers 503 at once (not after the compile)
    service.health.ready = False
    threading.Thread(target=service.warm_up, daemon=True, name="warm-up").start()
    server.start()
    print(f"serving {server.url} (admin endpoints {'enabled' if app.state.admin else 'disabled'}; "
          f"per-user access control {'on' if app.state.user_tokens else 'off'})",
          file=sys.stderr, flush=True)
    return server


def serve_until_interrupted(server) -> None:
    """Block until SIGINT/SIGTERM (or the server's end), then stop the server."""
    stopped: list[bool] = []
    on_stop_signal(lambda: stopped.append(True))
    while not stopped and server.thread.is_alive():
        time.sleep(0.2)
    server.stop()
