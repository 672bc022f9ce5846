"""Noise multipliers from what a run is given: an SGLD temperature, or a target epsilon for one
pass over a stream. Plain numbers in and out (the caller builds the ``DPConfig``).

Epoch training is calibrated elsewhere (``replay.protocols.train_private_epochs``), once the
(capped) training set, hence the sampling rate and the number of steps, is known.
"""

from __future__ import annotations

import math

from sketchrec.privacy.accounting import calibrate_noise
from sketchrec.privacy.joint_dp import FALLBACK_SHARE


def sgld_noise_multiplier(depth: int, temperature: float, lr: float, clip: float) -> float:
    """The noise multiplier sigma of SGLD with clipped gradients: the kernel adds
    sqrt(k lr tau) per cell per step, which is lr * sigma * C, so sigma = sqrt(k tau / lr) / C.

    >>> round(sgld_noise_multiplier(depth=4, temperature=0.0004, lr=0.01, clip=2.0), 12)
    0.2
    """
    return float(math.sqrt(depth * temperature / lr)) / clip


def stream_noise_multiplier(epsilon: float, delta: float, sensitivity_factor: int = 1,
                            fallback_share: float = FALLBACK_SHARE) -> float:
    """The noise multiplier of one pass over a stream in fixed chunks costing (epsilon, delta):
    replace-one neighbours, so the sensitivity is 2C per unit, and a unit of ``sensitivity_factor``
    ratings (1, or the user cap m) scales it; DP-SGD gets 1 - ``fallback_share`` of the pass's
    1/z^2 (the private fallback the rest, ``models.dp_sgd``):
    sigma = 2 m calibrate_noise(epsilon, delta) / sqrt(1 - fallback_share)."""
    return 2 * sensitivity_factor * calibrate_noise(epsilon, delta) / math.sqrt(1 - fallback_share)
