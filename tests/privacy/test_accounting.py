"""The accountant against independent closed forms, and the ledger's bookkeeping."""

import math

import numpy as np
import pytest
from scipy.optimize import brentq
from scipy.stats import norm

from sketchrec.privacy import joint_dp
from sketchrec.privacy.accounting import GaussianSteps, PrivacyLedger, calibrate_noise, epsilon_of
from dp_accounting.rdp import rdp_privacy_accountant as rdp_mod


def analytic_gaussian_epsilon(z: float, delta: float) -> float:
    """Exact epsilon of one Gaussian mechanism with noise multiplier z (Balle & Wang 2018):
    the epsilon solving delta = Phi(1/(2z) - eps z) - e^eps Phi(-1/(2z) - eps z)."""
    def excess(eps):
        return norm.cdf(0.5 / z - eps * z) - math.exp(eps) * norm.cdf(-0.5 / z - eps * z) - delta
    return brentq(excess, 0.0, 500.0, xtol=1e-12)


def rdp_gaussian_epsilon(z: float, k: int, delta: float, orders) -> float:
    """k-fold Gaussian RDP eps(a) = k a / (2 z^2), converted with the bound of Canonne, Kamath and
    Steinke (2020, Prop. 12): eps = rdp + log((a-1)/a) - (log delta + log a) / (a - 1), minimised
    over the same orders."""
    a = np.asarray(orders, dtype=float)
    a = a[a > 1]
    eps = k * a / (2 * z * z) + np.log((a - 1) / a) - (np.log(delta) + np.log(a)) / (a - 1)
    return float(max(eps.min(), 0.0))


@pytest.mark.parametrize("z,k", [(1.0, 1), (2.0, 10), (5.0, 100)])
def test_pld_matches_analytic_gaussian_for_k_fold_composition(z, k):
    # k Gaussians of multiplier z compose exactly to one Gaussian of multiplier z / sqrt(k)
    expected = analytic_gaussian_epsilon(z / math.sqrt(k), 1e-5)
    got = epsilon_of([GaussianSteps(z, 1.0, k)], 1e-5, accountant="pld")
    assert got == pytest.approx(expected, abs=1e-3)


@pytest.mark.parametrize("z,k", [(1.0, 1), (2.0, 10), (8.0, 1000)])
def test_rdp_matches_closed_form_conversion(z, k):
    expected = rdp_gaussian_epsilon(z, k, 1e-5, rdp_mod.DEFAULT_RDP_ORDERS)
    got = epsilon_of([GaussianSteps(z, 1.0, k)], 1e-5, accountant="rdp")
    assert got == pytest.approx(expected, abs=1e-3)
    # RDP is an upper bound: never below the exact (PLD / analytic) epsilon
    assert got >= analytic_gaussian_epsilon(z / math.sqrt(k), 1e-5) - 1e-6


def test_subsampling_amplifies_and_more_steps_cost_more():
    full = epsilon_of([GaussianSteps(1.0, 1.0, 100)], 1e-5)
    sampled = epsilon_of([GaussianSteps(1.0, 0.01, 100)], 1e-5)
    more = epsilon_of([GaussianSteps(1.0, 0.01, 1000)], 1e-5)
    assert sampled < full and sampled < more


def test_calibrated_noise_meets_the_target():
    for eps, q, steps in [(1.0, 0.01, 1000), (8.0, 0.0125, 1600), (2.0, 1.0, 1)]:
        z = calibrate_noise(eps, 1e-5, q, steps)
        spent = epsilon_of([GaussianSteps(z, q, steps)], 1e-5)
        assert spent <= eps + 1e-6
        assert spent >= eps - 0.02  # not wastefully loud
        assert calibrate_noise(eps / 2, 1e-5, q, steps) > z


# --- the target-epsilon calibration: the geometric bisection's answer, checked at its bracket ----

def fallback_plan(epsilon, delta=1e-5):
    """The releases a DP-SGD epoch plan charges before its steps: the size, then the fallback's."""
    z = calibrate_noise(epsilon, delta)
    return [GaussianSteps(z / math.sqrt(0.01))] + joint_dp.fallback_steps(joint_dp.fallback_budget(z))


def laplace_plan(epsilon):
    """The rating-level joint mode's Laplace releases before its factor iterations."""
    rest = sum(joint_dp.SHARES[k] for k in joint_dp.LAPLACE_STAGES)
    return [GaussianSteps(rest / (epsilon * rest * joint_dp.SHARES[k]), mechanism="laplace")
            for k in joint_dp.LAPLACE_STAGES]


# (fixed, epsilon, delta, count, sampling rate, accountant): DP-SGD epochs over a range of q and
# steps (the last one's best RDP order moves by six orders over the coarse bracket's 1 %), and a
# rating-level joint plan (PLD)
PLANS = {"epochs": (fallback_plan(1.0), 1.0, 1e-5, 1000, 0.01, "rdp"),
         "small epsilon": ([], 0.1, 1e-5, 100, 0.05, "rdp"),
         "order moves": (fallback_plan(2.0), 2.0, 1e-5, 400, 0.005, "rdp"),
         "joint rating": (laplace_plan(1.0), 1.0, 1e-5, 5, 1.0, "pld")}


