"""The producer's messages built a column at a time are byte for byte those of the per-rating
path (the one a --rate run takes): same keys, same CSV, same message order."""

from __future__ import annotations

import numpy as np
import pytest

from sketchrec.data import Ratings
from sketchrec.stream.kafka import producer
from sketchrec.stream.kafka.messages import parse_message


def ratings(text_ids: bool, unsafe: bool = False) -> Ratings:
    rng = np.random.default_rng(3)
    n = 3_000
    users = rng.integers(1, 200, n)
    if text_ids:
        users = np.array([f"user {u}" + ("," if unsafe and u == 7 else "") for u in users], object)
    stars = rng.choice([0.5, 1.0, 3.5, 4.0, 5.0, 3.14159265, 2.0 / 3.0], n)
    return Ratings(users, rng.integers(1, 60, n), stars, rng.integers(0, 2**40, n))


@pytest.mark.parametrize("text_ids", [False, True])
@pytest.mark.parametrize("batch", [1, 4, 25, 10_000])
def test_column_messages_equal_the_per_rating_ones(text_ids, batch):
    data = ratings(text_ids)
    fast = list(producer._messages(data, data.ratings, batch))
    slow = list(producer._paced(producer._rows(data, data.ratings), batch, None, 0.0))
    assert fast == slow
    assert sum(n for _, _, n in fast) == len(data)
    # and each message still reads back as its ratings
    key, value, n = fast[-1]
    assert len(parse_message(value).ratings) == n


def test_ids_holding_a_comma_take_the_json_path():
    data = ratings(True, unsafe=True)
    fast = list(producer._messages(data, data.ratings, 4))
    assert fast == list(producer._paced(producer._rows(data, data.ratings), 4, None, 0.0))
    assert any(value.startswith(b"[") for _, value, _ in fast)
