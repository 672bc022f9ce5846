"""The damped running user + item bias baseline, online and in bounded memory: r^ = mu + b_u + b_i.

mu is the running mean of the ratings learned. An item's bias is the damped mean of the residuals
r - mu - b_u of its ratings, a user's the damped mean of r - mu - b_i: after n ratings of an id
its bias moved by (x - b) / (n + damping) at each, i.e. the mean of its residuals shrunk towards
0 as if ``damping`` ratings of residual 0 came first (a new id is 0, a well-rated one its mean).
The count n is capped at ``horizon``: past it the bias is an exponential moving average over about
``horizon`` ratings, so it follows a change of taste instead of averaging it away.

Biases live in one count sketch (two hash families, as ``SketchMF``'s biases) and the counts in a
count-min sketch on the same addresses (read as the smallest of the k cells, conservatively
updated): memory is ``2 x depth x width`` float32 cells whatever the number of ids.

>>> m = BiasBaseline(width=256)
>>> _ = m.learn_many(["ann", "bob", "ann"], ["film", "film", "book"], [5.0, 3.0, 4.0])
>>> round(m.global_mean, 3), m.n_learned
(4.0, 3)
>>> bool(m.predict_one("ann", "film") > m.predict_one("bob", "film"))
True
"""

from __future__ import annotations

import numpy as np
from numba import njit

from sketchrec.models._adaptive import cm_read
from sketchrec.models._sgd import (DIVERGED, LEARNED, SKIPPED_DIVERGED, clip_to_range, mean_of,
                                   read_bias, record_rating)
from sketchrec.models.base import ITEM, USER, CountWeighted, FactorizationModel, StateArray
from sketchrec.sketches.count_sketch import CountSketch, cell_indices, scatter_add

DEFAULT_WIDTH = 1 << 15


@njit(inline="always", cache=True)
def _step(cells, counts, addr, sign, residual, damping, horizon, delta):
    """Move one id's bias by residual / (n + 1 + damping), n its count (capped); count it."""
    n = min(cm_read(counts, addr, 0), horizon)
    delta[0] = residual / (n + 1.0 + damping)
    scatter_add(cells, addr, sign, delta)
    new = cm_read(counts, addr, 0) + 1.0
    for j in range(addr.shape[0]):
        if counts[j, addr[j, 0]] < new:
            counts[j, addr[j, 0]] = new


@njit(nogil=True, cache=True)
def bias_learn(cells, counts, salts_u, salts_i, ukeys, ikeys, ratings, hp, stats, counters, out):
    """Learn in order; out[n] is the prediction made before rating n. hp: damping of users,
    of items, horizon."""
    k = salts_u.shape[0]
    au, ai = np.empty((k, 1), dtype=np.int64), np.empty((k, 1), dtype=np.int64)
    su, si, scratch = np.empty((k, 1)), np.empty((k, 1)), np.empty(1)
    for n in range(ukeys.shape[0]):
        mu = mean_of(stats)
        bu = read_bias(cells, salts_u, ukeys[n], au, su, scratch)
        bi = read_bias(cells, salts_i, ikeys[n], ai, si, scratch)
        out[n] = clip_to_range(mu + bu + bi, stats)
        r = ratings[n]
        if not abs(r - mu - bu - bi) < DIVERGED:  # as SketchMF: never write inf/NaN into cells
            counters[SKIPPED_DIVERGED] += 1
            continue
        if stats[0] > 0:  # the first rating only sets mu
            _step(cells, counts, ai, si, r - mu - bu - bi, hp[1], hp[2], scratch)
            bi = read_bias(cells, salts_i, ikeys[n], ai, si, scratch)
            _step(cells, counts, au, su, r - mu - bu - bi, hp[0], hp[2], scratch)
        record_rating(stats, r)
        counters[LEARNED] += 1


