"""Composed merges (stream.fleet.compose): a member scales its own count-weighted changes at a take
and keeps what it publishes, so every replica still holds its base plus the deltas published; the
scale itself is f(M k) / (M f(k))."""

import numpy as np

from sketchrec.data import SyntheticStream
from sketchrec.models.mix import Experts
from sketchrec.stream.fleet import array_replica
from sketchrec.stream.fleet.compose import share
from sketchrec.stream.fleet.pace import BUDGET
from sketchrec.stream.fleet.tracker import DeltaTracker
from sketchrec.stream.recommender import Recommender

MEMBERS, CHUNK = 3, 1500
DATA = SyntheticStream(18_000, n_users=600, n_items=120, seed=2).all()


def _fleet(members: int = MEMBERS, composed: bool = True):
    """``members`` default-learner members (users split by id, composed at ``members``) and a
    reader that only applies; every round each member learns ``CHUNK`` of its ratings and takes,
    and the others apply its delta in a shuffled order (``composed``: or the plain sum). The
    recommenders, members first."""
    recs = [Recommender(Experts(capacity=800, seed=1), pair_capacity=50_000) for _ in range(members + 1)]
    trackers = [DeltaTracker(rec, member=f"m{k}") for k, rec in enumerate(recs)]
    for tracker in trackers[:members]:
        tracker.fleet_size(members if composed else 1)
    parts = [np.flatnonzero(DATA.users % members == k) for k in range(members)]
    rng = np.random.default_rng(0)
    for start in range(0, max(map(len, parts)), CHUNK):
        blobs = []
        for k in range(members):
            rows = parts[k][start:start + CHUNK]
            recs[k].learn_many(DATA.users[rows], DATA.items[rows], DATA.ratings[rows])
            blobs.append((k, trackers[k].take()))
        for k, tracker in enumerate(trackers):
            for n in rng.permutation(len(blobs)):
                if blobs[n][0] != k and blobs[n][1] is not None:
                    tracker.apply(blobs[n][1])
    for tracker in trackers:
        tracker.settle()
    return recs


def _biases(rec) -> np.ndarray:
    return rec.model.members_[0].biases.cells


def _gap(recs) -> float:
    """The largest difference of a member's bias cells from the reader's (the reference merge:
    what the deltas published add up to)."""
    return max(float(np.abs(_biases(r) - _biases(recs[-1])).max()) for r in recs[:-1])


def test_share_is_one_learners_move_over_the_members_sum():
    a, k = np.full(3, 1 / 31), np.array([1.0, 5.0, 40.0])
    one = 1 - (1 - a) ** (4 * k)              # one learner, 4 k steps
    each = 1 - (1 - a) ** k                   # one member's k steps
    np.testing.assert_allclose(4 * each * share(k, a, 4), one, rtol=1e-12)
    assert share(np.zeros(1), a[:1], 4)[0] == 1.0 and np.all(share(k, a, 1) == 1.0)


def test_every_replica_holds_the_deltas_published():
    """Members and the reader end with the same state (up to the order of float additions):
    what a member keeps of its own learning is what it published."""
    recs = _fleet()
    assert [r.model.n_learned for r in recs] == [len(DATA)] * (MEMBERS + 1)
    assert _gap(recs) < 1e-5
    q = np.random.default_rng(3).integers(0, 600, 500), np.random.default_rng(4).integers(0, 120, 500)
    predictions = np.array([r.model.predict_many(*q) for r in recs])
    np.testing.assert_allclose(predictions, np.broadcast_to(predictions[-1], predictions.shape), atol=1e-5)


def test_the_scaled_state_is_the_published_state(monkeypatch):
    """Composition moves the fleet's state (the reader's biases differ from a plain sum's), and
    the broken variant that scales only the delta it sends, keeping its own unscaled learning,
    leaves each member's biases away from what every other replica holds."""
    assert np.abs(_biases(_fleet()[-1]) - _biases(_fleet(composed=False)[-1])).max() > 1e-2
    take = array_replica.ArrayReplica.take

    def unscaled_at_home(self):   # the sender's own arrays keep what it learned
        kept = {name: self.arrays[name].copy() for name in self.composer.weighted}
        out = take(self)
        for name, array in kept.items():
            self.arrays[name][...] = array
            self.base[name][...] = array
        return out
    monkeypatch.setattr(array_replica.ArrayReplica, "take", unscaled_at_home)
    assert _gap(_fleet()) > 1e-2


def test_one_member_is_not_scaled():
    """Alone (a member holding every partition) a member's take is the plain learner's change."""
    rec = Recommender(Experts(capacity=800, seed=1), pair_capacity=50_000)
    tracker = DeltaTracker(rec, member="m0")
    tracker.fleet_size(1)
    before = _biases(rec).copy()
    rec.learn_many(DATA.users[:3000], DATA.items[:3000], DATA.ratings[:3000])
    learned = _biases(rec).copy()
    tracker.take()
    assert np.array_equal(_biases(rec), learned) and not np.array_equal(learned, before)


def test_a_member_composes_at_its_share_of_the_partitions():
    """A member's pace tells its tracker 1 / its share of the topic's partitions (2 of 6: 3, 2 of
    5: 2.5, not rounded up as the interval's fleet size is), and 1 when it holds them all (the
    only learner: nothing is scaled)."""
    from types import SimpleNamespace

    from sketchrec.stream.fleet.member import FleetLearner

    def told(held: set, partitions: int = 6, dp: dict | None = None) -> float:
        sizes = []
        member = SimpleNamespace(
            consumer=SimpleNamespace(partitions_for_topic=lambda topic: set(range(partitions)),
                                     assignment=lambda: [SimpleNamespace(partition=p) for p in held]),
            topic="t", sync_ratings=500, by_size=True, dp_batch=dp and dp["batch"], budget=BUDGET,
            hot=SimpleNamespace(bound=lambda every, members: every), book=SimpleNamespace(),
            tracker=SimpleNamespace(refresh_every=lambda ratings: None, fleet_size=sizes.append))
        FleetLearner._pace(member)
        return sizes[-1]
    assert told({0, 1}) == 3.0 and told({5}) == 6.0 and told({0, 1}, 5) == 2.5
    assert told(set(range(6))) == 1
    # a DP fleet's members never compose: a scale from raw per-item counts would not be
    # post-processing of their noised steps
    assert told({0, 1}, dp={"batch": 500}) == 1
