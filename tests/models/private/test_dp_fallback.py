"""The DP-SGD modes' private fallback: never worse than the DP baseline made under the
same budget, the baseline and the choice charged in the same ledger, the choice itself DP."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sketchrec.data import SyntheticStream
from sketchrec.models.private.dp_sgd import DPConfig
from sketchrec.models.private.fallback import BASELINE, DPSGDFallback
from sketchrec.models.sketch_mf import SketchMF
from sketchrec.privacy.accounting import GaussianSteps, PrivacyLedger, epsilon_of
from sketchrec.privacy.audit import epsilon_lower_bound
from sketchrec.privacy.budget import SIZE_SHARE
from sketchrec.privacy.joint_dp import (CHOICE_CLIP, FALLBACK_SHARE, FALLBACK_SHARES, fallback_budget, fallback_steps,
                                        keeps_factors, noisy_choice, stage_noise)
from sketchrec.replay.protocols import train_private_epochs

DATA = SyntheticStream(6000, n_users=150, n_items=80, seed=3).all()


def _wrapped(unit="rating", noise=1.0, **dp) -> DPSGDFallback:
    cfg = DPConfig(noise, batch_size=300, unit=unit, user_cap=10 if unit == "user" else None, **dp)
    return DPSGDFallback(SketchMF(dim=4, capacity=500, dp=cfg), width=512)


def _true_cost(model: DPSGDFallback, ledger: PrivacyLedger) -> float:
    """What the run really spent: every DP-SGD step, the training size's release the plan reads
    (``privacy.budget``) and the fallback's three releases (all shares of one z_total)."""
    steps = [s for s in ledger.steps if s.sampling_rate < 1]
    z_total = model.budget.mean * math.sqrt(FALLBACK_SHARES["mean"])
    size = GaussianSteps(z_total / math.sqrt(SIZE_SHARE))
    return epsilon_of(steps + [size] + fallback_steps(model.budget), ledger.delta)


def test_holdout_charges_the_baseline_and_the_choice_in_the_same_ledger(monkeypatch):
    model, ledger = _wrapped("user"), PrivacyLedger("user", 1e-5)
    info = train_private_epochs(model, DATA, 2, seed=1, ledger=ledger, target_epsilon=1.0)
    assert 0.98 <= ledger.epsilon() <= 1.0 + 1e-6
    assert ledger.epsilon() == pytest.approx(_true_cost(model, ledger), abs=1e-9)
    steps_only = epsilon_of([s for s in ledger.steps if s.sampling_rate < 1], 1e-5)
    assert steps_only < 0.95   # the fallback's releases are a real part of the spend
    assert info["fallback"]["serving"] and "charged in the same ledger" in info["fallback"]["fallback_budget"]
    # a broken variant that releases the baseline without charging it: the check above catches it
    broken, ledger2 = _wrapped("user"), PrivacyLedger("user", 1e-5)
    real_plan = DPSGDFallback.plan
    monkeypatch.setattr(DPSGDFallback, "plan", lambda self, z: (real_plan(self, z), [])[1])
    train_private_epochs(broken, DATA, 2, seed=1, ledger=ledger2, target_epsilon=1.0)
    assert ledger2.epsilon() < _true_cost(broken, ledger2) - 0.02


def test_a_destroyed_factor_model_falls_back_and_answers_with_the_baseline():
    model, ledger = _wrapped(), PrivacyLedger("rating", 1e-5)
    train_private_epochs(model, DATA, 1, seed=1, ledger=ledger, target_epsilon=8.0)
    model.vectors.cells[:] = 40 * np.sign(model.vectors.cells + 1e-9)   # a factor model gone wrong
    figures = model.fit_fallback(DATA.users, DATA.items, DATA.ratings)
    assert figures["fallback"] and figures["serving"] == BASELINE
    users, items = DATA.users[:50], DATA.items[:50]
    np.testing.assert_array_equal(model.predict_many(users, items), model.baseline(items))
    assert np.all(model.factors(np.arange(3, dtype=np.uint64), 0)[0] == 0)  # /recommend: the baseline


def _choice_audit(noise, std: float, trials: int = 4000) -> float:
    """Distinguish two neighbouring sets of per-user differences (one user of term -CHOICE_CLIP
    added) by the released bit alone; the certified epsilon lower bound of the best guess."""
    base = np.full(40, (-CHOICE_MARGIN_STD * std + 0.5 * CHOICE_CLIP) / 40)  # just above the threshold
    near = np.r_[base, -CHOICE_CLIP]
    rng = np.random.default_rng(71)   # pinned: the audit is statistical, the test must not flake
    keep_d = sum(noisy_choice(base, noise, std, rng)[0] for _ in range(trials))
    keep_n = sum(noisy_choice(near, noise, std, rng)[0] for _ in range(trials))
    # guess "D" on keep: right when D kept, or D' fell back
    return epsilon_lower_bound(2 * trials, 2 * trials, keep_d + (trials - keep_n))


CHOICE_MARGIN_STD = 3.0


def test_the_choice_is_dp_and_a_noise_free_choice_is_caught():
    budget = fallback_budget(1.0)           # a generous budget: the audit can see the bit move
    noise, std = stage_noise(budget, "choice", "user", 10)
    claimed = epsilon_of([GaussianSteps(budget.choice)], 1e-5)
    assert _choice_audit(noise, std) <= claimed
    leaky = _choice_audit(lambda shape, rng: 0.0, std)  # the bit computed without noise
    assert leaky > claimed


def test_a_stream_pass_falls_back_and_charges_one_combined_gaussian():
    model = _wrapped(noise=60.0)   # DP-SGD drowned in noise over the stream
    model.window = 1000
    served = model.learn_many(DATA.users, DATA.items, DATA.ratings)
    figures = model.fallback_figures()
    assert model.windows == 6 and figures["fallback"]
    tail = slice(5000, 6000)   # answered after the last switch: the baseline's answers
    assert np.sqrt(np.mean((served[tail] - DATA.ratings[tail]) ** 2)) < 1.3
    z_sgd = model.dp.noise_multiplier / 2
    parts = [z_sgd] + [s.noise_multiplier for s in fallback_steps(model.budget)]
    assert model.dp.stream_multiplier() == pytest.approx(sum(z ** -2 for z in parts) ** -0.5)
    assert model.dp.stream_multiplier() == pytest.approx(z_sgd * math.sqrt(1 - FALLBACK_SHARE))
    back = DPSGDFallback.from_bytes(model.to_bytes())   # a checkpoint keeps what was released
    back.id_keys = model.id_keys   # and the secret id key, as its own operator part
    assert (back.chose_factors, back.choice_sum, back.windows) == (False, model.choice_sum, 6)
    np.testing.assert_allclose(back.baseline(DATA.items[:100]), model.baseline(DATA.items[:100]))


def test_the_service_says_which_model_answers():
    from sketchrec.stream.recommender import Recommender
    from sketchrec.stream.service import LearningService
    model = _wrapped(noise=60.0)
    model.window = 1000
    service = LearningService(Recommender(model, pair_capacity=10_000, user_capacity=1000),
                              ledger=PrivacyLedger("rating", 1e-5))
    assert service.begin_private_pass("rating", 1e-5, None)
    service.recommender.learn_many(DATA.users, DATA.items, DATA.ratings)
    figures = service.privacy()
    assert figures["serving"] == BASELINE and figures["fallback"] is True
    assert figures["proven_bound"] is True and keeps_factors(0.0, 1.0)