@njit(nogil=True, cache=True)
def bias_predict(cells, salts_u, salts_i, ukeys, ikeys, stats, clip, out):
    k = salts_u.shape[0]
    addr, sign, scratch = np.empty((k, 1), dtype=np.int64), np.empty((k, 1)), np.empty(1)
    mu = mean_of(stats)
    for n in range(ukeys.shape[0]):
        pred = (mu + read_bias(cells, salts_u, ukeys[n], addr, sign, scratch)
                + read_bias(cells, salts_i, ikeys[n], addr, sign, scratch))
        out[n] = clip_to_range(pred, stats) if clip else pred


class BiasBaseline(FactorizationModel):
    """mu + damped running user and item biases (module docstring), as a learner of the product:
    the batch and river interfaces, ``factors`` (vectors of one zero component), checkpoints.

    Parameters
    ----------
    user_damping, item_damping : pseudo-ratings of residual 0 each bias starts with.
    horizon : the largest count a bias is averaged over (its forgetting).
    width, depth : the sketches' shape (``capacity``, the expected distinct users + items, sizes
        the width when given: one cell per id per row).
    seed : fixes hashing.

    Examples
    --------
    >>> from sketchrec import BiasBaseline
    >>> model = BiasBaseline(capacity=100)
    >>> _ = model.learn_many(["ann", "bob", "cy"], ["up", "up", "heat"], [5.0, 5.0, 1.0])
    >>> [item for item, _ in model.recommend("dee", k=2)]   # no vectors: the items' biases rank
    ['up', 'heat']
    """

    def __init__(self, user_damping: float = 3.0, item_damping: float = 5.0,
                 horizon: float = 25.0, width: int | None = None, depth: int = 4,
                 capacity: int | None = None, seed: int = 0):
        super().__init__(dim=1, lr=1.0, reg=0.0, seed=seed)
        if min(user_damping, item_damping) < 0 or horizon < 1:
            raise ValueError("dampings must be non-negative and horizon at least 1")
        self.user_damping, self.item_damping = float(user_damping), float(item_damping)
        self.horizon, self.depth, self.capacity = float(horizon), int(depth), capacity
        self.width = int(width or (max(64, capacity) if capacity else DEFAULT_WIDTH))
        self.biases = CountSketch(self.width, self.depth, 1, seed=(self.seed or 0) + 1)
        self.counts = np.zeros_like(self.biases.cells)
        self._salts = (self.biases.salts(USER), self.biases.salts(ITEM))

    @property
    def nbytes(self) -> int:
        return self.biases.nbytes + self.counts.nbytes + self.stats.nbytes + self.counters.nbytes

    def _state_arrays(self) -> dict[str, np.ndarray]:
        return {"biases": self.biases.cells, "counts": self.counts}

    def state_arrays(self) -> dict[str, StateArray]:
        """The base walk, with the biases declared damped running means over ``counts``
        (``CountWeighted``: what a fleet's replicas compose)."""
        arrays = super().state_arrays()
        weighted = CountWeighted("counts", (self.user_damping, self.item_damping), self.horizon,
                                 self._cells_of)
        arrays["biases"] = arrays["biases"]._replace(weighted=weighted)
        return arrays

    def _cells_of(self, keys: np.ndarray, family: int) -> np.ndarray:
        return cell_indices(self._salts[family], keys, self.width)

    def _load_state_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        self.biases.load_state_arrays({"cells": arrays["biases"]})
        self.counts = arrays["counts"]

    def _learn_keys(self, ukeys, ikeys, ratings, hp, out) -> None:
        hp = np.array([self.user_damping, self.item_damping, self.horizon])
        bias_learn(self.biases.cells, self.counts, *self._salts, ukeys, ikeys, ratings, hp,
                   self.stats, self.counters, out)

    def _predict_keys(self, ukeys, ikeys, clip, out) -> None:
        bias_predict(self.biases.cells, *self._salts, ukeys, ikeys, self.stats, clip, out)

    def factors(self, ids, family: int) -> tuple[np.ndarray, np.ndarray]:
        keys = self.id_keys.as_keys(ids)
        biases = self.biases.read_many(keys, family)[:, 0]
        return np.zeros((keys.shape[0], 1)), biases
