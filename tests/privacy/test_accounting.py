"""The accountant against independent closed forms, and the ledger's bookkeeping."""

import math

import numpy as np
import pytest
from scipy.optimize import brentq
from scipy.stats import norm

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
