"""A seeded synthetic ratings stream with a low-rank ground truth (the built-in source of `replay`
without a file, and of the benchmarks)."""

from __future__ import annotations

import math
from typing import Iterator

import numpy as np

from sketchrec.ratings import Ratings


class SyntheticStream:
    """Ratings from a low-rank ground truth with Zipf-skewed users and items (seeded).

    r = clip(round_half(mu + b_u + b_i + u . v + noise), 1, 5), with users and items drawn with
    probability proportional to 1 / rank^skew, and timestamps increasing by exponential gaps.
    The ground truth is fixed at construction, so memory does not grow with the stream length.

    ``taste`` is the std of the taste term u . v (default 1 / sqrt(rank)); ``noise`` the std of
    the Gaussian noise before rounding. With ``change_point`` F in (0, 1) every user's taste
    vector u is redrawn (seeded, from its own generator: the stream before the point is the one
    without a change-point) for the ratings from position ``change_at`` = round(F * n_ratings)
    on: what was learned of the tastes before it is wrong after it (``drifting()`` is the
    benchmark stream of that kind). ``noise_floor()`` is the RMSE of the best possible
    predictor (the exact mean of the rounded, clipped rating given user, item and position).
    Deterministic by ``seed``:

    >>> s = SyntheticStream(1000, 50, 40, change_point=0.5, seed=3)
    >>> s.change_at, bool((s.all().ratings == SyntheticStream(1000, 50, 40, seed=3, change_point=0.5).all().ratings).all())
    (500, True)
    >>> bool((s.all().ratings[:500] == SyntheticStream(1000, 50, 40, seed=3).all().ratings[:500]).all())
    True
    >>> round(s.noise_floor(), 2)   # noise 0.5, widened by the rounding, narrowed by the clip
    0.51
    """

    def __init__(self, n_ratings: int = 500_000, n_users: int = 10_000, n_items: int = 3_000,
                 rank: int = 8, skew: float = 0.8, noise: float = 0.5, seed: int = 0,
                 change_point: float | None = None, taste: float | None = None):
        if min(n_ratings, n_users, n_items, rank) < 1:
            raise ValueError("sizes must be positive")
        if change_point is not None and not 0 < change_point < 1:
            raise ValueError("change_point must be a fraction strictly between 0 and 1")
        self.n_ratings, self.n_users, self.n_items = int(n_ratings), int(n_users), int(n_items)
        self.rank, self.skew, self.noise, self.seed = int(rank), float(skew), float(noise), int(seed)
        self.change_point, self.taste = change_point, taste
        rng = np.random.default_rng(seed)
        # per component: std(u . v) = taste (default 1 / sqrt(rank), the historical streams)
        scale = 1.0 / math.sqrt(rank) if taste is None else math.sqrt(taste / math.sqrt(rank))
        self._u = rng.normal(0, scale, (n_users, rank)).astype(np.float32)
        self._v = rng.normal(0, scale, (n_items, rank)).astype(np.float32)
        self._bu = rng.normal(0, 0.4, n_users).astype(np.float32)
        self._bi = rng.normal(0, 0.4, n_items).astype(np.float32)
        self._user_cdf = self._zipf_cdf(n_users)
        self._item_cdf = self._zipf_cdf(n_items)
        self.change_at = self.n_ratings if change_point is None else int(round(change_point * n_ratings))
        self._u_after = self._u if change_point is None else np.random.default_rng(
            [seed, 5]).normal(0, scale, (n_users, rank)).astype(np.float32)

    @classmethod
    def drifting(cls, n_ratings: int = 500_000, seed: int = 0) -> "SyntheticStream":
        """The change-point benchmark stream: 1,000 users and 1,000 items, strong tastes (std 1),
        noise 0.35 (noise floor 0.35), every taste redrawn halfway. On it the default sketch
        learner ends at windowed RMSE 0.67 (1/20 windows) and lr 0.05 / reg 0.02 at 0.50.
        ``replay --synthetic-users 1000 --synthetic-items 1000 --synthetic-taste 1
        --synthetic-noise 0.35 --change-point 0.5`` replays it."""
        return cls(n_ratings, 1_000, 1_000, noise=0.35, seed=seed, change_point=0.5, taste=1.0)

    def _zipf_cdf(self, n: int) -> np.ndarray:
        weights = 1.0 / np.arange(1, n + 1, dtype=np.float64) ** self.skew
        return np.cumsum(weights) / weights.sum()

    def _draws(self, size: int) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
        """(users, items, noiseless raw rating, noise, timestamps) of each batch."""
        rng = np.random.default_rng(self.seed + 1)
        clock = 1_500_000_000
        for start in range(0, self.n_ratings, size):
            n = min(size, self.n_ratings - start)
            u = np.minimum(np.searchsorted(self._user_cdf, rng.random(n)), self.n_users - 1)
            i = np.minimum(np.searchsorted(self._item_cdf, rng.random(n)), self.n_items - 1)
            after = (start + np.arange(n) >= self.change_at)[:, None]
            taste = np.where(after, self._u_after[u], self._u[u]) if self.change_point else self._u[u]
            mean = 3.6 + self._bu[u] + self._bi[i] + np.einsum("nr,nr->n", taste, self._v[i])
            noise = rng.normal(0, self.noise, n)
            stamps = clock + np.cumsum(rng.exponential(2.0, n)).astype(np.int64)
            clock = int(stamps[-1])
            yield u, i, mean, noise, stamps

    def batches(self, size: int = 10_000) -> Iterator[Ratings]:
        for u, i, mean, noise, stamps in self._draws(size):
            ratings = np.clip(np.round((mean + noise) * 2) / 2, 1.0, 5.0)
            yield Ratings(u.astype(np.int64) + 1, i.astype(np.int64) + 1, ratings, stamps)

    def all(self) -> Ratings:
        return Ratings.concat(list(self.batches(100_000)))

    def noise_floor(self) -> float:
        """RMSE of the best possible predictor over this stream: sqrt of the mean variance of
        clip(round_half(mean + noise), 1, 5) given each rating's mean (exact, by the normal CDF)."""
        from scipy.special import ndtr
        if self.noise == 0:
            return 0.0   # each rating is its mean, rounded: nothing left to predict
        grid = np.arange(1.0, 5.01, 0.5)                 # the values a rating takes
        edges = np.r_[-np.inf, grid[:-1] + 0.25, np.inf]  # rounding half-way points
        total = 0.0
        for _, _, mean, _, _ in self._draws(100_000):
            cdf = ndtr((edges[None, :] - mean[:, None]) / self.noise)
            p = np.diff(cdf, axis=1)
            first, second = p @ grid, p @ grid ** 2
            total += float(np.sum(second - first ** 2))
        return math.sqrt(total / self.n_ratings)
