"""The DP-SGD epoch planner (``privacy.budget``): the training size it plans from is a charged,
freshly noised release, and the whole plan (size, fallback, steps) composes to the target."""

from __future__ import annotations

import math

from sketchrec.models.private.dp_sgd import DPConfig
from sketchrec.privacy.accounting import GaussianSteps, epsilon_of
from sketchrec.privacy.budget import SIZE_SHARE, plan_private_epochs


def test_the_size_is_noised_from_fresh_entropy_and_charged_first():
    dp = DPConfig(2.0, batch_size=100)
    sizes = {plan_private_epochs(None, dp, None, 1e-5, 5000, 1).size for _ in range(5)}
    assert len(sizes) == 5 and 5000 not in sizes   # secret noise: no two runs agree, none is N
    plan = plan_private_epochs(None, dp, None, 1e-5, 5000, 1)
    assert plan.fixed == [GaussianSteps(2.0 / math.sqrt(SIZE_SHARE))]   # one Gaussian, charged
    assert plan.sampling_rate == 100 / plan.size


def test_the_size_noise_scales_with_the_user_cap():
    """At the user unit one user moves the capped size by up to m ratings."""
    spread = {}
    for unit, cap in (("rating", None), ("user", 20)):
        dp = DPConfig(2.0 * (cap or 1), batch_size=100, unit=unit, user_cap=cap, debug_noise_seed=5)
        spread[unit] = plan_private_epochs(None, dp, None, 1e-5, 5000, 1).size - 5000
    assert math.isclose(spread["user"], 20 * spread["rating"])   # same draw, m times the scale


def test_with_a_target_the_size_release_is_inside_the_target():
    dp = DPConfig(1.0, batch_size=100, debug_noise_seed=3)
    plan = plan_private_epochs(None, dp, 2.0, 1e-5, 5000, 2)
    steps = GaussianSteps(plan.dp.epoch_multiplier(), plan.sampling_rate, plan.steps)
    assert epsilon_of(plan.fixed + [steps], 1e-5) <= 2.0
    assert epsilon_of([steps], 1e-5) < epsilon_of(plan.fixed + [steps], 1e-5)   # the size costs
