"""One-run privacy audit with canary ratings (Steinke, Nasr, Jagielski 2023, Algorithm 1).

m canary ratings get reserved user and item ids (``__canary__u<i>``, ``__canary__i<i>``) and random
ratings; a secret fair coin includes each in training or not. After training, each canary is
scored by its loss drop, ``(r - mu)^2 - (r - r^)^2`` (how much closer the model came to it than the
global mean does); the auditor guesses "in" for the k+ highest scores and "out" for the k- lowest.
With r guesses of which v are right, under (epsilon, delta)-DP the count of right guesses is
dominated by Binomial(r, e^eps / (1 + e^eps)) plus a delta term, which gives an epsilon LOWER bound
at confidence 1 - beta: a measured estimate, never a proof of privacy.

Canaries use reserved ids that the serving layer filters out, so they never appear in
recommendations or popularity lists.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

CANARY_PREFIX = "__canary__"


def audit_p_value(epsilon: float, delta: float, m: int, r: int, v: int) -> float:
    """p(eps, delta) = P[Binom(r, q) >= v] + alpha * delta * 2m, q = e^eps / (1 + e^eps), with
    alpha = max_{1 <= i <= v} P[v - i <= Binom(r, q) < v] / i (anchors §5)."""
    # scipy.stats is slow to import; only a replay's closing audit (main thread, after learning)
    # needs it, not every consumer, server and reader process that imports real_rows
    from scipy.stats import binom

    q = 1.0 / (1.0 + math.exp(-epsilon))
    tail = float(binom.sf(v - 1, r, q))
    if delta <= 0 or v <= 0:
        return tail
    i = np.arange(1, v + 1)
    window = binom.cdf(v - 1, r, q) - binom.cdf(v - i - 1, r, q)  # P[v - i <= X <= v - 1]
    return tail + float(np.max(window / i)) * delta * 2 * m


def epsilon_lower_bound(m: int, r: int, v: int, delta: float = 0.0, beta: float = 0.05,
                        eps_max: float = 50.0, tol: float = 1e-6) -> float:
    """sup{eps : p(eps, delta) < beta}, by bisection (p grows with eps); 0 if none."""
    if r <= 0 or audit_p_value(0.0, delta, m, r, v) >= beta:
        return 0.0
    lo, hi = 0.0, eps_max
    if audit_p_value(hi, delta, m, r, v) < beta:
        return hi
    while hi - lo > tol:
        mid = (lo + hi) / 2
        if audit_p_value(mid, delta, m, r, v) < beta:
            lo = mid
        else:
            hi = mid
    return lo


@dataclass
class Canaries:
    """m canary ratings and their secret inclusion coins."""

    users: np.ndarray
    items: np.ndarray
    ratings: np.ndarray
    included: np.ndarray  # bool: the secret coin S_i = +1

    @classmethod
    def make(cls, m: int, rating_range: tuple[float, float] = (1.0, 5.0), seed: int = 0) -> "Canaries":
        rng = np.random.default_rng(seed)
        users = np.array([f"{CANARY_PREFIX}u{i}" for i in range(m)], dtype=object)
        items = np.array([f"{CANARY_PREFIX}i{i}" for i in range(m)], dtype=object)
        # extreme ratings: far from the mean, so that memorising one is visible
        ratings = np.where(rng.random(m) < 0.5, rating_range[0], rating_range[1]).astype(np.float64)
        return cls(users, items, ratings, rng.random(m) < 0.5)

    def training_part(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        keep = self.included
        return self.users[keep], self.items[keep], self.ratings[keep]

    def audit(self, model, k_plus: int | None = None, k_minus: int | None = None,
              delta: float = 0.0, beta: float = 0.05) -> dict:
        """Score, guess and bound. Defaults guess on the most confident fifth at each end."""
        m = len(self.ratings)
        k_plus = max(1, m // 5) if k_plus is None else k_plus
        k_minus = max(1, m // 5) if k_minus is None else k_minus
        if k_plus + k_minus > m:
            raise ValueError("more guesses than canaries")
        predicted = model.predict_many(self.users, self.items)
        mu = model.global_mean
        scores = (self.ratings - mu) ** 2 - (self.ratings - predicted) ** 2
        order = np.argsort(-scores, kind="stable")
        guessed_in, guessed_out = order[:k_plus], order[m - k_minus:]
        correct = int(self.included[guessed_in].sum() + (~self.included[guessed_out]).sum())
        r = k_plus + k_minus
        return {"canaries": m, "included": int(self.included.sum()), "guesses": r, "correct": correct,
                "accuracy": correct / r, "delta": delta, "confidence": 1 - beta,
                "epsilon_lower_bound": epsilon_lower_bound(m, r, correct, delta, beta),
                "note": "measured lower bound (one-run canary audit), not a proven guarantee"}


def is_canary(ids: np.ndarray) -> np.ndarray:
    """Which ids are reserved canary ids (strings with the canary prefix).

    >>> is_canary(np.array(["__canary__u0", "alice", 7], dtype=object)).tolist()
    [True, False, False]
    """
    import pyarrow as pa
    import pyarrow.compute as pc
    try:   # every row's text at once: arrow encodes and compares in C (a replay checks every batch)
        text = pa.array(ids)
    except (pa.ArrowException, UnicodeEncodeError):
        text = None   # an int or a lone surrogate among the ids: per id below
    if text is not None and (pa.types.is_string(text.type) or pa.types.is_large_string(text.type)):
        return pc.starts_with(text, CANARY_PREFIX).fill_null(False).to_numpy(zero_copy_only=False)
    return np.fromiter((isinstance(x, str) and x.startswith(CANARY_PREFIX) for x in ids.tolist()),
                       dtype=bool, count=len(ids))


def real_rows(ids: np.ndarray) -> np.ndarray | slice:
    """The rows of a batch whose ids are not canaries, as an index: every row (``slice(None)``)
    when no id can be one (numeric ids: the common case costs nothing), else a boolean mask. Both
    serving and evaluation drop canary rows with it (canaries never show, never count).

    >>> real_rows(np.array([3, 4]))
    slice(None, None, None)
    >>> real_rows(np.array(["__canary__u0", "alice"], dtype=object)).tolist()
    [False, True]
    """
    if ids.dtype.kind not in "OU":
        return slice(None)
    return ~is_canary(ids)
