"""A ratings file shaped like MovieLens-25M, of any size, and what reading and replaying it costs.

``python -m sketchrec.benchmarks.big_file write OUT [--ratings N] [--string-ids]`` writes
``userId,movieId,rating,timestamp`` with a header, ML-25M's shape: 162,541 users and 59,047 items
(fewer for a small N), Zipf-skewed items, half-star ratings, rows grouped by user as
ML-25M's are. ``--string-ids`` writes UUID-like ids instead (the cost of opaque ids).
``python -m sketchrec.benchmarks.big_file parse FILE`` reads it with the compiled reader and
prints its parse rate (ratings per CPU-second) and peak resident memory. The files are large:
write them outside the repository (e.g. /tmp).

``sketchrec bench big-file [--ratings N] [--results docs/results.md]`` writes the file with
integer and with string ids into a temporary directory and reports, each figure from its own
process: the parse rate, and ``replay``'s learn rate, wall time and peak resident memory in time
order and with ``--order file``, and the cost of string ids against integer ids. A first small
replay fills numba's kernel cache, so the figures are those of any run after the first (the first
run after a change of the learners' sources also compiles the kernels, and its peak holds the
compiler's memory).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np

ML25M = {"ratings": 25_000_095, "users": 162_541, "items": 59_047}
CHUNK = 1_000_000


def shape(n_ratings: int) -> tuple[int, int]:
    """Users and items for ``n_ratings``: ML-25M's, or fewer when they would rate under 20 each."""
    return (max(10, min(ML25M["users"], n_ratings // 20)), max(10, min(ML25M["items"], n_ratings // 20)))


def write(path: str, n_ratings: int, seed: int = 0, string_ids: bool = False) -> None:
    import pyarrow as pa
    import pyarrow.csv as csv
    n_users, n_items = shape(n_ratings)
    rng = np.random.default_rng(seed)
    item_p = 1.0 / np.arange(1, n_items + 1) ** 0.9
    item_cdf = np.cumsum(item_p) / item_p.sum()
    per_user = rng.multinomial(n_ratings, rng.dirichlet(np.full(n_users, 0.6)))
    users = np.repeat(np.arange(1, n_users + 1), per_user)
    names = ({"u": np.array([str(uuid.UUID(int=int(x))) for x in rng.integers(0, 2**63, n_users + 1)]),
              "i": np.array([str(uuid.UUID(int=int(x))) for x in rng.integers(0, 2**63, n_items + 1)])}
             if string_ids else None)
    with open(path, "wb") as out:
        out.write(b"userId,movieId,rating,timestamp\n")
        for start in range(0, n_ratings, CHUNK):
            u = users[start:start + CHUNK]
            n = len(u)
            items = np.minimum(np.searchsorted(item_cdf, rng.random(n)), n_items - 1) + 1
            stars = np.clip(np.round((3.5 + rng.normal(0, 1.05, n)) * 2) / 2, 0.5, 5.0)
            stamps = rng.integers(789_652_009, 1_574_327_703, n)
            table = pa.table({"userId": names["u"][u] if names else u,
                              "movieId": names["i"][items] if names else items,
                              "rating": stars, "timestamp": stamps})
            csv.write_csv(table, out, csv.WriteOptions(include_header=False, quoting_style="none"))


def parse(path: str) -> dict:
    """Read ``path`` whole with the compiled reader: ratings, CPU-seconds, rate, peak RSS."""
    from sketchrec.data import read_ratings
    cpu, wall = time.process_time(), time.perf_counter()
    data, report = read_ratings(path)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"ratings": len(data), "skipped": report.n_skipped, "cpu_seconds": round(cpu, 2),
            "wall_seconds": round(wall, 2), "ratings_per_cpu_second": round(len(data) / cpu),
            "peak_rss_mb": round(peak, 1)}


RESULTS_BEGIN = "<!-- sketchrec bench big-file: begin -->"
RESULTS_END = "<!-- sketchrec bench big-file: end -->"


# Runs a module as ``python -m`` would and writes its own peak resident memory (VmHWM: this
# process's address space only) to a file at exit. The wait4 rusage of a child is no measure: on
# Linux it keeps the high-water mark of the parent's memory that the child was forked from.
_PEAK = r"""
import runpy, sys
out, module = sys.argv[1], sys.argv[2]
sys.argv = [module, *sys.argv[3:]]
try:
    runpy.run_module(module, run_name="__main__", alter_sys=True)
finally:
    with open("/proc/self/status") as status, open(out, "w") as fh:
        fh.write(next(line.split()[1] for line in status if line.startswith("VmHWM:")))
"""


def child(args: list[str], log: Path) -> dict:
    """``python -m sketchrec ARGS`` (``-m sketchrec.benchmarks.big_file`` when ARGS start with
    "parse") in a process of its own: ``child_module``."""
    module = "sketchrec.benchmarks.big_file" if args[0] == "parse" else "sketchrec"
    return child_module(module, args, log)


def child_module(module: str, args: list[str], log: Path) -> dict:
    """Run ``python -m MODULE ARGS``: its last stdout line as JSON, with its wall seconds and its
    peak resident MB (stderr appended to ``log``)."""
    with open(log, "ab") as err, tempfile.TemporaryDirectory() as tmp:
        peak = Path(tmp) / "peak"
        t0, cpu0 = time.perf_counter(), _children_cpu()
        proc = subprocess.run([sys.executable, "-c", _PEAK, str(peak), module, *args],
                              stdout=subprocess.PIPE, stderr=err, check=False)
        wall, cpu = time.perf_counter() - t0, _children_cpu() - cpu0
        if proc.returncode != 0:
            raise SystemExit(f"big-file bench: {module} {' '.join(args)} exited {proc.returncode}; see {log}")
        peak_kb = int(peak.read_text())
    return {**json.loads(proc.stdout.decode().strip().splitlines()[-1]), "wall": round(wall, 1),
            "cpu": round(cpu, 1), "peak_mb": round(peak_kb / 1024, 1)}


def _children_cpu() -> float:
    """CPU seconds of the waited-for children so far (a shared machine's wall time is not the
    run's: this is)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def kernel_sources() -> str:
    """The digest that names numba's kernel cache directory (sketchrec._kernel_cache)."""
    from sketchrec import _kernel_cache
    return _kernel_cache.sources_stamp(_kernel_cache._roots(), tuple(_kernel_cache._roots(_kernel_cache.NUMBA_ONLY)))


def bench(n_ratings: int, work: Path, log: Path) -> dict:
    """The figures of the module's docstring for an ``n_ratings`` file (see ``main``)."""
    replay = ["replay", "--json", "--quiet"]
    files = {"int": work / "ints.csv", "str": work / "strings.csv"}
    for kind, path in files.items():
        write(str(path), n_ratings, string_ids=kind == "str")
    warm = work / "warm.csv"
    write(str(warm), 20_000)

    def measured(args: list[str], tries: int = 3) -> dict:
        # numba's kernel cache first: an edit of the learners' sources since the last run makes
        # the next run compile, which is neither parsing nor learning; a run during which they
        # changed (its kernels may have been compiled in it) is measured again
        for _ in range(tries):
            before = kernel_sources()
            child(replay + [str(warm)], log)
            result = child(args, log)
            if kernel_sources() == before:
                return result
        return {**result, "sources_changed": True}

    out: dict = {"ratings": n_ratings, "runs": {}}
    for kind, path in files.items():
        runs = {"parse": child(["parse", str(path)], log), "time": measured(replay + [str(path)])}
        if kind == "int":
            runs["file"] = measured(replay + [str(path), "--order", "file"])
        out["runs"][kind] = {name: {k: r[k] for k in ("wall", "cpu", "peak_mb", "ratings_per_cpu_second",
                                                      "throughput_per_s", "rmse", "sources_changed") if k in r}
                             for name, r in runs.items()}
        path.unlink()
    ints, strs = out["runs"]["int"], out["runs"]["str"]
    out["string_over_int"] = {"replay_wall": round(strs["time"]["wall"] / ints["time"]["wall"], 2),
                              "replay_cpu": round(strs["time"]["cpu"] / ints["time"]["cpu"], 2),
                              "replay_peak": round(strs["time"]["peak_mb"] / ints["time"]["peak_mb"], 2),
                              "parse_rate": round(ints["parse"]["ratings_per_cpu_second"]
                                                  / strs["parse"]["ratings_per_cpu_second"], 2)}
    return out


def markdown(report: dict, command: str) -> str:
    """The report as the results page's block: one table, then the string-id ratios."""
    lines = [f"Command: `{command}` ({report['ratings']:,} ratings, ML-25M-shaped; every figure "
             "from its own process, one run each, after a run that filled the kernel cache)", "",
             "| ids | run | wall (s) | CPU (s) | peak RSS (MB) | parse (ratings/CPU-s) | learn (ratings/s) |",
             "|---|---|---|---|---|---|---|"]
    names = {"parse": "parse only", "time": "replay (time order)", "file": "replay --order file"}
    for kind, runs in report["runs"].items():
        for name, r in runs.items():
            parse_rate = r.get("ratings_per_cpu_second")
            learn_rate = r.get("throughput_per_s")
            note = " (sources changed while it ran: may include compiling)" if r.get("sources_changed") else ""
            lines.append(f"| {kind} | {names[name]}{note} | {r['wall']:.1f} | {r.get('cpu', 0):.1f} | {r['peak_mb']:.0f} | "
                         f"{f'{parse_rate:,.0f}' if parse_rate else ''} | "
                         f"{f'{learn_rate:,.0f}' if learn_rate else ''} |")
    ratio = report["string_over_int"]
    lines += ["", f"String (UUID-like) ids over integer ids: replay wall {ratio['replay_wall']:.2f}x, "
              f"CPU {ratio.get('replay_cpu', 0):.2f}x, "
              f"peak memory {ratio['replay_peak']:.2f}x, parse CPU {ratio['parse_rate']:.2f}x."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sketchrec.benchmarks.big_file", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    w = sub.add_parser("write", help="write an ML-25M-shaped ratings file")
    w.add_argument("out")
    w.add_argument("--ratings", type=int, default=10_000_000)
    w.add_argument("--seed", type=int, default=0)
    w.add_argument("--string-ids", action="store_true", help="UUID-like user and item ids")
    p = sub.add_parser("parse", help="read a file whole; its parse rate and peak memory (JSON)")
    p.add_argument("path")
    b = sub.add_parser("bench", help="parse and replay figures, integer and string ids (JSON, markdown)")
    b.add_argument("--ratings", type=int, default=10_000_000)
    b.add_argument("--results", type=Path, metavar="PAGE", help="also write the report into PAGE "
                   f"between the lines {RESULTS_BEGIN} and {RESULTS_END} (docs/results.md)")
    args = ap.parse_args(argv)
    if args.command == "bench":
        return _bench_command(args, argv)
    if args.command == "write":
        write(args.out, args.ratings, args.seed, args.string_ids)
        print(args.out)
    else:
        print(json.dumps(parse(args.path)))
    return 0


def _bench_command(args: argparse.Namespace, argv: list[str] | None) -> int:
    from sketchrec.benchmarks.suite import results_block, write_results
    markers = {"begin": RESULTS_BEGIN, "end": RESULTS_END}
    if args.results is not None:
        try:
            results_block(args.results.read_text(), **markers)
        except (OSError, ValueError) as exc:   # before minutes of measuring, not after
            raise SystemExit(f"big-file bench: --results {args.results}: {exc}") from None
    with tempfile.TemporaryDirectory(prefix="sketchrec-big-file-") as work:
        log = Path(tempfile.gettempdir()) / "sketchrec-big-file.log"
        report = bench(args.ratings, Path(work), log)
    tail = argv if argv is not None else sys.argv[1:]
    command = "sketchrec bench big-file " + " ".join(tail[1:] if tail[:1] == ["bench"] else tail)
    text = markdown(report, command.strip())
    print(text)
    if args.results is not None:
        write_results(args.results, "# big file\n\n" + text, **markers)
        print(f"wrote the big-file block of {args.results}")
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
