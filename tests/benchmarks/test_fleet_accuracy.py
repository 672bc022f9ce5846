"""A fleet learns about as well as one learner on the same stream (``benchmarks.fleet_accuracy``: in
one process, no broker, so the figures are deterministic), for the default learner and for DP-SGD
at the same epsilon; a fleet whose members never apply each other's deltas is far off, so the
measurement sees a broken sync. The bounds are the measured spread over seeds plus a margin
(docs/fleet.md, "How close to one learner")."""

import numpy as np
import pytest

from sketchrec.benchmarks import fleet_accuracy
from sketchrec.data import read_ratings
from sketchrec.stream.kafka.producer import order_for_topic
from sketchrec.synthetic import SyntheticStream


@pytest.fixture(scope="module")
def ml100k_in_time(ml100k):
    return order_for_topic(read_ratings(ml100k)[0])


def test_the_benchmarks_default_learner_is_the_commands():
    """The harness's "mix" learns as what `consume` builds without --model."""
    from sketchrec.cli.config import ModelSettings
    from sketchrec.cli.consume import build_parser
    args = build_parser().parse_args(["--bootstrap", "x", "--topic", "t", "--capacity", "600", "--seed", "3"])
    built = ModelSettings.from_args(args, False).build(args.capacity)
    ours = fleet_accuracy.model("mix", 600, 3)
    assert type(ours) is type(built)
    data = SyntheticStream(3000, n_users=400, n_items=200, seed=1).all()
    np.testing.assert_array_equal(ours.learn_many(data.users, data.items, data.ratings),
                                  built.learn_many(data.users, data.items, data.ratings))


def test_two_members_of_the_default_learner_are_within_one_percent_of_one_learner(ml100k_in_time):
    got = fleet_accuracy.fleet_vs_one(ml100k_in_time, "mix", 2, seed=0)
    assert 1.0 < got["ratio"] < 1.01, got


def test_members_that_never_apply_each_others_deltas_are_far_off(ml100k_in_time, monkeypatch):
    """The broken variant: each member learns only its own users (its deltas go nowhere): about
    twice as far from one learner as the fleet."""
    from sketchrec.stream.fleet.tracker import DeltaTracker
    one = fleet_accuracy.one_learner(ml100k_in_time, "mix", 0)
    monkeypatch.setattr(DeltaTracker, "apply", lambda self, blob: {})
    alone = fleet_accuracy.fleet(ml100k_in_time, "mix", 2, seed=0)
    assert alone / one > 1.014


def test_a_dp_fleet_is_close_to_one_dp_learner_at_the_same_epsilon():
    """Two DP-SGD members at epsilon 1 (each its own noise, seeded for the test) against one
    DP-SGD learner at epsilon 1, over three synthetic streams: the members take as many noisy
    steps per rating as one learner (whole batches at the default interval), so the noise that
    reaches the model is the same; what the fleet adds is learning from stale copies."""
    ratios = [fleet_accuracy.fleet_vs_one(SyntheticStream(30_000, n_users=2000, n_items=750, seed=s).all(),
                                          "dp", 2, seed=s)["ratio"] for s in range(3)]
    assert np.mean(ratios) < 1.04 and max(ratios) < 1.05, ratios
