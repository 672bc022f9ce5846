"""The thesis's KL-divergence leakage measure (§4.2.3, eq. 4.15).

Prediction errors ``r^ - r`` on ratings the model learned ("seen", the thesis's training set) and
on ratings it did not ("unseen", its test set) are each fitted with a Gaussian; the measure is the
KL divergence of the seen fit from the unseen fit:

    KLD = 1/2 (s_tr^2 / s_te^2 + (m_tr - m_te)^2 / s_te^2 - 1 + log(s_te^2 / s_tr^2))

Low KLD: an observer of r^ (who even knows r) can hardly tell whether a rating was trained on.
It is a heuristic signal, not a differential-privacy epsilon: it assumes Gaussian errors and
measures an average gap, not a worst case.
"""

from __future__ import annotations

import math

import numpy as np


def gaussian_kld(mean_seen: float, var_seen: float, mean_unseen: float, var_unseen: float) -> float:
    """Eq. 4.15: KL( N(mean_seen, var_seen) || N(mean_unseen, var_unseen) )."""
    if var_seen <= 0 or var_unseen <= 0:
        return math.nan
    return 0.5 * (var_seen / var_unseen + (mean_seen - mean_unseen) ** 2 / var_unseen - 1.0
                  + math.log(var_unseen / var_seen))


def kld_from_errors(seen: np.ndarray, unseen: np.ndarray) -> float:
    """Eq. 4.15 from two samples of prediction errors (Gaussian fit of each)."""
    if len(seen) < 2 or len(unseen) < 2:
        return math.nan
    return gaussian_kld(float(np.mean(seen)), float(np.var(seen)), float(np.mean(unseen)),
                        float(np.var(unseen)))
