"""A fleet member's pace (``stream.fleet.pace``): the hot-item count behind the bound, over polls whose
ids come typed as the consumer types them (int64 when every id of a poll is an integer, text otherwise)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from sketchrec.models import SketchMF
from sketchrec.stream.fleet.pace import FLOOR, HOT_STEPS, HotItems, sync_interval
from sketchrec.stream.recommender import Recommender


def _hot(private: bool = False):
    rec, tracker = Recommender(SketchMF(dim=4, capacity=2_000, seed=0)), SimpleNamespace(seq=0)
    return rec, HotItems(rec, tracker, private), tracker


def test_an_interval_of_integer_and_text_polls_counts_one_item_per_key():
    rec, hot, tracker = _hot()
    users = np.arange(500, dtype=np.int64)
    rec.learn_many(users, np.array([12] * 30 + list(range(100, 570)), dtype=np.int64), np.full(500, 4.0))
    rec.learn_many(users, np.array(["12"] * 30 + [f"t{k}" for k in range(470)], dtype=object),
                   np.full(500, 3.0))   # a text poll, learned by the same member in the same interval
    tracker.seq = 1   # a take: the interval above is summed at the next batch
    rec.learn_many(np.arange(3), np.arange(3), np.full(3, 4.0))
    # 12 and "12" are one item to the model: 60 of 1,000 ratings, not 30 (and no TypeError
    # from ordering ints beside strs)
    assert hot.rate == 60 / 1_000
    assert hot.bound(2_000, members=4) == max(FLOOR, int(HOT_STEPS / 4 / 0.06))


def test_a_dp_members_interval_is_left_alone():
    rec, hot, tracker = _hot(private=True)
    rec.learn_many(np.arange(500), np.full(500, 7), np.full(500, 4.0))
    tracker.seq = 1
    rec.learn_many(np.arange(500), np.full(500, 7), np.full(500, 4.0))
    assert hot.rate is None and hot.bound(sync_interval(4, 1_000), members=4) == 2_000


def _member(sync_ratings: int | None, held: set, rate: float, kind: str = "Experts"):
    """A fleet member's pacing state alone (``FleetLearner._pace`` reads nothing else): a group
    that gave it ``held`` of four partitions, a last interval whose hottest item took ``rate``."""
    from sketchrec.stream.fleet.member import FleetLearner
    from sketchrec.stream.fleet.pace import SYNC_RATINGS, budget
    member = object.__new__(FleetLearner)
    member.topic, member.dp_batch, member.budget = "t", None, budget(kind)
    member.consumer = SimpleNamespace(partitions_for_topic=lambda topic: {0, 1, 2, 3},
                                      assignment=lambda: [SimpleNamespace(partition=p) for p in held])
    member.tracker = SimpleNamespace(refresh_every=lambda ratings: None, fleet_size=lambda members: None)
    member.book = SimpleNamespace(every=None)
    member.by_size, member.sync_ratings = sync_ratings is None, sync_ratings or SYNC_RATINGS
    rec, member.hot, _ = _hot()
    member.hot.rate = rate
    member._pace()
    return member.chunk_ratings


def test_a_given_interval_is_paced_like_the_default_one():
    """`--sync-ratings N` sets the interval a member starts from; from three members on a hot item
    shortens it as it shortens the default one (a given interval used to switch pacing off, and
    four members of the sketch at such an interval ran away from one learner on a skewed stream)."""
    hot = max(FLOOR, int(HOT_STEPS / 4 / 0.05))   # four members, the hottest item 5 % of ratings
    assert _member(2_000, held={0}, rate=0.05) == hot
    assert _member(None, held={0}, rate=0.05) == min(hot, sync_interval(4))
    assert _member(2_000, held={0}, rate=0.001) == 2_000   # nothing hot: N as given
    assert _member(2_000, held={0, 1}, rate=0.05) == 2_000   # two members: no bound


def test_a_members_default_interval_is_its_model_kinds():
    """With nothing hot, a member's default interval is its model kind's drift budget over the
    other members (the sketch alone, whose item biases compose, twice the others'), and two
    members' is the kind's pair interval; the same budget for every kind is the broken variant."""
    from sketchrec.stream.fleet.pace import KIND_BUDGETS
    quiet = dict(held={0}, rate=0.0001)
    sketch, other = _member(None, **quiet, kind="SketchMF"), _member(None, **quiet)
    assert sketch == KIND_BUDGETS["SketchMF"].drift // 3 and other == sync_interval(4) and sketch == 2 * other
    assert _member(None, held={0, 1}, rate=0.0001, kind="SketchMF") == KIND_BUDGETS["SketchMF"].pair


def test_a_members_chunks_reach_its_interval_in_whole_messages():
    """A chunk of whole messages at least the interval long: one short of it (6 messages of 100
    ratings at 666) left the interval's count unmet until the next chunk, a take every 1,200."""
    from sketchrec.stream.fleet.member import FleetLearner
    member = object.__new__(FleetLearner)
    member.chunk_ratings = 666
    for per_message, messages in ((100.0, 7), (1.0, 666), (2_000.0, 1)):
        member.per_message = per_message
        assert member._chunk_messages() == messages
