"""The budget planner of the DP-SGD epoch modes: one place where a run's target (or its given
noise and budget) becomes the steps' noise multiplier, the private fallback's releases and the
released training size the sampling rate is calibrated from.

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
    from sketchrec.privacy.joint_dp import calibrate_epochs
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
