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
