"""A fleet of the default learner (no --model: mix) on a real broker: two members over a
4-partition topic, one killed with SIGKILL mid-stream and restarted, and a read-only serving
replica. Every replica ends with every rating learned once and the same predictions."""

import signal
import sys
import threading
import uuid

import numpy as np
import pytest

from sketchrec.data import SyntheticStream
from sketchrec.models.capabilities import DEFAULT_KIND
from conftest import agreeing_predictions
from test_fleet import Fleet, end_offsets, learned, send, single_learner_rmse, stats

N = 60_000
OPTIONS = ["--capacity", "6000", "--seed", "3"]   # no --model: the default learner


def member_cmd(bootstrap, topic, port):
    return [sys.executable, "-m", "sketchrec", "consume", "--bootstrap", bootstrap, "--topic", topic,
            "--group", f"g-{topic}", "--fleet", "--sync-ms", "100", "--snapshot-seconds", "3",
            "--expected-ratings", str(2 * N), *OPTIONS, "--serve", f"127.0.0.1:{port}"]


def settled(ports) -> bool:
    """Every replica learned N and covers the same offsets (a replica's figures can lag the
    delta that brought its last ratings by a poll)."""
    figures = [stats(p) or {} for p in ports]
    return (all(f.get("ratings_learned") == N for f in figures)
            and all(f.get("offsets") == figures[0].get("offsets") for f in figures))


def default_model():
    from sketchrec.cli.config import ModelSettings
    from sketchrec.cli.consume import build_parser
    args = build_parser().parse_args(["--bootstrap", "x", "--topic", "t", *OPTIONS])
    settings = ModelSettings.from_args(args, False)
    assert settings.kind == DEFAULT_KIND
    return settings.build(args.capacity)


@pytest.fixture(scope="module", autouse=True)
def compiled_kernels():
    """The default learner's and its replica's kernels compiled (and cached on disk) before any
    member starts, as test_fleet's fixture does for the sketch."""
    from sketchrec.stream.fleet.tracker import DeltaTracker
    from sketchrec.stream.recommender import Recommender
    data = SyntheticStream(n_ratings=3000, n_users=400, n_items=150, seed=1).all()
    recs = [Recommender(default_model(), pair_capacity=N) for _ in range(2)]
    trackers = [DeltaTracker(rec) for rec in recs]
    recs[0].learn_many(data.users, data.items, data.ratings)
    trackers[1].apply(trackers[0].take())
    trackers[1].settle()


def test_default_learner_fleet_kill_9_learns_every_rating_once(kafka_bootstrap, tmp_path):
    topic = f"fleet-mix-{uuid.uuid4().hex[:8]}"
    data = SyntheticStream(n_ratings=N, n_users=4000, n_items=1500, seed=5).all()
    fleet = Fleet(kafka_bootstrap, topic, tmp_path)
    fleet.open(data, partitions=4)
    mark = fleet.mark
    try:
        members, [replica] = fleet.launch(member_cmd, members=2)
        sender = threading.Thread(target=send, args=(kafka_bootstrap, topic, data.take(slice(1000, N)), 8.0))
        sender.start()
        fleet.wait(lambda: learned(replica) >= N // 3, f"{N // 3:,} ratings")
        victim = members[1]   # pinned: which member dies, at a third of the stream
        fleet.procs[victim].send_signal(signal.SIGKILL)
        fleet.procs[victim].wait()
        mark("kill")
        members[1] = fleet.start(member_cmd)
        sender.join(timeout=120)
        live = members + [replica]
        fleet.wait(lambda: settled(live), f"{N:,} ratings and the same offsets everywhere", 180)
        mark("all learned")
        figures = [stats(p) for p in live]
        assert {f["ratings_learned"] for f in figures} == {N}
        assert all(f["offsets"] == figures[0]["offsets"] for f in figures), [f["offsets"] for f in figures]
        ends = end_offsets(kafka_bootstrap, topic)
        assert all(figures[0]["offsets"][p] >= end for p, end in ends.items())
        rng = np.random.default_rng(5)
        pairs = list(zip(rng.choice(data.users, 300).tolist(), rng.choice(data.items, 300).tolist()))
        answers = dict(zip(live, agreeing_predictions(live, pairs)))
        for port, values in answers.items():
            assert np.max(np.abs(values - answers[replica])) < 1e-4, port
        fleet_rmse, single = figures[-1]["prequential_rmse"], single_learner_rmse(data, default_model())
        mark(f"fleet RMSE {fleet_rmse:.5f}, one learner {single:.5f} "
             f"({100 * (fleet_rmse / single - 1):+.2f}%)")
        # the bound is the in-process spread over seeds and sync intervals on streams of this
        # shape plus a margin for the members' timing (docs/fleet.md, "How close to one
        # learner"; tests/benchmarks/test_fleet_accuracy.py holds the deterministic comparison):
        # a merge that double-counts or drops a member's state moves it by far more
        assert fleet_rmse < 1.02 * single
    finally:
        fleet.stop()
