"""A running privacy monitor fed by the learner (KL divergence of seen vs unseen errors).

- Unseen errors: the prequential errors (each rating predicted just before it is learned).
- Seen errors: a bounded reservoir of already-learned ratings, re-predicted with the current model
  every ``probe_every`` learned ratings. The reservoir is held in memory only: it is never exported
  and not part of any checkpoint (a restart begins a new one).
- KLD by eq. 4.15, over a sliding window of the last ``window`` unseen errors and cumulatively.
  Unseen sums are updated in O(1) per rating; a probe costs ``reservoir`` predictions once per
  ``probe_every`` ratings, i.e. ``reservoir / probe_every`` predictions per rating amortised.
- ``alert_kld``: a warning is logged when the windowed KLD crosses it (once per crossing).
"""

from __future__ import annotations

import logging
import math

import numpy as np
from numba import njit

from sketchrec.privacy.leakage import gaussian_kld

log = logging.getLogger(__name__)


class _Moments:
    """Count, sum and sum of squares: mean and variance in O(1) per value."""

    def __init__(self):
        self.n, self.s, self.ss = 0, 0.0, 0.0

    def add(self, x: np.ndarray) -> None:
        self.shift(x.shape[0], float(x.sum()), float(x @ x))

    def shift(self, count: int, total: float, squares: float) -> None:
        """Add already-summed values (a sliding window passes its net change)."""
        self.n, self.s, self.ss = self.n + count, self.s + total, self.ss + squares

    @property
    def mean(self) -> float:
        return self.s / self.n if self.n else math.nan

    @property
    def var(self) -> float:
        return max(self.ss / self.n - self.mean * self.mean, 0.0) if self.n else math.nan


@njit(cache=True)
def _reservoir_offer(res_users, res_items, res_ratings, ukeys, ikeys, ratings, offered, fill, uniforms):
    """Algorithm R, one rating at a time (a later rating may replace an earlier one of the same
    batch): the first `fill` ratings take the free slots (while the reservoir is filling, slot =
    stream index); rating t (0-based over the whole stream) then takes slot floor(u * (t + 1))
    when that is below the capacity."""
    size = res_ratings.shape[0]
    for m in range(fill):
        slot = offered + m
        res_users[slot], res_items[slot], res_ratings[slot] = ukeys[m], ikeys[m], ratings[m]
    for m in range(fill, ratings.shape[0]):
        slot = np.int64(uniforms[m - fill] * (offered + m + 1))
        if slot < size:
            res_users[slot], res_items[slot], res_ratings[slot] = ukeys[m], ikeys[m], ratings[m]


@njit(cache=True)
def _ring_push(ring, pos, errors, leaving):
    """Write errors into the ring from pos on; return the change in the window's sum and sum of
    squares. The last `leaving` writes land on occupied slots (the oldest errors go out); the ones
    before them fill empty slots of a ring that is not yet full."""
    window, n = ring.shape[0], errors.shape[0]
    s, ss = 0.0, 0.0
    for m in range(n):
        slot = (pos + m) % window
        if m >= n - leaving:
            old = ring[slot]
            s -= old
            ss -= old * old
        ring[slot] = errors[m]
        s += errors[m]
        ss += errors[m] * errors[m]
    return s, ss


