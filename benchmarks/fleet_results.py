"""The fleet benchmark's blocks of the results page: ``sketchrec bench fleet --results PAGE`` writes
its CPU-seconds per learned rating (and the rate they project for M members on M cores) between
one pair of markers, ``sketchrec bench fleet --accuracy --results PAGE`` its accuracy against one
learner between another, each replaced whole by its own command and the rest of the page kept
(``suite.write_results``, as ``sketchrec bench`` and ``sketchrec bench big-file`` do).

The projection: a plain learner spending ``c`` CPU-seconds per rating learns ``1 / c`` ratings per
second on one core; a fleet of M members spending ``C`` CPU-seconds per rating in all (summed over
the members) learns ``M / C`` on M cores, given a core each and a broker that keeps up: ``M /
ratio`` times the plain learner, where ``ratio = C / c`` is the bench's ``cpu_per_rating_ratio``.

>>> round(projected_rate(2, 4.0), 1), round(projected_rate(2, 4.0) * 2.0e-6, 2)   # 4 CPU-µs, plain 2
(500000.0, 1.0)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

CPU_BEGIN = "<!-- sketchrec bench fleet: begin -->"
CPU_END = "<!-- sketchrec bench fleet: end -->"
ACCURACY_BEGIN = "<!-- sketchrec bench fleet --accuracy: begin -->"
ACCURACY_END = "<!-- sketchrec bench fleet --accuracy: end -->"
FORMS = {"csv_per_message": "1 CSV rating per message"}   # batched_N: "N ratings per message"


def _sides(sides: dict | None) -> str:
    """The breakdown's user and item columns (``fleet_cpu.DeltaSides``; blank in an older report)."""
    if not sides:
        return " | |"
    ids, rows = sides["ids_per_delta"], sides["held_rows_per_rating"]
    return f"{ids['user']:,.0f} / {ids['item']:,.0f} | {rows['user']:.3f} / {rows['item']:.3f} |"


def add_argument(ap: argparse.ArgumentParser) -> None:
    """``--results PAGE`` on the fleet bench's parser."""
    ap.add_argument("--results", type=Path, metavar="PAGE",
                    help="also write the figures into PAGE between their markers (docs/results.md): "
                         f"{CPU_BEGIN} ... {CPU_END}, with --accuracy {ACCURACY_BEGIN} ... {ACCURACY_END}; "
                         "the rest of the page is kept")


def _markers(accuracy: bool) -> dict:
    return ({"begin": ACCURACY_BEGIN, "end": ACCURACY_END} if accuracy
            else {"begin": CPU_BEGIN, "end": CPU_END})


def check(args: argparse.Namespace) -> None:
    """Refuse a ``--results`` page without its block's markers in one line, before minutes of
    measuring rather than after."""
    from sketchrec.benchmarks.suite import results_block
    if args.results is None:
        return
    try:
        results_block(args.results.read_text(), **_markers(args.accuracy))
    except (OSError, ValueError) as exc:
        raise SystemExit(f"fleet bench: --results {args.results}: {exc}") from None


def write(args: argparse.Namespace, report: dict, argv: list[str] | None) -> None:
    """Write ``report``'s block into ``args.results`` (nothing without ``--results``)."""
    from sketchrec.benchmarks.suite import write_results
    if args.results is None:
        return
    command = " ".join(["sketchrec bench fleet", *(argv if argv is not None else sys.argv[1:])])
    text = accuracy_markdown(report, command) if args.accuracy else cpu_markdown(report, command)
    write_results(args.results, "# fleet\n\n" + text, **_markers(args.accuracy))
    print(f"wrote the fleet block of {args.results}", file=sys.stderr)


def projected_rate(members: int, cpu_us_per_rating: float) -> float:
    """Ratings per second of ``members`` processes on as many cores that spend
    ``cpu_us_per_rating`` CPU-µs per learned rating in all (summed over them)."""
    return members / (cpu_us_per_rating * 1e-6)


def _form_name(key: str) -> str:
    return FORMS.get(key) or f"{key.split('_', 1)[1]} ratings per message"


def _load() -> str:
    try:
        return "load average {:.1f} / {:.1f} / {:.1f} (1, 5, 15 min) at the end".format(*os.getloadavg())
    except OSError:
        return "load average unknown"


