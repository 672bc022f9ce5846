"""The private baseline: a DP global mean and damped DP item biases, and the pieces
the joint-DP learners share — ids to indices over a public catalogue, the per-user cap, per-user
ridge solves from a user's own ratings.

Released: the noisy per-item (sum of centred ratings, count), and what is computed from them: the
global mean mu = midpoint + (sum of noisy sums) / (sum of noisy counts) and each item's bias
(noisy sum - (mu - midpoint) * noisy count) / (noisy count + damping). The damping grows with the
noise (an item with few ratings is pulled to 0 rather than to its noise). Items come from a public
catalogue: a release over the items present in the data would reveal which items someone rated.

>>> import numpy as np
>>> cap = capped(np.array([0, 0, 0, 1]), 2, np.random.default_rng(0))
>>> int(cap[:3].sum()), bool(cap[3])
(2, True)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

Noise = Callable[[tuple, np.random.Generator], np.ndarray]  # privacy.joint_dp.stage_noise


@dataclass
class Encoded:
    """Ratings as indices: users (0..n_users-1, private), items (positions in the catalogue)."""

    users: np.ndarray
    items: np.ndarray
    ratings: np.ndarray
    user_ids: np.ndarray
    n_items: int


def encode(users: np.ndarray, items: np.ndarray, ratings: np.ndarray, catalogue: np.ndarray) -> Encoded:
    """Index the ratings; ratings of items outside the public catalogue are dropped, and of a
    repeated (user, item) pair only the last is kept.

    >>> e = encode(np.array([1, 1, 2]), np.array([7, 7, 9]), np.array([1.0, 5.0, 3.0]), np.array([7, 9]))
    >>> e.users.tolist(), e.items.tolist(), e.ratings.tolist()
    ([0, 1], [0, 1], [5.0, 3.0])
    """
    order = np.argsort(catalogue, kind="stable")
    pos = np.searchsorted(catalogue[order], items)
    pos = np.minimum(pos, len(catalogue) - 1)
    known = catalogue[order][pos] == items
    user_ids, user_idx = np.unique(users[known], return_inverse=True)
    item_idx, values = order[pos[known]].astype(np.int64), np.asarray(ratings, np.float64)[known]
    # one rating per (user, item), the last: a repeated pair would count twice in one item's cell
    # and break the per-item bounds the sensitivities assume
    pair = user_idx.astype(np.int64) * len(catalogue) + item_idx
    _, last = np.unique(pair[::-1], return_index=True)
    keep = np.sort(len(pair) - 1 - last)
    return Encoded(user_idx[keep].astype(np.int64), item_idx[keep], values[keep], user_ids, len(catalogue))


def item_index(catalogue: np.ndarray, items: np.ndarray) -> np.ndarray:
    """Catalogue positions of ``items`` (-1 for items outside it)."""
    order = np.argsort(catalogue, kind="stable")
    pos = np.minimum(np.searchsorted(catalogue[order], items), len(catalogue) - 1)
    return np.where(catalogue[order][pos] == items, order[pos], -1)


def capped(users: np.ndarray, cap: int | None, rng: np.random.Generator) -> np.ndarray:
    """Mask of each user's ``cap`` ratings of lowest random priority (a fresh uniform per
    rating): which ratings a user contributes depends on that user's ratings only, and removing
    one rating swaps at most one kept rating (the rating-level sensitivity uses this)."""
    if cap is None:
        return np.ones(len(users), bool)
    order = np.lexsort((rng.random(len(users)), users))
    ranked = users[order]
    starts = np.r_[0, np.flatnonzero(ranked[1:] != ranked[:-1]) + 1]
    rank = np.arange(len(users)) - np.repeat(starts, np.diff(np.r_[starts, len(users)]))
    keep = np.zeros(len(users), bool)
    keep[order[rank < cap]] = True
    return keep


def ridge_per_user(users: np.ndarray, feats: np.ndarray, y: np.ndarray, n_users: int,
                   penalty: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each user's ridge solution of y ~ feats (diagonal penalty) from that user's own rows, and
    the inverse regularised Gram matrices (for leave-one-out errors)."""
    k = feats.shape[1]
    gram = np.zeros((n_users, k, k))
    for a in range(k):
        for b in range(a, k):
            gram[:, a, b] = gram[:, b, a] = np.bincount(users, feats[:, a] * feats[:, b], n_users)
    rhs = np.stack([np.bincount(users, feats[:, a] * y, n_users) for a in range(k)], axis=1)
    inv = np.linalg.inv(gram + np.diag(penalty))
    return np.einsum("ukl,ul->uk", inv, rhs), inv


