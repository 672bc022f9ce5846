"""The commands: `replay` and the `sketchrec` umbrella command, one module per subcommand.

``sketchrec_main`` and ``replay_main`` are the console scripts (pyproject.toml); each command
module is imported only when its command runs.
"""

from __future__ import annotations

import argparse
import faulthandler
import importlib
import io
import os
import signal
import sys
from typing import Callable

from sketchrec.extras import from_import_error

# name -> (one line of help, module under sketchrec.cli, its main function)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "replay": ("replay a ratings file or the synthetic stream into the learner", "replay", "replay_main"),
    "experiment": ("run a reproducible experiment (figures, tables, JSON)", "experiment", "experiment_main"),
    "serve": ("serve the newest checkpoint read-only over HTTP", "serve", "serve_main"),
    "consume": ("learn from a Kafka topic with checkpoints and dead letters", "consume", "consume_main"),
    "produce": ("publish a ratings file to a Kafka topic", "produce", "produce_main"),
    "fetch": ("download a public ratings data set (MovieLens) by name, check and cache it",
              "fetch", "fetch_main"),
    "modes": ("what runs with what: model kinds against privacy modes, inputs and serving modes "
              "(--json, --markdown)", "modes", "modes_main"),
    "bench": ("throughput, memory, serving and Kafka benchmarks against river and Vowpal Wabbit",
              "bench", "bench_main"),
}


def _extras_checked(feature: str, run: Callable[[], int], argv: list[str]) -> int:
    """``run()``, or exit 2 with one line when it needs an extra that is not installed (the
    extras import their libraries where the feature runs: ``sketchrec.extras``)."""
    try:
        return run()
    except ImportError as exc:
        missing = from_import_error(feature, exc)
        if missing is None:
            raise   # not an extra's library: a broken install, shown whole
        if missing.feature == feature and missing.extra == "serve" and any(
                a.split("=")[0] in ("--serve", "--workers") for a in argv):
            missing = type(missing)(f"{feature} --serve", "serve")
        print(missing, file=sys.stderr)
        return 2


BLAS_THREADS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def one_blas_thread() -> None:
    """One BLAS thread in this process and the processes it starts, unless the operator set one
    of ``BLAS_THREADS``. Our BLAS calls are small (a chunk's squared errors, a catalogue's scores
    for one user); one large enough for OpenBLAS to split over threads leaves its workers spinning
    after it, taking a core the learner, the HTTP server or a fleet's other members needed (a
    consumer learning large polls lost a good share of its CPU to that spin)."""
    if any(os.environ.get(name) for name in BLAS_THREADS):
        return
    for name in BLAS_THREADS:   # children read it when they load numpy
        os.environ[name] = "1"
    from threadpoolctl import threadpool_limits   # this process loaded numpy's BLAS already
    threadpool_limits(1, user_api="blas")


def replay_main(argv: list[str] | None = None, prog: str = "replay") -> int:
    """The `replay` console script (``cli.replay.replay_main``; a missing extra: one line, exit 2)."""
    one_blas_thread()
    # imported here, on the main thread: the other commands (a consumer, a server) do not pay for it
    from sketchrec.cli.replay import replay_main as _replay_main
    argv = sys.argv[1:] if argv is None else argv
    return _extras_checked(prog, lambda: _replay_main(argv, prog=prog), argv)


def command(name: str) -> Callable[[list[str]], int]:
    """The main function of a subcommand (`replay` reports itself as `sketchrec replay`)."""
    if name == "replay":
        return lambda argv: replay_main(argv, prog="sketchrec replay")
    _, module, function = COMMANDS[name]

    def main(argv: list[str]) -> int:
        return getattr(importlib.import_module(f"sketchrec.cli.{module}"), function)(argv)
    return lambda argv: _extras_checked(f"sketchrec {name}", lambda: main(argv), argv)


def sketchrec_main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    one_blas_thread()
    # `kill -USR1 PID` prints every thread's stack to stderr (a long-running service that stops
    # making progress can say where, without stopping it)
    if hasattr(signal, "SIGUSR1"):
        try:
            faulthandler.register(signal.SIGUSR1, all_threads=True)
        except (io.UnsupportedOperation, ValueError, AttributeError):
            pass   # stderr without a file descriptor (called in-process, e.g. under pytest)
    ap = argparse.ArgumentParser(prog="sketchrec", description="Privacy-aware streaming recommender "
                                 "with count-sketch matrix factorization.")
    ap.add_argument("command", choices=sorted(COMMANDS), help="; ".join(
        f"{name}: {desc}" for name, (desc, _, _) in sorted(COMMANDS.items())))
    ap.add_argument("args", nargs=argparse.REMAINDER, help="the command's own arguments (see COMMAND --help)")
    if not argv or argv[0] in ("-h", "--help"):
        ap.print_help()
        return 0
    ns = ap.parse_args(argv[:1])
    return command(ns.command)(argv[1:])


__all__ = ["COMMANDS", "replay_main", "sketchrec_main"]