def cpu_markdown(report: dict, command: str, load: str | None = None) -> str:
    """The CPU block: per message form and fleet size, both sides' CPU-µs per learned rating, their
    ratio, the delta bytes, and the rate that projects for M members on M cores."""
    forms = [k for k, v in report.items() if isinstance(v, dict) and "members" in v]
    interval = (f"every {report['sync_ratings']:,} ratings" if report.get("sync_ratings")
                else "at their default interval")
    lines = [f"Command: `{command}` ({report['ratings']:,} ratings through a local broker, 4 partitions; "
             f"members are separate `consume --fleet` processes syncing {interval}; {load or _load()}).", "",
             "| message form | M | plain learner CPU-µs/rating | fleet CPU-µs/rating (all members) | ratio "
             "| members' CPU outside their main thread | delta bytes/rating | ratings per delta "
             "| projected on M cores (ratings/s) | × one plain learner |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for form in forms:
        r = report[form]
        plain = r["plain_cpu_us_per_rating"]
        for m, f in r["members"].items():
            rate = projected_rate(int(m), f["cpu_us_per_rating"])
            other = f"{100 * f['other_threads_share']:.0f} %" if "other_threads_share" in f else ""
            lines.append(f"| {_form_name(form)} | {m} | {plain:.2f} | {f['cpu_us_per_rating']:.2f} | "
                         f"{f['cpu_per_rating_ratio']:.2f}× | {other} | {f['delta_bytes_per_rating']:.0f} | "
                         f"{f['ratings_per_delta']:,.0f} | {rate:,.0f} | {rate * plain * 1e-6:.2f}× |")
    for form in forms:   # wall-clock rates: the machine's load's, beside the CPU figures that carry over
        r = report[form]
        fleets = ", ".join(f"{m} members {f['ratings_per_s']:,.0f}/s" for m, f in r["members"].items())
        lines += ["", f"Rates here, {_form_name(form)} (wall clock, at this load): a bare consumer "
                  f"{r['bare_consume_ratings_per_s']:,.0f}/s (with the compiled record reader "
                  f"{r['bare_compiled_reader_ratings_per_s']:,.0f}/s), the plain learner "
                  f"{r['plain_learner_ratings_per_s']:,.0f}/s, {fleets} while all learned."]
    if "cpu_per_rating_ratio" in report:
        lines += ["", "The report's last line holds `\"cpu_per_rating_ratio\": "
                  f"{json.dumps({k: round(v, 2) for k, v in report['cpu_per_rating_ratio'].items()})}` and "
                  f"`\"delta_bytes_per_rating\": "
                  f"{json.dumps({k: round(v, 1) for k, v in report['delta_bytes_per_rating'].items()})}` "
                  "(the larger of the message forms run)."]
    if report.get("in_process"):
        lines += ["", "In one process, no broker (`--breakdown`), CPU-µs per rating summed over the replicas:", "",
                  "| M | ratings per take | plain | learn | take | apply | ratio | delta bytes/rating "
                  "| RMSE over one learner's | users / items per delta | held rows per rating, users / items |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for m, b in report["in_process"].items():
            lines.append(f"| {m} | {b['every']:,} | {b['plain_cpu_us_per_rating']:.2f} | "
                         f"{b['learn_cpu_us_per_rating']:.2f} | {b['take_cpu_us_per_rating']:.2f} | "
                         f"{b['apply_cpu_us_per_rating']:.2f} | {b['cpu_per_rating_ratio']:.2f}× | "
                         f"{b['delta_bytes_per_rating']:.0f} | {b['rmse_ratio']:.4f}× | "
                         + _sides(b.get("sides")))
    if "lag_s" in report:
        lag = report["lag_s"]
        lines += ["", f"Produce → serving replica `/predict` lag over {lag['probes']} probes: p50 "
                  f"{lag['p50'] * 1000:.0f} ms, p99 {lag['p99'] * 1000:.0f} ms, max {lag['max'] * 1000:.0f} ms "
                  f"({lag['missed']} missed)."]
    if "snapshot" in report:
        s = report["snapshot"]
        lines += ["", f"A snapshot of {s['state_bytes'] / 1e6:.0f} MB of state ({s['compressed_bytes'] / 1e6:.0f} MB "
                  f"compressed): written in {s['write_s']:.1f} s, restored in {s['restore_s']:.1f} s "
                  f"({s['restore_mb_per_s']:.0f} MB/s)."]
    if report.get("sources_changed"):
        lines += ["", "**The kernel sources changed while it ran: the members' figures may include "
                  "compiling. Run it again.**"]
    return "\n".join(lines) + "\n"


def accuracy_markdown(report: dict, command: str) -> str:
    """The accuracy block: a fleet's prequential RMSE over one learner's, per learner, fleet size and
    stream, as mean [min, max] over the seeds, and over every stream and seed."""
    kinds = report["accuracy"]
    streams = list(dict.fromkeys(s for sizes in kinds.values() for by in sizes.values() for s in by if s != "all"))
    names = {"mix": "default (`mix`)", "dp": "DP-SGD, ε = 1", "ldp": "default on an LDP topic, ε = 4 per rating",
             "sketch": "the sketch alone (`--model sketch`)"}
    lines = [f"Command: `{command}` (in one process, no broker; deterministic).", "",
             "| learner | M | " + " | ".join(streams) + " | all |", "|---" * (len(streams) + 3) + "|"]

    def pct(x: float) -> str:
        return f"{100 * (x - 1):+.2f} %"
    for kind, sizes in kinds.items():
        for m, by in sizes.items():
            cells = [f"{pct(by[s]['mean'])} [{pct(by[s]['min'])[:-2]}, {pct(by[s]['max'])[:-2]}]"
                     if s in by else "" for s in streams]
            total = by["all"]
            lines.append(f"| {names.get(kind, kind)} | {m} | " + " | ".join(cells)
                         + f" | {pct(total['mean'])} (sd {100 * total['sd']:.2f}) |")
    return "\n".join(lines) + "\n"
