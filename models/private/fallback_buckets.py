"""The private fallback's item buckets and its bound on a user's contribution vector
(``models.private.fallback``: the module docstring says why both)."""

from __future__ import annotations

import numpy as np

from sketchrec.sketches.hashing import as_keys


def user_weights(users: np.ndarray, cells: np.ndarray, x: np.ndarray,
                 allowance: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-rating weights that bound each user's contribution vector to the item statistics.

    ``users``: indices 0..n-1; ``cells``: each rating's bucket; ``x``: its clipped, centred value
    in [-1, 1]; ``allowance``: each user's squared L2 norm still allowed (2m per pass). A user's
    vector is (sum of x, count) per bucket it touches; when its squared norm exceeds the
    allowance all of that user's ratings are scaled by sqrt(allowance / norm^2), so the vector's
    norm is at most sqrt(allowance). Returns (weights per rating, squared norm used per user).

    >>> w, used = user_weights(np.array([0, 0, 1]), np.array([3, 3, 4]), np.ones(3), np.array([4.0, 4.0]))
    >>> w.round(3).tolist(), used.round(9).tolist()
    ([0.707, 0.707, 1.0], [4.0, 2.0])
    """
    users = np.asarray(users, np.int64)
    n = len(allowance)
    pair = users * (int(np.max(cells, initial=0)) + 1) + np.asarray(cells, np.int64)
    _, inverse = np.unique(pair, return_inverse=True)
    inverse = inverse.reshape(-1)
    sums, counts = np.bincount(inverse, x), np.bincount(inverse)
    owner = users[np.unique(inverse, return_index=True)[1]]   # the user of each (user, bucket)
    sq = np.bincount(owner, sums ** 2 + counts ** 2, n)
    scale = np.ones(n)
    over = sq > allowance
    scale[over] = np.sqrt(np.maximum(allowance[over], 0.0) / sq[over])
    return scale[users], sq * scale ** 2


def buckets(items, width: int) -> np.ndarray:
    """Public bucket of each item (a fixed multiplicative hash of its key)."""
    keys = as_keys(items).astype(np.uint64)
    return ((keys * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(29)) % np.uint64(width)
