"""The budget planner of the DP-SGD epoch modes: one place where a run's target (or its given
noise and budget) becomes the steps' noise multiplier and the private fallback's releases.

The fallback (``models.private.fallback.DPSGDFallback``) is passed in, duck-typed by its
``plan(z_total)``: privacy sits below the models and imports none of them.
"""

from __future__ import annotations


def plan_private_epochs(fallback, dp, target_epsilon: float | None,
                        delta: float, sampling_rate: float, steps: int,
                        budget: float | None = None) -> tuple:
    """The DP-SGD epoch plan's ``DPConfig`` and the fallback's ledger entries: with a target the
    steps are calibrated so that they and the fallback's releases compose to exactly the target;
    with a given noise and an epsilon ``budget`` the fallback takes its share of the budget (the
    steps then stop at the budget); with a given noise alone the fallback's releases are set from
    the step's own multiplier."""
    from dataclasses import replace

    from sketchrec.privacy.accounting import calibrate_noise
    from sketchrec.privacy.joint_dp import calibrate_epochs
    fixed = []
    if fallback is not None:
        whole = target_epsilon or budget
        z_total = calibrate_noise(whole, delta) if whole else dp.epoch_multiplier()
        fixed = fallback.plan(z_total)
    if target_epsilon is not None:
        z = (calibrate_epochs(target_epsilon, delta, sampling_rate, steps, fixed) if fixed
             else calibrate_noise(target_epsilon, delta, sampling_rate, steps))
        dp = replace(dp, noise_multiplier=z * dp.sensitivity_factor)
    return dp, fixed
