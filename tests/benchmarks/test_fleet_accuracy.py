"""A fleet learns about as well as one learner on the same stream (``benchmarks.fleet_accuracy``: in
one process, no broker, so the figures are deterministic), for the default learner, for DP-SGD
at the same epsilon and on an LDP topic; a fleet whose members never apply each other's deltas is
far off, so the measurement sees a broken sync. The bounds are the measured spread over seeds plus a margin
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


def test_a_one_member_fleet_admits_ids_to_slots_as_a_plain_learner_does(monkeypatch):
    """One member (a tracker, no other member's delta to apply) against a plain learner, three
    seeded streams with most ids rated a few times: announced at its first sighting while its
    bucket has a free way (a plain learner's free slot), an id learns in its slot from its first
    rating, and the member is within 0.15 % of the plain learner on every seed. The broken
    variant announces after ``admit_after`` sightings only (no way ever counts as free, the
    rule before): every seed further off than 0.2 %."""
    from sketchrec.stream.fleet import slots
    streams = [SyntheticStream(20_000, n_users=6000, n_items=3000, seed=s).all() for s in range(3)]
    ones = [fleet_accuracy.one_learner(data, "mix", s) for s, data in enumerate(streams)]
    ours = [fleet_accuracy.fleet(data, "mix", 1, seed=s) / one
            for s, (data, one) in enumerate(zip(streams, ones))]
    announce_ids = slots.announce_ids

    def never_free(*args):   # args[8]: the heavy filter's slot families
        return announce_ids(*args[:8], np.zeros_like(args[8]), *args[9:])
    monkeypatch.setattr(slots, "announce_ids", never_free)
    counted = [fleet_accuracy.fleet(data, "mix", 1, seed=s) / one
               for s, (data, one) in enumerate(zip(streams, ones))]
    assert max(ours) < 1.0015 and min(counted) > 1.002, (ours, counted)


def test_a_dp_fleet_is_close_to_one_dp_learner_at_the_same_epsilon(monkeypatch):
    """Two DP-SGD members at epsilon 1 (each its own noise, seeded for the test) against one
    DP-SGD learner at epsilon 1, over three synthetic streams: the members take as many noisy
    steps per rating as one learner (whole batches at the default interval), so the noise that
    reaches the model is the same; what the fleet adds is learning from stale copies. The
    broken variant keys ids apart (each member's key derived from its own noise seed, as the
    harness did): every replica applies a member's deltas to other ids' cells, and the fleet is
    further off on average."""
    from sketchrec.models.base import FactorizationModel
    streams = [SyntheticStream(30_000, n_users=2000, n_items=750, seed=s).all() for s in range(3)]
    ones = [fleet_accuracy.one_learner(data, "dp", s) for s, data in enumerate(streams)]
    ratios = [fleet_accuracy.fleet(data, "dp", 2, seed=s) / one
              for s, (data, one) in enumerate(zip(streams, ones))]
    keys = FactorizationModel.id_keys
    monkeypatch.setattr(FactorizationModel, "id_keys", property(keys.fget, lambda self, adopted: None))
    apart = [fleet_accuracy.fleet(data, "dp", 2, seed=s) / one
             for s, (data, one) in enumerate(zip(streams, ones))]
    assert np.mean(ratios) < 1.01 and max(ratios) < 1.02 and np.mean(apart) > 1.015, (ratios, apart)


def test_an_ldp_fleet_is_close_to_one_learner_of_the_same_perturbed_stream(monkeypatch):
    """Two members of the default learner on an LDP topic (the devices' noise seeded for the
    test) against one learner of the same perturbed ratings, over two synthetic streams; the
    broken variant never applies the other member's deltas and is further off."""
    from sketchrec.stream.fleet.tracker import DeltaTracker
    streams = [SyntheticStream(30_000, n_users=2000, n_items=750, seed=s).all() for s in range(2)]
    ones = [fleet_accuracy.one_learner(data, "ldp", s) for s, data in enumerate(streams)]
    assert ones[0] > 1.05 * fleet_accuracy.one_learner(streams[0], "mix", 0)   # learned perturbed
    ratios = [fleet_accuracy.fleet(data, "ldp", 2, seed=s) / one
              for s, (data, one) in enumerate(zip(streams, ones))]
    monkeypatch.setattr(DeltaTracker, "apply", lambda self, blob: {})
    alone = [fleet_accuracy.fleet(data, "ldp", 2, seed=s) / one
             for s, (data, one) in enumerate(zip(streams, ones))]
    assert max(ratios) < 1.012 and np.mean(alone) > np.mean(ratios) + 0.004, (ratios, alone)


@pytest.mark.parametrize("every", [666, 2000])
def test_four_members_composed_stay_close_to_one_learner_at_a_fixed_interval(every):
    """Four unpaced members of the bias baseline on the Zipf-skewed stream: each member scales its
    count-weighted moves so that the four add up to one learner's (stream.fleet.compose), and the
    fleet stays within a few percent of one learner where the plain sum (the broken variant)
    overshoots by far."""
    data = SyntheticStream(30_000, n_users=2000, n_items=750, seed=0).all()
    one = fleet_accuracy.one_learner(data, "bias", 0)
    composed = fleet_accuracy.fleet(data, "bias", 4, every, seed=0, paced=False) / one
    plain = fleet_accuracy.fleet(data, "bias", 4, every, seed=0, paced=False, composed=False) / one
    assert composed < 1.03 and plain > 1.2, (composed, plain)


def test_four_members_of_the_sketch_compose_their_item_biases():
    """Four unpaced members of the sketch alone on a skewed stream at a long interval: each scales
    its own item-bias moves so that the four add up to one learner's (stream.fleet.compose_biases),
    and the fleet stays within about a percent of one learner; the broken variant, the plain sum of
    the members' moves, runs away from it."""
    data = SyntheticStream(60_000, n_users=4000, n_items=1500, seed=0).all()
    one = fleet_accuracy.one_learner(data, "sketch", 0)
    composed = fleet_accuracy.fleet(data, "sketch", 4, 2000, seed=0, paced=False) / one
    summed = fleet_accuracy.fleet(data, "sketch", 4, 2000, seed=0, paced=False, composed=False) / one
    assert composed < 1.015 and summed > 1.3, (composed, summed)


def test_four_members_of_the_sketch_at_a_given_interval_are_paced_too():
    """`--sync-ratings N` at four members of the sketch on a stream of a few items (the hottest a
    fifth of the ratings): the vectors' steps are not composed, and unpaced (the broken variant: a
    given interval used to switch pacing off) the members' summed steps of the hottest items run
    away from one learner even with the biases composed; paced like a default interval, the fleet
    stays within a few percent of it."""
    data = SyntheticStream(60_000, n_users=4000, n_items=20, seed=0).all()
    one = fleet_accuracy.one_learner(data, "sketch", 0)
    paced = fleet_accuracy.fleet(data, "sketch", 4, 2000, seed=0) / one
    unpaced = fleet_accuracy.fleet(data, "sketch", 4, 2000, seed=0, paced=False) / one
    assert paced < 1.02 and unpaced > 1.08, (paced, unpaced)


def test_four_members_paced_by_their_hot_items_stay_closer_to_one_learner():
    """Four members of the default learner on a strongly skewed stream (Zipf 1.4), at the default
    interval: the factor member's SGD and AdaGrad steps are not composed, so between two syncs
    each member moves the hottest items' vectors as if alone, and the replicas add the four moves.
    Paced (a member syncs before its hottest item takes more than its share of steps:
    stream.fleet.pace), the fleet stays close to one learner; the broken variant, unpaced with
    its moves composed, is off by about twice as much (on every seed measured, with three to
    eight members, it stayed off without diverging: docs/fleet.md)."""
    data = SyntheticStream(60_000, n_users=4000, n_items=1500, skew=1.4, seed=1).all()
    one = fleet_accuracy.one_learner(data, "mix", 1)
    paced = fleet_accuracy.fleet(data, "mix", 4, seed=1) / one
    unpaced = fleet_accuracy.fleet(data, "mix", 4, seed=1, paced=False, composed=True) / one
    assert paced < 1.016 and unpaced > 1.022, (paced, unpaced)


def test_bench_fleet_accuracy_runs_in_process_and_prints_its_report(monkeypatch, capsys, ml100k):
    """`sketchrec bench fleet --accuracy` starts no broker: it hands the fleet sizes (more than
    one member) and the interval to the harness and prints its report as the last line."""
    import json
    from sketchrec.benchmarks import fleet
    asked = {}

    def accuracy(path, members, every, say):
        asked.update(path=path, members=members, every=every)
        return {"mix": {"2": {"all": {"mean": 1.0}}}}
    monkeypatch.setattr(fleet_accuracy, "accuracy", accuracy)
    monkeypatch.setattr(fleet, "_tansu", lambda: pytest.fail("a broker was started"))
    fleet.main(["--accuracy", "--members", "1,2,4", "--sync-ratings", "700", "--json", str(ml100k)])
    assert asked == {"path": ml100k, "members": [2, 4], "every": 700}
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == {
        "accuracy": {"mix": {"2": {"all": {"mean": 1.0}}}}}
