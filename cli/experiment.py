"""`sketchrec experiment`: run one reproducible experiment (figures, tables, JSON)."""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

PROG = "sketchrec experiment"


def experiment_main(argv: list[str] | None = None) -> int:
    from sketchrec.paths import MissingData
    from sketchrec.experiments import registry
    ap = argparse.ArgumentParser(prog=PROG, description="Run a reproducible experiment.")
    ap.add_argument("name", nargs="?", help="experiment name (see --list)")
    ap.add_argument("--list", action="store_true", help="list the experiments")
    ap.add_argument("--data", help="data path or data-set name (e.g. ml-1m, fetched on first use), "
                    "where the experiment takes one (default: $SKETCHREC_DATA/ml-100k/u.data, "
                    "$SKETCHREC_DATA = ../shared/data)")
    ap.add_argument("--out", type=Path, default=Path("out"), help="output directory")
    ap.add_argument("--quick", action="store_true", help="reduced grid (for tests)")
    args = ap.parse_args(argv)
    experiments = registry()
    if args.list or not args.name:
        for name, mod in experiments.items():
            print(f"{name:20s} {mod.DESCRIPTION}")
        return 0
    if args.name not in experiments:
        print(f"{PROG}: unknown experiment {args.name!r}; see --list", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    done = threading.Event()
    try:
        from sketchrec.cli.fetch import resolve_data
        data = resolve_data(args.data, PROG)
        # its progress: the experiment's own lines (a grid's fits) and this heartbeat
        threading.Thread(target=_heartbeat, args=(args.name, t0, done), daemon=True).start()
        experiments[args.name].run(Path(data) if data else None, args.out, args.quick)
    except MissingData as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    finally:
        done.set()
    print(f"{args.name}: wrote {args.out} in {time.perf_counter() - t0:.1f} s")
    return 0


def _heartbeat(name: str, t0: float, done: threading.Event, every: float = 30.0) -> None:
    """A line every ``every`` seconds while an experiment runs: none is silent for minutes."""
    while not done.wait(every):
        print(f"{name}: still running, {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
