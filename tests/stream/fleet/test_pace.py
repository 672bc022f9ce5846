"""A fleet member's pace (``stream.fleet.pace``): the hot-item count behind the bound, over polls whose
ids come typed as the consumer types them (int64 when every id of a poll is an integer, text otherwise)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from sketchrec.stream.fleet.pace import FLOOR, HotItems, sync_interval


def _hot(private: bool = False):
    tracker = SimpleNamespace(seq=0)
    return HotItems(SimpleNamespace(before_batch=[]), tracker, private), tracker


def test_an_interval_of_integer_and_text_polls_counts_one_item_per_key():
    hot, tracker = _hot()
    hot.observe(None, np.array([12] * 30 + list(range(100, 570)), dtype=np.int64))   # a numeric poll
    hot.observe(None, np.array(["12"] * 30 + [f"t{k}" for k in range(470)], dtype=object))  # a text poll
    tracker.seq = 1   # a take: the interval above is summed at the next batch
    hot.observe(None, np.arange(3))
    # 12 and "12" are one item to the model: 60 of 1,000 ratings, not 30 (and no TypeError
    # from ordering ints beside strs)
    assert hot.rate == 60 / 1_000
    assert hot.bound(2_000, members=4) == max(FLOOR, int(32 / 4 / 0.06))


def test_a_dp_members_interval_is_left_alone():
    hot, tracker = _hot(private=True)
    hot.observe(None, np.array([7] * 500))
    tracker.seq = 1
    hot.observe(None, np.array([7] * 500))
    assert hot.bound(sync_interval(4, 1_000), members=4) == 2_000
