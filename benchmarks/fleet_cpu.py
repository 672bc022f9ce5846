"""The fleet benchmark's CPU accounting (``sketchrec bench fleet``): a member process's
CPU-seconds sampled from /proc and taken over its learning span, a plain learner's taken over its
learning span the same way (``plain_learner``), the kernels compiled before either is measured
(``warm_kernels``), and where a fleet's CPU goes in one process without a broker
(``sync_breakdown``)."""

from __future__ import annotations

import os
import threading
import time

import numpy as np

from sketchrec.data import Ratings
from sketchrec.stream.kafka.consumer import KafkaLearner, resume_or_create


def cpu_seconds(pid: int, thread: int | None = None) -> float | None:
    """CPU-seconds (user + system, every thread) process ``pid`` has used so far (/proc), or None
    once it is gone; with ``thread``, that thread's alone (its main thread: ``thread=pid``)."""
    try:
        with open(f"/proc/{pid}/stat" if thread is None else f"/proc/{pid}/task/{thread}/stat", "rb") as f:
            fields = f.read().rpartition(b")")[2].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")   # utime, stime


def _sample_cpu(procs: list, samples: list, done: threading.Event, every: float = 0.05) -> None:
    """(wall clock, CPU-seconds, its main thread's CPU-seconds) of each running member every
    ``every`` s, until ``done``."""
    while not done.is_set():
        for proc, series in zip(procs, samples):
            if proc.poll() is None:
                used, main = cpu_seconds(proc.pid), cpu_seconds(proc.pid, proc.pid)
                if used is not None and main is not None:
                    series.append((time.time(), used, main))
        done.wait(every)


def cpu_between(series: list[tuple[float, ...]], start: float | None, end: float | None,
                column: int = 1) -> float:
    """CPU-seconds a member spent from ``start`` to ``end`` (wall clock, its first and last
    learned batch), interpolated in its samples (``column`` 2: its main thread's): its learning
    and syncing, not its start-up (imports, kernels loaded, the model topic read) nor its idle
    wait before exiting."""
    if not series or start is None or end is None:
        return 0.0
    samples = np.array(series, dtype=float)
    times, used = samples[:, 0], samples[:, column]
    return float(np.interp(end, times, used) - np.interp(start, times, used))


class _SpanLearner(KafkaLearner):
    """A plain learner that notes this process's CPU-seconds (every thread, as /proc counts a
    member's) and the wall clock at the start of its first learned poll and at the end of each,
    the span a member's CPU is taken over (``cpu_between``)."""

    first: tuple[float, float] | None = None
    last: tuple[float, float] | None = None

    def learn_poll(self, records: dict) -> None:
        if self.first is None:
            self.first = (time.process_time(), time.time())
        super().learn_poll(records)
        self.last = (time.process_time(), time.time())


def plain_learner(bootstrap: str, topic: str, capacity: int, n_ratings: int) -> dict:
    """One plain learner (``consume --checkpoint``: a ``SketchMF`` for ``capacity`` ids, as a
    member's ``--model sketch``) over ``topic`` in this process: its ratings/s and CPU-seconds per
    rating from its first to its last learned poll (start-up and the idle wait at the end left
    out, as for a member)."""
    import tempfile

    from sketchrec.models import SketchMF
    from sketchrec.models.registry import MODELS
    with tempfile.TemporaryDirectory() as ckpt:
        service = resume_or_create(ckpt, lambda: SketchMF(capacity=capacity), model_classes=MODELS,
                                   pair_capacity=2 * n_ratings)
        learner = _SpanLearner(service, bootstrap, topic, checkpoint_every=50_000)
        learner.run(idle_exit=1.0)
        assert service.ratings_learned == n_ratings, service.ratings_learned
    (cpu0, t0), (cpu1, t1) = learner.first, learner.last
    return {"ratings_per_s": n_ratings / max(t1 - t0, 1e-9), "cpu_s_per_rating": (cpu1 - cpu0) / n_ratings}


def warm_kernels() -> None:
    """Compile (or load) every kernel a plain learner and a fleet member run, here, before
    anything is measured: numba's cache is keyed by the state of the sources
    (``sketchrec._kernel_cache``), so after any edit of a kernel module the first process
    compiles them all (minutes of CPU on a loaded machine). Without this the plain learner's
    compile would count in its CPU, and every member's in its learning span (started together,
    each compiles its own)."""
    from sketchrec.data import SyntheticStream
    from sketchrec.stream.kafka.messages import parse_fast
    parse_fast([b"1,2,4.5,99", b"7,8,5\n9,10,0.5,"], (1.0, 5.0))   # the input's compiled reader
    # a few hundred ids seen often: heavy slots are announced, admitted and evicted
    sync_breakdown(SyntheticStream(20_000, n_users=300, n_items=200, seed=0).all(), 2, 2_000, dim=8)


