"""`sketchrec bench`: throughput, memory, serving and Kafka figures against river, Vowpal Wabbit and
the dense baseline, side by side in one command. Every throughput figure is the median of >= 3 runs.

Sections: learners on ML-100k and on a synthetic stream (d = 32); resident memory against the number
of distinct users (each model in its own process); serving (a read replica, and a service learning
while it answers: requests/s, latency percentiles, learning rate alone and under load); Kafka topic ->
model against the bare consumer; the physical limit of a rating update. `--quick` shrinks every
section so the whole report takes well under a minute (the test suite runs it).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from numba import njit

from sketchrec.data import SyntheticStream, order_ratings, read_ratings
from sketchrec.benchmarks import PATH_HELP, data_file
from sketchrec.benchmarks.learners import learner_table, print_table

DIM = 32

_MEMORY_PROBE = r"""
import json, os, sys
import numpy as np
model_name, n_users = sys.argv[1], int(sys.argv[2])
def rss():
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
if model_name == "sketch":
    from sketchrec.models import SketchMF
    model = SketchMF(capacity=200_000, dim=32, space_gain=4.0)
    # make the fixed allocation resident (numpy's zeros are mapped lazily, page by page)
    for fixed in (model.vectors.cells, model.biases.cells, *model.store.heavy):
        fixed.fill(0)
elif model_name == "dense":
    from sketchrec.models import DenseMF
    model = DenseMF(dim=32)
else:
    from sketchrec.models.river_adapters import RiverBiasedMF
    model = RiverBiasedMF(dim=32)
# ids drawn uniformly (no per-user generator state to confuse the measurement); 2 ratings per user
rng, batch, total = np.random.default_rng(1), 20_000, 2 * n_users
def chunk(n):
    return rng.integers(1, n_users + 1, n), rng.integers(1, 2001, n), rng.integers(1, 6, n).astype(float)
model.learn_many(*chunk(batch))           # warm-up: compilation and batch-sized temporaries
before = rss()
for start in range(0, total, batch):
    model.learn_many(*chunk(min(batch, total - start)))
after = rss()
rng = np.random.default_rng(1)            # the same ids again, counted after measuring
users = np.unique(np.concatenate([chunk(min(batch, total - s))[0] for s in [0] + list(range(0, total, batch))]))
print(json.dumps({"rss_total_bytes": after, "rss_growth_bytes": after - before,
                  "distinct_users": int(len(users)), "model_bytes": int(model.nbytes)}))
"""


def memory_scaling(sizes: list[int], quick: bool = False) -> dict:
    """Resident-memory growth while learning streams with more and more distinct users. ``quick``:
    no warm-up probe, and two probes at a time (each process measures only its own memory)."""
    def probe(model: str, n: int) -> dict:
        res = subprocess.run([sys.executable, "-c", _MEMORY_PROBE, model, str(n)], capture_output=True,
                             text=True, check=True, timeout=1800)
        return {"users": n, **json.loads(res.stdout.strip().splitlines()[-1])}

    # a throwaway first probe fills numba's on-disk cache: otherwise the first measured process alone
    # holds the compiler (tens of MB resident) and the sizes are not compared like for like
    models = ("sketch", "dense", "river")
    if not quick:
        probe("sketch", min(sizes))
    with ThreadPoolExecutor(2 if quick else 1) as pool:
        rows = list(pool.map(lambda job: probe(*job), [(m, n) for m in models for n in sizes]))
    out: dict = {m: rows[k * len(sizes):(k + 1) * len(sizes)] for k, m in enumerate(models)}
    totals = [r["rss_total_bytes"] for r in out["sketch"]]
    out["sketch_rss_spread"] = (max(totals) - min(totals)) / min(totals)  # flat = small
    return out


@njit(nogil=True, cache=True)
def _random_updates(cells, idx):
    for n in range(idx.shape[0]):
        cells[idx[n]] += 1.0


def physical_limit(model_cells: int, k: int = 4, d: int = DIM) -> dict:
    """Bytes a rating update touches (2kd cells, read and written) and the machine's random
    read-modify-write rate on an array of the model's size."""
    rng = np.random.default_rng(0)
    cells = np.zeros(model_cells, dtype=np.float32)
    idx = rng.integers(0, model_cells, 4_000_000)
    _random_updates(cells, idx[:10])
    best = min(_timed(lambda: _random_updates(cells, idx)) for _ in range(3))
    rate = len(idx) / best
    per_rating = 2 * k * d
    return {"cells_per_rating": per_rating, "bytes_per_rating": per_rating * 4 * 2,
            "random_updates_per_s": rate, "bound_ratings_per_s": rate / per_rating}


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def serving(path: Path, seconds: float, client: str, quick: bool = False) -> dict:
    """The load test (``loadtest``): a read replica of a checkpoint of ``path`` (of its first
    20,000 ratings with ``quick``) and a service learning ``path``, each under 16 connections."""
    from sketchrec.benchmarks.loadtest import run_load_test
    return run_load_test(path, seconds=seconds, concurrency=16, port=_free_port(), client=client,
                         checkpoint_limit=20_000 if quick else None)


