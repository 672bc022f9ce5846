"""Tests for privacy.bounded_laplace: the exact sampler (KS), the DP inequality on neighbouring
inputs (exact and empirical, any sensitivity), the normalising constant and moments by quadrature,
and a constant-time sampler."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate, stats

from sketchrec.privacy.bounded_laplace import BoundedLaplace
from test_mechanisms import BL_CENTRES, BL_EPSILONS, N, L, U, _check_dp_inequality, interval_grid, rng_for


BL_PAIRS = [(L, U), (2.0, 3.0), (1.5, 4.5), (L, 0.5 * (L + U))]


@pytest.mark.parametrize("eps", BL_EPSILONS)
@pytest.mark.parametrize("centre", BL_CENTRES)
def test_ks_bounded_laplace(eps, centre):
    bl = BoundedLaplace(epsilon=eps, lower=L, upper=U)
    rng = rng_for(3, int(eps * 10), int(centre * 10))
    out = bl.randomise(np.full(N, centre), rng)
    assert out.min() >= L and out.max() <= U
    assert stats.kstest(out, lambda t: bl.cdf(t, centre)).pvalue > 1e-3
    # the additive noise, against the shifted CDF
    noise = bl.sample(N, rng, value=centre)
    assert stats.kstest(noise, lambda t: bl.cdf(t + centre, centre)).pvalue > 1e-3


@pytest.mark.parametrize("eps", BL_EPSILONS)
def test_ratio_exact_bounded_laplace(eps):
    bl = BoundedLaplace(epsilon=eps, lower=L, upper=U)
    a, b = interval_grid(L, U)
    for x, x2 in BL_PAIRS:
        p = bl.cdf(b, x) - bl.cdf(a, x)
        q = bl.cdf(b, x2) - bl.cdf(a, x2)
        _check_dp_inequality(p, q, eps, 0.0)
    # tight at the extreme pair: the density ratio at the endpoint is exactly e^eps
    assert math.log(bl.pdf(L, L) / bl.pdf(L, U)) == pytest.approx(eps, rel=1e-9)


@pytest.mark.parametrize("eps", BL_EPSILONS)
def test_ratio_empirical_bounded_laplace(eps):
    bl = BoundedLaplace(epsilon=eps, lower=L, upper=U)
    a, b = interval_grid(L, U)
    rng = rng_for(5, int(eps * 10))
    for x, x2 in BL_PAIRS[:3]:
        s1 = np.sort(bl.randomise(np.full(N, x), rng))
        s2 = np.sort(bl.randomise(np.full(N, x2), rng))

        def freq(s):
            return (np.searchsorted(s, b, side="right") - np.searchsorted(s, a, side="left")) / N

        exact = (bl.cdf(b, x) - bl.cdf(a, x), bl.cdf(b, x2) - bl.cdf(a, x2))
        _check_dp_inequality(freq(s1), freq(s2), eps, 0.0, n=N, exact=exact)


@pytest.mark.parametrize("eps", BL_EPSILONS)
def test_bounded_laplace_general_sensitivity(eps):
    """Delta < u - l: b = Delta/eps is not enough (Holohan et al.); Theorem 1's b is, tightly."""
    delta_f = 1.0
    bl = BoundedLaplace(epsilon=eps, lower=L, upper=U, sensitivity=delta_f)
    assert bl.scale > delta_f / eps
    assert bl.privacy_loss_bound(delta_f / eps) > eps  # the naive scale leaks more than eps
    assert bl.privacy_loss_bound(bl.scale) == pytest.approx(eps, rel=1e-9)
    assert bl.privacy_loss_bound(bl.scale) <= eps
    # worst pair (l, l + Delta) at the output l attains eps
    assert math.log(bl.pdf(L, L) / bl.pdf(L, L + delta_f)) == pytest.approx(eps, rel=1e-9)
    # exact inequality over pairs Delta apart across the domain, on a fine grid of points/intervals
    ys = np.linspace(L, U, 401)
    a, b = interval_grid(L, U)
    for x in np.linspace(L, U - delta_f, 9):
        x2 = x + delta_f
        log_ratio = np.log(bl.pdf(ys, x)) - np.log(bl.pdf(ys, x2))
        assert np.max(np.abs(log_ratio)) <= eps + 1e-12
        _check_dp_inequality(bl.cdf(b, x) - bl.cdf(a, x), bl.cdf(b, x2) - bl.cdf(a, x2), eps, 0.0)
    # default sensitivity is the width and gives exactly (u - l)/eps
    assert BoundedLaplace(epsilon=eps, lower=L, upper=U).scale == (U - L) / eps
    assert BoundedLaplace(epsilon=eps, lower=L, upper=U, sensitivity=U - L).scale == (U - L) / eps