class PrivacyMonitor:
    """Streaming KLD between errors on seen and unseen ratings (see module docstring)."""

    def __init__(self, window: int = 20_000, reservoir: int = 2_000, probe_every: int = 20_000,
                 alert_kld: float | None = None, seed: int = 0):
        if window < 2 or reservoir < 2 or probe_every < 1:
            raise ValueError("window and reservoir need at least 2 ratings; probe_every at least 1")
        self.window, self.capacity, self.probe_every = window, reservoir, probe_every
        self.alert_kld = alert_kld
        self.rng = np.random.default_rng(seed)
        self.unseen_all, self.unseen_window, self.seen = _Moments(), _Moments(), _Moments()
        self._ring = np.zeros(window)          # the last `window` unseen errors
        self._ring_pos, self._ring_full = 0, False
        self._res_users = np.zeros(reservoir, dtype=np.uint64)
        self._res_items = np.zeros(reservoir, dtype=np.uint64)
        self._res_ratings = np.zeros(reservoir)
        self._res_size, self._offered = 0, 0
        self._since_probe = 0
        self.alerting = False

    # --- feeding ---------------------------------------------------------------------------------
    def observe(self, model, ukeys: np.ndarray, ikeys: np.ndarray, ratings: np.ndarray,
                predictions: np.ndarray) -> None:
        """One learned batch: its prequential predictions, then the ratings themselves."""
        errors = np.asarray(predictions, dtype=np.float64) - ratings
        self.unseen_all.add(errors)
        self._push_window(errors)
        self._offer(ukeys, ikeys, ratings)
        self._since_probe += len(ratings)
        if self._since_probe >= self.probe_every:
            self.probe(model)

    def _push_window(self, errors: np.ndarray) -> None:
        if errors.shape[0] >= self.window:
            errors = errors[-self.window:]
        n = errors.shape[0]
        filled = self.window if self._ring_full else self._ring_pos
        leaving = max(filled + n - self.window, 0)   # oldest errors pushed out of the window
        s, ss = _ring_push(self._ring, self._ring_pos, errors, leaving)
        self.unseen_window.shift(n - leaving, s, ss)
        end = self._ring_pos + n
        self._ring_full = self._ring_full or end >= self.window
        self._ring_pos = end % self.window

    def _offer(self, ukeys, ikeys, ratings) -> None:
        """Reservoir sampling (algorithm R) over the batch, with uniforms from the seeded generator."""
        n = len(ratings)
        fill = min(max(self.capacity - self._res_size, 0), n)
        uniforms = self.rng.random(n - fill)
        self._res_size += fill
        _reservoir_offer(self._res_users, self._res_items, self._res_ratings, ukeys, ikeys, ratings,
                         self._offered, fill, uniforms)
        self._offered += n

    def probe(self, model) -> None:
        """Re-predict the reservoir with the current model: the seen-error sample."""
        self._since_probe = 0
        if self._res_size < 2:
            return
        n = self._res_size
        errors = model.predict_many(self._res_users[:n], self._res_items[:n]) - self._res_ratings[:n]
        self.seen = _Moments()
        self.seen.add(errors)
        kld = self.kld_window
        if self.alert_kld is not None:
            if kld > self.alert_kld and not self.alerting:
                log.warning("privacy monitor: windowed KLD %.4f crossed the alert threshold %.4f",
                            kld, self.alert_kld)
            self.alerting = kld > self.alert_kld

    # --- figures ---------------------------------------------------------------------------------
    def _kld(self, unseen: _Moments) -> float:
        if self.seen.n < 2 or unseen.n < 2:
            return math.nan
        return gaussian_kld(self.seen.mean, self.seen.var, unseen.mean, unseen.var)

    @property
    def kld_window(self) -> float:
        return self._kld(self.unseen_window)

    @property
    def kld_cumulative(self) -> float:
        return self._kld(self.unseen_all)

    def figures(self) -> dict:
        def clean(x):
            return None if x is None or (isinstance(x, float) and math.isnan(x)) else x
        return {"kld": clean(self.kld_window), "kld_cumulative": clean(self.kld_cumulative),
                "seen_error_mean": clean(self.seen.mean), "seen_error_var": clean(self.seen.var),
                "seen_sample": self.seen.n,
                "unseen_error_mean": clean(self.unseen_window.mean),
                "unseen_error_var": clean(self.unseen_window.var),
                "unseen_window": self.unseen_window.n, "unseen_total": self.unseen_all.n,
                "kld_alert_threshold": self.alert_kld, "kld_alert": self.alerting,
                "kld_note": "heuristic (thesis eq. 4.15, Gaussian fits of errors), not a DP epsilon"}
