"""The budget planner: the one place where what a run is given (a target epsilon, a noise and a
budget, an SGLD temperature) becomes its noise multipliers and its shares of the budget.

- a stream pass (``stream_noise_multiplier``: `replay`, `consume`, the fleet) and SGLD-DP
  (``sgld_noise_multiplier``): plain numbers in and out (the caller builds the ``DPConfig``);
- DP-SGD epochs (``plan_private_epochs``): the steps' noise multiplier, the private fallback's
  releases and the released training size the sampling rate is calibrated from;
- the joint mode's stages are calibrated by ``privacy.joint_dp.Budget.calibrate`` on the same
  accountant; local DP has no budget to share (each rating's epsilon is the device's).

The sampling rate q = batch / N and the number of steps round(1 / q) per epoch would make the
released noise multiplier and epsilon exact functions of N, the training part's size (one more
rating moves their last digits; and with N public the relation is replace-one, not add/remove).
So the plan never reads N: it reads a Gaussian release of it (``SIZE_SHARE`` of the budget's
1/z^2, sensitivity 1 rating or the user cap m), charged to the same ledger as everything else;
every figure of the plan is post-processing of that release.

The fallback (``models.private.fallback.DPSGDFallback``) is passed in, duck-typed by its
``plan(z_total)``: privacy sits below the models and imports none of them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from sketchrec.privacy.accounting import GaussianSteps, calibrate_noise
from sketchrec.privacy.entropy import noise_generator
from sketchrec.privacy.joint_dp import FALLBACK_SHARE, calibrate_epochs

# The training size's share of the budget's 1/z^2: its noise (z / 0.1 per unit of sensitivity,
# tens of ratings at the usual budgets) moves q by a negligible fraction of a large training set.
SIZE_SHARE = 0.01
SIZE_STREAM = 1 << 40   # the size release's step index under a debug noise seed (no step uses it)


@dataclass(frozen=True)
class EpochPlan:
    """A DP-SGD epoch run's plan, made from public parameters and the noised training size.

    Parameters
    ----------
    dp: the ``DPConfig`` of the steps (calibrated when the run has a target epsilon).
    fixed: the releases charged to the ledger before the steps (size, then the fallback's).
    size: the released (noised) training size: ratings, capped per user at the user unit.
    sampling_rate, per_epoch, steps: q = batch / size, round(1 / q) steps per epoch, all epochs'.

    Examples
    --------
    >>> from types import SimpleNamespace
    >>> dp = SimpleNamespace(batch_size=100, sensitivity_factor=1, debug_noise_seed=3,
    ...                      epoch_multiplier=lambda: 2.0)
    >>> plan = plan_private_epochs(None, dp, None, 1e-5, 1000, epochs=2)
    >>> plan.fixed[0].noise_multiplier, plan.steps, plan.size != 1000
    (20.0, 20, True)
    """

    dp: object
    fixed: list
    size: float
    sampling_rate: float
    per_epoch: int
    steps: int


def noised_size(size: int, sd: float, rng) -> float:
    """``size`` plus Gaussian noise of standard deviation ``sd`` (the plan's only view of N)."""
    return float(size) + sd * float(rng.standard_normal())


def plan_private_epochs(fallback, dp, target_epsilon: float | None, delta: float, size: int,
                        epochs: int, budget: float | None = None) -> EpochPlan:
    """The DP-SGD epoch plan of ``epochs`` over a training part of ``size`` ratings: with a
    target the steps are calibrated so that they, the size release and the fallback's releases
    compose to exactly the target; with a given noise and an epsilon ``budget`` the size and the
    fallback take their shares of the budget (the steps then stop at the budget); with a given
    noise alone they are set from the step's own multiplier. With no noise at all (a clipping-only
    run, no guarantee) the size is used as it is."""
    whole = target_epsilon or budget
    z_total = calibrate_noise(whole, delta) if whole else dp.epoch_multiplier()
    fixed, released = [], float(size)
    if z_total > 0:
        z_size = z_total / math.sqrt(SIZE_SHARE)
        fixed.append(GaussianSteps(z_size))
        rng = noise_generator(dp.debug_noise_seed, SIZE_STREAM)
        released = noised_size(size, z_size * dp.sensitivity_factor, rng)
    q = min(1.0, dp.batch_size / max(released, 1.0))
    per_epoch = max(1, int(round(1.0 / q)))
    if fallback is not None:
        fixed += fallback.plan(z_total)
    if target_epsilon is not None:
        z = calibrate_epochs(target_epsilon, delta, q, epochs * per_epoch, fixed)
        dp = replace(dp, noise_multiplier=z * dp.sensitivity_factor)
    return EpochPlan(dp, fixed, released, q, per_epoch, epochs * per_epoch)


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
