"""Empirical sensitivity: for each mechanism's pre-noise statistic, the largest change over
adversarial neighbours is at most the sensitivity the mechanism is calibrated to.

The statistics are read with the noise off (a noise multiplier of 0 releases them exactly), on
D and on D' = D plus one privacy unit built to hit the statistic as hard as possible: a user's m
ratings on one item, on items sharing a bucket, duplicated ratings, extreme values, a user with
one rating. A variant calibrated below the true worst case (the bound not applied) is shown to
fail the same check.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from sketchrec.data import SyntheticStream
from sketchrec.models.private import fallback as fb
from sketchrec.models.private.dp_sgd import DPConfig
from sketchrec.models.private.fallback import DPSGDFallback, buckets
from sketchrec.models.sketch_mf import SketchMF
from sketchrec.privacy.joint_dp import sensitivity

CAP, WIDTH = 8, 64
BASE = SyntheticStream(400, n_users=30, n_items=40, seed=5).all()
NEWCOMER = 10_000   # the added user's id (outside BASE's ids)


def _sharing_items(n: int) -> np.ndarray:
    """``n`` distinct item ids that fall in one public bucket (found by search over ids)."""
    ids = np.arange(100_000, 200_000)
    cells = buckets(ids, WIDTH)
    return ids[cells == cells[0]][:n]


def _neighbours() -> dict:
    """Name -> (items, ratings) of the added user's ratings (at most CAP of them are kept)."""
    one_item = np.full(CAP, 7)
    return {"m ratings of one item": (one_item, np.full(CAP, 5.0)),
            "m items sharing a bucket": (_sharing_items(CAP), np.full(CAP, 1.0)),
            "duplicated ratings": (np.repeat([3, 4], CAP // 2), np.full(CAP, 5.0)),
            "extreme values": (one_item, np.tile([1e9, -1e9], CAP // 2)),
            "a user with one rating": (np.array([7]), np.array([5.0])),
            "more than the cap on one item": (np.full(3 * CAP, 7), np.full(3 * CAP, 5.0))}


def _model(unit: str, window: int = fb.WINDOW) -> DPSGDFallback:
    dp = DPConfig(0.0, batch_size=100, unit=unit, user_cap=CAP if unit == "user" else None,
                  debug_noise_seed=3)   # the same random cap of the other users on D and D'
    return DPSGDFallback(SketchMF(dim=2, capacity=200, dp=dp, seed=1), WIDTH, window)


def _with(items, ratings, user=NEWCOMER):
    users = np.concatenate([BASE.users, np.full(len(items), user)])
    return (users, np.concatenate([BASE.items, np.asarray(items)]),
            np.concatenate([BASE.ratings, np.asarray(ratings, np.float64)]))


def _holdout_statistics(users, items, ratings, unit: str) -> np.ndarray:
    """The item statistics (per-bucket sums and counts) the holdout's fallback releases."""
    model = _model(unit)
    model.fit_fallback(users, items, ratings)
    return np.concatenate([model.release.sums, model.release.counts])


def _stream_statistics(users, items, ratings, unit: str, window: int) -> list[np.ndarray]:
    """Each window's item statistics of one stream pass (fixed positions)."""
    model, out, before = _model(unit, window), [], np.zeros(2 * WIDTH)
    for start in range(0, len(ratings), window):
        part = slice(start, start + window)
        model.learn_many(users[part], items[part], ratings[part])
        now = np.concatenate([model._totals[2], model._totals[3]])
        out.append(now - before)
        before = now
    return out


@pytest.mark.parametrize("name", list(_neighbours()))
def test_holdout_item_statistics_move_at_most_the_calibrated_user_sensitivity(name):
    base = _holdout_statistics(BASE.users, BASE.items, BASE.ratings, "user")
    moved = _holdout_statistics(*_with(*_neighbours()[name]), "user")
    bound = sensitivity("biases", "user", CAP)
    assert np.linalg.norm(moved - base) <= bound + 1e-9


def test_holdout_item_statistics_move_at_most_the_rating_sensitivity():
    base = _holdout_statistics(BASE.users, BASE.items, BASE.ratings, "rating")
    for item, value in ((7, 5.0), (7, 1e9), (int(BASE.items[0]), -1e9)):
        moved = _holdout_statistics(*_with([item], [value], user=int(BASE.users[0])), "rating")
        assert np.linalg.norm(moved - base) <= sensitivity("biases", "rating", 1) + 1e-9


@pytest.mark.parametrize("name", ["m ratings of one item", "m items sharing a bucket",
                                  "more than the cap on one item"])
def test_a_stream_pass_moves_the_item_statistics_at_most_the_calibrated_sensitivity(name):
    """Replace-one at fixed positions: one user's ratings in place of another's, spread over
    windows; the windows' changes compose (sum of squares) to at most twice sqrt(2m)."""
    items, ratings = _neighbours()[name]
    n = len(items)
    users, all_items, all_ratings = _with(items, ratings)
    others = users.copy()
    others[-n:] = NEWCOMER + 1   # the neighbour: the same positions, another user's ratings
    other_items = all_items.copy()
    other_items[-n:] = np.arange(500, 500 + n)
    window = (len(users) + 1) // 2 + n // 2   # the user's ratings straddle two windows
    a = _stream_statistics(users, all_items, all_ratings, "user", window)
    b = _stream_statistics(others, other_items, all_ratings, "user", window)
    moved = math.sqrt(sum(float(np.sum((x - y) ** 2)) for x, y in zip(a, b)))
    assert moved <= 2 * sensitivity("biases", "user", CAP) + 1e-9


def test_the_check_catches_statistics_calibrated_below_their_worst_case(monkeypatch):
    """Without the per-user bound (every weight 1) a user's m ratings in one bucket move it by
    sqrt(2) m, above the calibrated sqrt(2m): the sensitivity check fails."""
    monkeypatch.setattr(fb, "user_weights",
                        lambda users, cells, x, allowance: (np.ones(len(users)), np.zeros(len(allowance))))
    base = _holdout_statistics(BASE.users, BASE.items, BASE.ratings, "user")
    moved = _holdout_statistics(*_with(*_neighbours()["m ratings of one item"]), "user")
    assert np.linalg.norm(moved - base) > sensitivity("biases", "user", CAP) * 1.5


def test_users_in_distinct_buckets_are_not_scaled():
    """The bound costs nothing for a user whose ratings fall in distinct buckets."""
    users, cells = np.zeros(CAP, np.int64), np.arange(CAP)
    weights, used = fb.user_weights(users, cells, np.ones(CAP), np.array([2.0 * CAP]))
    assert np.all(weights == 1.0) and used[0] == pytest.approx(2.0 * CAP)