def _serving_lines(s: dict) -> list[str]:
    lines = ["", "## Serving", "", "16 connections, 50/50 `/predict` and `/recommend?k=10` over the "
             "data's ids; server CPU is the serving process tree's time per request.", "",
             "| service | client | requests/s | p50 ms | p99 ms | p99.9 ms | errors | server CPU us/request |",
             "|---|---|---|---|---|---|---|---|"]
    for target, name in (("replica", "read replica (`serve --checkpoint`)"), ("learning", "learning (`replay --serve`)")):
        r = s[target]
        cpu = r["server_cpu_us_per_request"]
        lines.append(f"| {name} | {r['client']} | {r['requests_per_s']:,.0f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | "
                     f"{r['p999_ms']:.2f} | {r['errors']} | {'n/a' if cpu is None else f'{cpu:.0f}'} |")
    r = s["learning"]
    return lines + ["", f"Learning {r['learning_per_s_alone']:,.0f} ratings/s alone, "
                    f"{r['learning_per_s_under_load']:,.0f} under the load ({r['learning_kept']:.0%} kept)."]


def kafka(path: Path, copies: int, limit: int | None) -> dict:
    from sketchrec.benchmarks.kafka import main as kafka_main
    argv = [str(path), "--copies", str(copies)] + (["--limit", str(limit)] if limit else [])
    return kafka_main(argv)


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _plot(memory: dict, out: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    for model in ("sketch", "dense", "river"):
        rows = memory[model]
        ax.plot([r["distinct_users"] for r in rows], [r["rss_total_bytes"] / 2**20 for r in rows],
                marker="o", label=model)
    ax.set_xscale("log")
    ax.set_xlabel("distinct users learned")
    ax.set_ylabel("process resident memory (MiB)")
    ax.set_title("Memory against users (d = 32)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "memory.png", dpi=120)
    plt.close(fig)


def _markdown(report: dict) -> str:
    lines = ["# sketchrec bench", "", f"Command: `{report['command']}`", ""]
    for stream in ("ml100k", "synthetic"):
        t = report["learners"][stream]
        lines += [f"## Learners on {stream} ({t['ratings']:,} ratings, d = {t['dim']})", "",
                  "| learner | ratings | RMSE | ratings/s |", "|---|---|---|---|"]
        lines += [f"| {k} | {v['ratings']:,} | {v['rmse']:.4f} | {v['throughput_per_s']:,.0f} |"
                  for k, v in t.items() if isinstance(v, dict)]
        vw = t["ratio_sketch_over_vw"]
        lines += ["", f"sketch/river {t['ratio_sketch_over_river']:.1f}x; sketch/VW "
                  + (f"{vw:.2f}x" if vw else "n/a") + f"; monitor overhead {t['ratio_monitor_overhead']:.3f}", ""]
    lines += ["## Memory against distinct users", "",
              "| model | users | process RSS (MiB) | growth while learning (MiB) | model bytes |",
              "|---|---|---|---|---|"]
    for model in ("sketch", "dense", "river"):
        lines += [f"| {model} | {r['distinct_users']:,} | {r['rss_total_bytes'] / 2**20:.1f} | "
                  f"{r['rss_growth_bytes'] / 2**20:.1f} | {r['model_bytes']:,} |" for r in report["memory"][model]]
    lines += ["", f"SketchMF resident memory spread across sizes: {report['memory']['sketch_rss_spread']:.1%}"]
    p = report["physical_limit"]
    lines += ["", "## Physical limit", "",
              f"{p['cells_per_rating']} cells ({p['bytes_per_rating']} bytes read and written) per rating; "
              f"{p['random_updates_per_s']:,.0f} random updates/s on a model-sized array -> at most "
              f"{p['bound_ratings_per_s']:,.0f} ratings/s; measured {report['sketch_fraction_of_bound']:.0%} of it."]
    if report.get("serving"):
        lines += _serving_lines(report["serving"])
    for key, title in (("kafka", "Kafka"), ("fleet", "Fleet")):
        if report.get(key):
            lines += ["", f"## {title}", "", "```", json.dumps(report[key], indent=1), "```"]
    return "\n".join(lines) + "\n"


# The results page's generated block (docs/results.md): ``--results PAGE`` replaces what lies between
# these two lines with the run's report and keeps the rest of the page, which is written by hand.
RESULTS_BEGIN = "<!-- sketchrec bench: begin -->"
RESULTS_END = "<!-- sketchrec bench: end -->"


def results_block(page_text: str, begin: str = RESULTS_BEGIN, end: str = RESULTS_END) -> tuple[int, int]:
    """Where the generated block's content starts and ends in ``page_text``; ValueError, saying
    what is wrong, unless the page holds the two markers once each and in order (another
    benchmark's block has markers of its own: ``begin``, ``end``)."""
    if page_text.count(begin) != 1 or page_text.count(end) != 1:
        raise ValueError(f"needs the lines {begin} and {end} once each "
                         "(the block the benchmark rewrites)")
    start, stop = page_text.index(begin) + len(begin), page_text.index(end)
    if stop < start:
        raise ValueError(f"{end} comes before {begin}")
    return start, stop


def write_results(page: Path, report_md: str, begin: str = RESULTS_BEGIN, end: str = RESULTS_END) -> None:
    """Put ``report_md`` (``bench.md``) between the markers of ``page``, one heading level down and
    without its title; the rest of the page is kept byte for byte. Written to a temporary file and
    renamed, so an interrupted run leaves the old page.

    >>> import tempfile
    >>> page = Path(tempfile.mkdtemp()) / "results.md"
    >>> _ = page.write_text(f"# Results\\n{RESULTS_BEGIN}\\nold\\n{RESULTS_END}\\nkept\\n")
    >>> write_results(page, "# sketchrec bench\\n\\n## Learners\\n\\n| a |\\n")
    >>> print(page.read_text())
    # Results
    <!-- sketchrec bench: begin -->
    ### Learners
    <BLANKLINE>
    | a |
    <!-- sketchrec bench: end -->
    kept
    <BLANKLINE>
    """
    text = page.read_text()
    start, stop = results_block(text, begin, end)
    lines = [("#" + line) if line.startswith("#") else line for line in report_md.strip().splitlines()]
    if lines and lines[0].startswith("## "):
        lines = lines[1:]          # the report's own title: the page has its heading
    block = "\n".join(lines).strip()
    tmp = page.with_name(page.name + ".tmp")
    tmp.write_text(text[:start] + "\n" + block + "\n" + text[stop:])
    tmp.replace(page)


def output_dir(out: Path | None) -> Path:
    """``out`` (created), or without one a new directory under the system's temp directory: a
    run never leaves files in the working directory unless asked to."""
    if out is None:
        return Path(tempfile.mkdtemp(prefix="sketchrec-bench-"))
    out.mkdir(parents=True, exist_ok=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="sketchrec bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes (well under a minute)")
    ap.add_argument("--json", action="store_true", help="last stdout line: one JSON object")
    ap.add_argument("--out", type=Path, help="directory for bench.json, bench.md and memory.png "
                    "(default: a new directory under the system's temp directory, printed at the "
                    "end, so a run never writes into the repository)")
    ap.add_argument("--data", type=Path, help=PATH_HELP)
    ap.add_argument("--no-kafka", action="store_true")
    ap.add_argument("--no-serving", action="store_true")
    ap.add_argument("--fleet", action="store_true", help="also the fleet benchmark (replay.bench.fleet: "
                    "1 vs 2 learners, delta bytes, produce -> replica lag; a few minutes)")
    ap.add_argument("--results", type=Path, metavar="PAGE", help="also write the report into PAGE "
                    f"between the lines {RESULTS_BEGIN} and {RESULTS_END} (docs/results.md), keeping "
                    "the rest of the page")
    args = ap.parse_args(argv)
    if args.results is not None:
        try:
            results_block(args.results.read_text())
        except (OSError, ValueError) as exc:   # before minutes of measuring, not after
            ap.error(f"--results {args.results}: {exc}")
    path = data_file(args.data)
    args.out = output_dir(args.out)
    q = args.quick
    t0 = time.perf_counter()
    report: dict = {"command": "sketchrec bench " + " ".join(argv if argv is not None else sys.argv[1:]),
                    "quick": q, "learners": {}}

    data, _ = read_ratings(path)
    data = order_ratings(data, "time")
    if q:
        data = data.take(slice(0, 20_000))
    # quick: 3 rounds of every learner (the figures' medians), not up to 25 while under a second
    rounds = {"runs": 3, "max_rounds": 3 if q else 25, "slow_limit": 3_000 if q else 100_000, "dim": DIM}
    report["learners"]["ml100k"] = learner_table(data, **rounds)
    synth = SyntheticStream(n_ratings=50_000 if q else 5_000_000, n_users=5_000 if q else 1_000_000,
                            n_items=2_000 if q else 20_000, seed=0).all()
    report["learners"]["synthetic"] = learner_table(synth, **rounds)
    del synth
    for name, table in report["learners"].items():
        print(f"learners on {name}:")
        print_table(table)

    report["memory"] = memory_scaling([1_000, 10_000] if q else [10_000, 100_000, 1_000_000], q)
    _plot(report["memory"], args.out)

    sketch_cells = 4 * 2 * int(np.ceil(2625 * DIM / 4))  # the ML-100k sketch at gamma = 1, both sketches
    report["physical_limit"] = physical_limit(max(sketch_cells, 1 << 16))
    report["sketch_fraction_of_bound"] = (report["learners"]["ml100k"]["sketch_batch"]["throughput_per_s"]
                                          / report["physical_limit"]["bound_ratings_per_s"])

    report["serving"] = None if args.no_serving else serving(path, 1.0 if q else 10.0, "httpx" if q else "auto", q)
    report["kafka"] = None
    if not args.no_kafka:
        try:
            report["kafka"] = kafka(path, 1, 10_000 if q else None)
        except (ImportError, FileNotFoundError) as exc:
            report["kafka"] = {"skipped": f"no broker available: {exc}"}
    if args.fleet:
        from sketchrec.benchmarks.fleet import main as fleet_main
        report["fleet"] = fleet_main([str(path), "--copies", "1" if q else "3"])

    ml = report["learners"]["ml100k"]
    report["ratio_sketch_over_river"] = ml["ratio_sketch_over_river"]
    report["ratio_sketch_over_vw"] = ml["ratio_sketch_over_vw"]
    report["ratio_monitor_overhead"] = ml["ratio_monitor_overhead"]
    report["seconds"] = time.perf_counter() - t0
    (args.out / "bench.json").write_text(json.dumps(report, indent=1))
    (args.out / "bench.md").write_text(_markdown(report))
    print(f"wrote {args.out}/bench.json, bench.md, memory.png in {report['seconds']:.0f} s")
    if args.results is not None:
        write_results(args.results, _markdown(report))
        print(f"wrote the benchmark block of {args.results}")
    if args.json:
        print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
