"""`sketchrec bench serving`: the tail while learning, against the same service not learning.

    sketchrec bench serving [PATH] [--seconds 10] [--concurrency 16] [--workers N] [--quick] [--json]

Two runs of the load test (``loadtest``: 16 connections, 50/50 /predict and /recommend?k=10 over
PATH's ids, `wrk` when installed): a service learning PATH at full speed while it answers (its
learning rate measured alone, under the load and alone again, in the same process), and as the
baseline a read replica of a checkpoint of PATH (the same serving path, nothing learning). The
targets: while learning >= ``TARGET_RPS`` requests/s at p99 <= ``TARGET_P99_MS`` ms, keeping >=
``TARGET_KEPT`` of the learning rate.

On a shared machine latencies measure the machine as much as the service: the report also gives
the server's CPU time per request (its process tree's, a figure a busy machine disturbs least) and
the machine's load average over the run, so two runs can be compared. The last stdout line with
``--json`` is one JSON object: ``learning`` and ``baseline`` -> ``requests_per_s``, ``p99_ms``,
(``learning_kept`` while learning), ``server_cpu_us_per_request`` (the whole service: while
learning, the learner's own work too) and ``reader_cpu_us_per_request`` (the serving processes
alone: what a request costs them, learning or not); ``targets``; ``met``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
from pathlib import Path

from sketchrec.benchmarks import PATH_HELP, data_file

TARGET_RPS, TARGET_P99_MS, TARGET_KEPT = 5_000, 10.0, 0.8
FIGURES = ("requests_per_s", "p50_ms", "p99_ms", "p999_ms", "max_ms", "errors", "requests",
           "client", "server_cpu_us_per_request", "reader_cpu_us_per_request")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _figures(run: dict) -> dict:
    return {k: run.get(k) for k in FIGURES}


def run(path: Path, seconds: float = 10.0, concurrency: int = 16, workers: int | None = None,
        client: str = "auto", quick: bool = False) -> dict:
    """The report (see module docstring); ``quick``: a checkpoint of 20,000 ratings for the
    baseline and the seconds given (the test suite's check that the command runs)."""
    from sketchrec.benchmarks.loadtest import run_load_test
    load0 = os.getloadavg()[0]
    report = run_load_test(path, seconds=seconds, concurrency=concurrency, port=_free_port(),
                           client=client, workers=workers,
                           checkpoint_limit=20_000 if quick else None)
    learning, replica = report["learning"], report["replica"]
    out = {"learning": {**_figures(learning), "learning_kept": learning["learning_kept"],
                        "learning_per_s_alone": learning["learning_per_s_alone"],
                        "learning_per_s_under_load": learning["learning_per_s_under_load"]},
           "baseline": _figures(replica),
           "targets": {"requests_per_s": TARGET_RPS, "p99_ms": TARGET_P99_MS,
                       "learning_kept": TARGET_KEPT},
           "concurrency": concurrency, "workers": workers, "seconds": seconds, "quick": quick,
           "cpus": os.cpu_count(), "load_average": [load0, os.getloadavg()[0]]}
    out["met"] = met(out["learning"])
    return out


def met(learning: dict) -> bool:
    """Whether the figures while learning meet every target.

    >>> met({"requests_per_s": 6000, "p99_ms": 8.0, "learning_kept": 0.9})
    True
    >>> met({"requests_per_s": 6000, "p99_ms": 30.0, "learning_kept": 0.9})
    False
    """
    kept = learning.get("learning_kept")
    return bool(learning["requests_per_s"] >= TARGET_RPS and learning["p99_ms"] <= TARGET_P99_MS
                and kept is not None and kept >= TARGET_KEPT)


def describe(report: dict) -> list[str]:
    """The report in a few lines of text."""
    lines = []
    for name, r in (("while learning", report["learning"]), ("baseline (read replica)", report["baseline"])):
        cpu, readers = r["server_cpu_us_per_request"], r.get("reader_cpu_us_per_request")
        lines.append(f"{name}: {r['requests_per_s']:,.0f} req/s, p50 {r['p50_ms']:.2f} ms, p99 "
                     f"{r['p99_ms']:.2f} ms, p99.9 {r['p999_ms']:.2f} ms, errors {r['errors']}, "
                     f"server CPU {'n/a' if cpu is None else f'{cpu:.0f}'} us/request, readers "
                     f"{'n/a' if readers is None else f'{readers:.0f}'} ({r['client']})")
    r = report["learning"]
    kept = r["learning_kept"]
    lines.append(f"learning {r['learning_per_s_alone']:,.0f} ratings/s alone, "
                 f"{r['learning_per_s_under_load']:,.0f} under load "
                 f"({'n/a' if kept is None else f'{kept:.0%}'} kept); load average "
                 f"{report['load_average'][0]:.1f} -> {report['load_average'][1]:.1f} on "
                 f"{report['cpus']} CPUs; targets {'met' if report['met'] else 'not met'}")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="sketchrec bench serving", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("path", nargs="?", type=Path, help=PATH_HELP)
    ap.add_argument("--seconds", type=float, help="length of each load window (default 10; 1 with --quick)")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--workers", type=int, help="serving processes (default: the commands' own)")
    ap.add_argument("--client", choices=("auto", "wrk", "httpx"), default="auto")
    ap.add_argument("--quick", action="store_true", help="short windows, a small checkpoint")
    ap.add_argument("--json", action="store_true", help="last stdout line: one JSON object")
    args = ap.parse_args(argv)
    seconds = args.seconds or (1.0 if args.quick else 10.0)
    report = run(data_file(args.path), seconds, args.concurrency, args.workers, args.client, args.quick)
    print("\n".join(describe(report)))
    if args.json:
        print(json.dumps(report))
    return 0