def sync_breakdown(data: Ratings, m: int, every: int, dim: int = 64) -> dict:
    """Where a fleet's CPU goes, in one process without a broker: ``m`` replicas of one
    recommender (``DeltaTracker``) learn the ratings of their users (user id mod ``m``, as a topic
    keyed by user partitions them) ``every`` ratings at a time, take a delta and apply the others'
    (decoding included), against one plain learner over the same ratings in chunks of
    ``every``: CPU-microseconds per rating of each step, summed over the replicas, their ratio to
    the plain learner's, and the fleet's prequential RMSE over the plain learner's
    (``rmse_ratio``: what syncing less often costs in accuracy). Fetching, JSON parsing and Kafka
    are left out (the same for a plain learner and a member, per rating). ``sides``: what the
    deltas carry on the user side and on the item side (``DeltaSides``): which state a design
    that kept one side at its owner would no longer exchange."""
    from sketchrec.models import SketchMF
    from sketchrec.stream.fleet.pace import full_refresh_ratings
    from sketchrec.stream.fleet.tracker import DeltaTracker
    from sketchrec.stream.recommender import Recommender

    def recommender():
        return Recommender(SketchMF(capacity=data.n_ids(), dim=dim), pair_capacity=4 * len(data))

    def learn(rec, idx) -> float:   # squared prequential errors
        predictions = rec.learn_many(data.users[idx], data.items[idx], data.ratings[idx])
        return float(np.sum((np.asarray(predictions) - data.ratings[idx]) ** 2))

    recommender().learn_many([1], [1], [3.0])   # kernels compiled outside the timings
    plain, t0, plain_se = recommender(), time.process_time(), 0.0
    for start in range(0, len(data), every):
        plain_se += learn(plain, slice(start, start + every))
    plain_s = time.process_time() - t0
    recs = [recommender() for _ in range(m)]
    trackers = [DeltaTracker(rec) for rec in recs]
    for tracker in trackers:   # as a member's pace sets them
        tracker.fleet_size(m)
        tracker.refresh_every(full_refresh_ratings(every, m))
    parts = [np.flatnonzero(data.users % m == k) for k in range(m)]
    spent, sent, fleet_se = {"learn": 0.0, "take": 0.0, "apply": 0.0}, 0, 0.0
    sides = DeltaSides()
    for start in range(0, max(map(len, parts)), every):
        blobs = []
        for rec, tracker, part in zip(recs, trackers, parts):
            t0 = time.process_time()
            fleet_se += learn(rec, part[start:start + every])
            t1 = time.process_time()
            blobs.append(tracker.take())
            spent["learn"] += t1 - t0
            spent["take"] += time.process_time() - t1
            sent += len(blobs[-1] or b"")
            sides.add(blobs[-1])   # (decoded outside the timings)
        t0 = time.process_time()
        for k, tracker in enumerate(trackers):
            for j, blob in enumerate(blobs):
                if j != k and blob:
                    tracker.apply(blob)
        spent["apply"] += time.process_time() - t0
    n = len(data)
    out = {f"{step}_cpu_us_per_rating": s / n * 1e6 for step, s in spent.items()}
    return {"members": m, "every": every, "plain_cpu_us_per_rating": plain_s / n * 1e6, **out,
            "cpu_per_rating_ratio": sum(spent.values()) / plain_s, "delta_bytes_per_rating": sent / n,
            "rmse_ratio": float(np.sqrt(fleet_se / plain_se)) if plain_se else 1.0,
            "sides": sides.per(n)}


class DeltaSides:
    """What deltas carry on each side: the distinct users and items each delta's ratings learned
    (each is a row of cells or a held slot every other replica adds), and the held slots' rows
    (a held id's residual, d + 1 floats) per rating. Only one side's state is exchanged when the
    other's rows change at one member only (users owned by the member whose partitions hold
    them, docs/scaling.md): this says how much of a delta that would leave.

    >>> from sketchrec.models import SketchMF
    >>> from sketchrec.stream.fleet.tracker import DeltaTracker
    >>> from sketchrec.stream.recommender import Recommender
    >>> rec = Recommender(SketchMF(dim=4, width=512), pair_capacity=100)
    >>> tracker, sides = DeltaTracker(rec), DeltaSides()
    >>> _ = rec.learn_many(["ann", "ann", "ann"], ["up", "down", "left"], [4.0, 2.0, 3.0])
    >>> sides.add(tracker.take())
    >>> sides.per(3)["ids_per_delta"]
    {'user': 1.0, 'item': 3.0}
    """

    def __init__(self):
        self.deltas, self.ids, self.rows = 0, {"user": 0, "item": 0}, {"user": 0, "item": 0}

    def add(self, blob: bytes | None) -> None:
        from sketchrec.models.base import ITEM, USER
        from sketchrec.stream.fleet.envelope import decode
        if not blob:
            return
        _, arrays = decode(blob)
        self.deltas += 1
        for side, family, seen in (("user", USER, "seen_users"), ("item", ITEM, "seen_items")):
            self.ids[side] += len(arrays.get(seen, ()))
            self.rows[side] += int(np.sum(arrays.get("slot_families", np.empty(0)) == family))

    def per(self, ratings: int) -> dict:
        """``ids_per_delta`` and ``held_rows_per_rating``, per side."""
        return {"ids_per_delta": {s: n / max(self.deltas, 1) for s, n in self.ids.items()},
                "held_rows_per_rating": {s: n / max(ratings, 1) for s, n in self.rows.items()}}
