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

from privacy.leakage import gaussian_kld

log = logging.getLogger(__name__)


class _Moments:
    """Count, sum and sum of squares: mean and variance in O(1) per value."""

    def __init__(self):
        self.n, self.s, self.ss = 0, 0.0, 0.0

    def add(self, x: np.ndarray, sign: int = 1) -> None:
        self.n += sign * x.shape[0]
        self.s += sign * float(x.sum())
        self.ss += sign * float(x @ x)

    @property
    def mean(self) -> float:
        return self.s / self.n if self.n else math.nan

    @property
    def var(self) -> float:
        return max(self.ss / self.n - self.mean ** 2, 0.0) if self.n else math.nan


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
        end = self._ring_pos + n
        idx = np.arange(self._ring_pos, end) % self.window
        if self._ring_full or end > self.window:
            leaving = self._ring[idx] if self._ring_full else self._ring[idx[idx < self._ring_pos]]
            self.unseen_window.add(leaving, sign=-1)
        self._ring[idx] = errors
        self.unseen_window.add(errors)
        self._ring_full = self._ring_full or end >= self.window
        self._ring_pos = end % self.window

    def _offer(self, ukeys, ikeys, ratings) -> None:
        """Reservoir sampling (algorithm R), vectorised over the batch."""
        n = len(ratings)
        seen_before = self._offered + np.arange(n)              # index of each offered rating
        self._offered += n
        fill = min(max(self.capacity - self._res_size, 0), n)
        if fill:
            sl = slice(self._res_size, self._res_size + fill)
            self._res_users[sl], self._res_items[sl], self._res_ratings[sl] = ukeys[:fill], ikeys[:fill], ratings[:fill]
            self._res_size += fill
        if fill < n:
            slots = (self.rng.random(n - fill) * (seen_before[fill:] + 1)).astype(np.int64)
            take = np.flatnonzero(slots < self.capacity)
            # applied in order, a later rating replaces an earlier one in the same slot (algorithm R):
            # keep only the last taker of each slot, then assign all at once
            last = take.shape[0] - 1 - np.unique(slots[take][::-1], return_index=True)[1]
            dest, src = slots[take[last]], fill + take[last]
            self._res_users[dest], self._res_items[dest], self._res_ratings[dest] = ukeys[src], ikeys[src], ratings[src]

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