@pytest.mark.parametrize("eps", BL_EPSILONS + [0.1])
@pytest.mark.parametrize("centre", BL_CENTRES + [2.2])
def test_bounded_laplace_normaliser_mean_variance_by_quadrature(eps, centre):
    bl = BoundedLaplace(epsilon=eps, lower=L, upper=U)
    b = bl.scale

    def quad(f):
        return integrate.quad(f, L, U, points=[centre], epsabs=0, epsrel=1e-12, limit=200)[0]

    laplace_mass = quad(lambda t: math.exp(-abs(t - centre) / b) / (2 * b))
    assert bl.normaliser(centre) == pytest.approx(laplace_mass, rel=1e-6)
    c_formula = 1 - 0.5 * (math.exp(-(centre - L) / b) + math.exp(-(U - centre) / b))
    assert bl.normaliser(centre) == pytest.approx(c_formula, rel=1e-12)
    assert quad(lambda t: bl.pdf(t, centre)) == pytest.approx(1.0, rel=1e-6)
    mean = quad(lambda t: t * bl.pdf(t, centre))
    assert bl.mean(centre) == pytest.approx(mean, rel=1e-6)
    var = quad(lambda t: (t - mean) ** 2 * bl.pdf(t, centre))
    assert bl.variance(centre) == pytest.approx(var, rel=1e-6)
    for x in np.linspace(L, U, 7):
        assert bl.cdf(x, centre) == pytest.approx(
            integrate.quad(lambda t: bl.pdf(t, centre), L, x, epsabs=0, epsrel=1e-12)[0]
            if x > L else 0.0, rel=1e-6, abs=1e-14)
    assert bl.cdf(L - 1, centre) == 0.0 and bl.cdf(U + 1, centre) == 1.0
    assert bl.pdf(L - 0.1, centre) == 0.0 and bl.pdf(U + 0.1, centre) == 0.0


def test_bounded_laplace_centre_bias_matches_digest():
    # digest A2: on [1,5] with r = 1, E[r*] = 2.967 (eps 0.1), 2.672 (eps 1), 2.124 (eps 3)
    for eps, expected in [(0.1, 2.967), (1.0, 2.672), (3.0, 2.124)]:
        assert BoundedLaplace(epsilon=eps, lower=L, upper=U).mean(L) == pytest.approx(
            expected, abs=1e-3)
    bl = BoundedLaplace(epsilon=1.0, lower=L, upper=U)
    assert bl.mean(3.0) == pytest.approx(3.0, abs=1e-12)  # unbiased only at the midpoint


def test_bounded_laplace_sampler_is_constant_time():
    # exactly one uniform per value, whatever the input: no rejection loop
    bl = BoundedLaplace(epsilon=0.1, lower=L, upper=U)
    for v in (L, 3.0, U):
        rng, ref = rng_for(8), rng_for(8)
        bl.randomise(np.full(1000, v), rng)
        ref.random(1000)
        assert rng.bit_generator.state == ref.bit_generator.state


def test_bounded_laplace_sample_is_noise():
    bl = BoundedLaplace(epsilon=1.0, lower=L, upper=U)
    noise = bl.sample(1000, rng_for(9), value=4.0)
    released = bl.randomise(np.full(1000, 4.0), rng_for(9))
    assert np.array_equal(noise, released - 4.0)
    assert np.all(noise >= L - 4.0) and np.all(noise <= U - 4.0)