def bisection_answer(z, plan) -> bool:
    """Whether ``z`` is what the plain geometric bisection answers (each step evaluated by the
    accountant): the high end of one of its last brackets, enough, with the low end too little
    (or the start's low end, which the bisection never evaluates)."""
    fixed, epsilon, delta, count, q, accountant = plan
    def cost(m):
        return epsilon_of(fixed + [GaussianSteps(m, q, count)], delta, accountant)
    lo, hi = joint_dp._bracket(lambda m: m < z)
    return hi == z and cost(z) <= epsilon and (lo == joint_dp._START[0] or cost(lo) > epsilon)


def counting(monkeypatch):
    """Count the accountant's evaluations at every order (the ledger's figure)."""
    calls = []
    for name in ("epsilon_of", "rdp_epsilons"):
        real = getattr(joint_dp, name)
        def counted(steps, delta, *rest, real=real, name=name):
            calls.append(name) if name == "epsilon_of" or not rest or rest[0] is None else None
            return real(steps, delta, *rest)
        monkeypatch.setattr(joint_dp, name, counted)
    return calls


@pytest.mark.parametrize("plan", PLANS.values(), ids=PLANS.keys())
def test_the_calibration_is_the_bisections_answer_at_a_few_evaluations(plan, monkeypatch):
    calls = counting(monkeypatch)
    z = joint_dp._calibrate_after(*plan)
    assert len(calls) <= 3  # the bisection evaluates 12 to 15 multipliers
    assert bisection_answer(z, plan)  # epsilon within the target by the ledger's figure, 0.1 % tight


def test_the_check_rejects_a_multiplier_one_bracket_off():
    """The bracket below the answer is too little noise, the one above wastes it: neither passes."""
    plan = PLANS["epochs"]
    z = joint_dp._calibrate_after(*plan)
    below, above = joint_dp._bracket(lambda m: m < z)[0], joint_dp._bracket(lambda m: m <= z)[1]
    assert not bisection_answer(below, plan) and not bisection_answer(above, plan)


def test_a_wrong_guess_costs_evaluations_not_the_answer(monkeypatch):
    """Guesses at an order far from the best one: the bisection's answer still, at more of the
    accountant's evaluations (the PLD plan's guess is settled by the same verdicts)."""
    plan = PLANS["order moves"]
    expected = joint_dp._calibrate_after(*plan)
    monkeypatch.setattr(joint_dp, "COARSE_ORDERS", (32,))
    monkeypatch.setattr(joint_dp, "BEST", 1)
    calls = counting(monkeypatch)
    assert joint_dp._calibrate_after(*plan) == expected and len(calls) > 3


def test_a_target_past_the_guesses_ceiling_is_settled_by_the_accountant():
    """A target so small that no multiplier under the guesses' ceiling reaches it at the subset of
    orders: the answer is still the bisection's, its epsilon within the target by the ledger's own
    figure (a guess's unevaluated "enough" above the ceiling once returned too little noise)."""
    plan = ([], 0.001, 1e-5, 1000, 1.0, "rdp")
    z = joint_dp._calibrate_after(*plan)
    assert z > joint_dp.GUESS_CEILING and bisection_answer(z, plan)


def test_an_epoch_plan_is_calibrated_once_per_process(monkeypatch):
    fixed, epsilon, delta, count, q, _ = PLANS["small epsilon"]
    z = joint_dp.calibrate_epochs(epsilon, delta, q, count, fixed)
    calls = counting(monkeypatch)
    assert joint_dp.calibrate_epochs(epsilon, delta, q, count, list(fixed)) == z and not calls


def test_ledger_merges_entries_round_trips_and_affords():
    ledger = PrivacyLedger("rating", 1e-5)
    for _ in range(5):
        ledger.record(1.0, 0.01)
    ledger.record(0.5)
    assert [s.count for s in ledger.steps] == [5, 1] and ledger.n_releases == 6
    again = PrivacyLedger.from_dict(ledger.to_dict())
    assert again.steps == ledger.steps and again.epsilon() == ledger.epsilon()
    assert ledger.epsilon_if(1.0, 0.01, 0) == ledger.epsilon()
    budget = ledger.epsilon() + 0.5
    n = ledger.affordable(budget, 1.0, 0.01)
    assert n > 0
    assert ledger.epsilon_if(1.0, 0.01, n) <= budget < ledger.epsilon_if(1.0, 0.01, n + 1)
    after = ledger._epsilon_after(1.0, 0.01)   # the bisection's figures: epsilon_if's, exactly
    assert [after(k) for k in (0, 1, 7, n)] == [ledger.epsilon_if(1.0, 0.01, k) for k in (0, 1, 7, n)]
    assert PrivacyLedger("rating", 1e-5)._epsilon_after(1.0, 0.01)(0) == 0.0
    assert ledger.affordable(ledger.epsilon() / 2, 1.0, 0.01) == 0


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError):
        GaussianSteps(0.0)
    with pytest.raises(ValueError):
        GaussianSteps(1.0, 1.5)
    with pytest.raises(ValueError):
        PrivacyLedger("item")
    with pytest.raises(ValueError):
        calibrate_noise(math.inf, 1e-5)