def loo_residuals(users: np.ndarray, feats: np.ndarray, y: np.ndarray, sol: np.ndarray,
                  inv: np.ndarray) -> np.ndarray:
    """Leave-one-out residuals of the per-user ridge fits (e / (1 - h), h the leverage)."""
    lev = np.minimum(np.einsum("nk,nkl,nl->n", feats, inv[users], feats), 1.0 - 1e-9)
    return (y - np.einsum("nk,nk->n", feats, sol[users])) / (1.0 - lev)


@dataclass
class BiasRelease:
    """The released bias model: global mean, item biases, noisy item counts."""

    mu: float
    item_bias: np.ndarray
    counts: np.ndarray
    sums: np.ndarray  # noisy sums of clipped centred ratings / half-range

    def baseline(self, items: np.ndarray) -> np.ndarray:
        """The private baseline's predictions (catalogue positions; -1: the mean)."""
        return self.mu + np.where(items >= 0, self.item_bias[np.maximum(items, 0)], 0.0)


def release_biases(enc: Encoded, keep: np.ndarray, rating_range: tuple[float, float],
                   noise_mean: Noise, noise_items: Noise, std_items: float, rng,
                   damping: float = 5.0, prior_var: float = 0.25,
                   weights: np.ndarray | None = None) -> BiasRelease:
    """Noisy releases over the kept ratings, in units of clipped centred rating / half-range:
    the global (sum, count) with ``noise_mean``, and per item (sum, count) with ``noise_items``
    (of std ``std_items``; ``weights`` as in ``noisy_bias_statistics``); then mu and the item
    biases (``bias_estimates``). ``rng()`` gives each release a fresh generator."""
    stats = noisy_bias_statistics(enc, keep, rating_range, noise_mean, noise_items, rng, weights)
    return bias_estimates(*stats, rating_range, std_items, damping, prior_var)


def noisy_bias_statistics(enc: Encoded, keep: np.ndarray, rating_range: tuple[float, float],
                          noise_mean: Noise, noise_items: Noise, rng,
                          weights: np.ndarray | None = None) -> tuple:
    """The released statistics: (global noisy sum, global noisy count, per-item noisy sums,
    per-item noisy counts) of the kept ratings, clipped and centred, in half-range units. Noisy
    statistics of disjoint parts of a stream add up (``models.private.fallback``).

    ``weights`` (one per kept rating, in [0, 1]) scale each rating's (sum, count) in the per-item
    cells: the fallback bounds a user's whole contribution vector with them (``user_weights``).
    The global (sum, count) is unweighted: its sensitivity counts every kept rating."""
    lo, hi = rating_range
    mid, half = (lo + hi) / 2, (hi - lo) / 2
    x = np.clip(enc.ratings[keep] - mid, -half, half) / half
    w = np.ones(len(x)) if weights is None else np.asarray(weights, np.float64)
    total, n = np.array([x.sum(), keep.sum()]) + noise_mean((2,), rng())
    sums = np.bincount(enc.items[keep], w * x, enc.n_items) + noise_items(enc.n_items, rng())
    counts = np.bincount(enc.items[keep], w, enc.n_items) + noise_items(enc.n_items, rng())
    return float(total), float(n), sums, counts


def bias_estimates(total: float, n: float, sums: np.ndarray, counts: np.ndarray,
                   rating_range: tuple[float, float], std_items: float, damping: float = 5.0,
                   prior_var: float = 0.25) -> BiasRelease:
    """mu and the item biases from the noisy statistics (post-processing). An item's bias is
    shrunk as a posterior mean under a N(0, prior_var) prior: its noisy sum has variance n
    (rating noise ~1) plus the DP noise (std ``std_items``), so rare items go to 0 instead of to
    their noise."""
    lo, hi = rating_range
    mid, half = (lo + hi) / 2, (hi - lo) / 2
    offset = float(np.clip(half * total / max(n, 1.0), -half, half))
    pos = np.maximum(counts, 1.0)
    shrink = pos + damping + (half * std_items) ** 2 / pos / prior_var
    bias = np.clip((half * sums - offset * np.maximum(counts, 0.0)) / shrink, -2 * half, 2 * half)
    return BiasRelease(mid + offset, bias, counts, sums)


def own_offsets(users: np.ndarray, residual: np.ndarray, n_users: int, reg: float) -> np.ndarray:
    """Each user's damped mean residual, from that user's own ratings (joint DP: not released)."""
    return np.bincount(users, residual, n_users) / (np.bincount(users, minlength=n_users) + reg)
