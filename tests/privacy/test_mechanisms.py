"""Tests for privacy.mechanisms: exact samplers (KS), the DP inequality on neighbouring inputs
(exact and empirical), normalising constants and moments by quadrature, the corrected Huber
inverse CDF, the analytic Gaussian calibration, and argument validation."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate, stats
from scipy.optimize import brentq

from sketchrec.privacy.bounded_laplace import BoundedLaplace
from sketchrec.privacy.mechanisms import Gaussian, Huber, Laplace, analytic_gaussian_delta

N = 100_000
SEED = 20240611
HUBER_ALPHAS = [0.3, 1.076, 3.0]
BL_EPSILONS = [0.5, 1.0, 3.0]
L, U = 1.0, 5.0
BL_CENTRES = [L, 0.5 * (L + U), U]


def rng_for(*key: int) -> np.random.Generator:
    return np.random.default_rng([SEED, *key])


def additive_mechanisms():
    """(id, mechanism) pairs for the input-independent mechanisms."""
    out = [
        ("laplace", Laplace(epsilon=1.0, sensitivity=1.0)),
        ("laplace-s2", Laplace(epsilon=0.5, sensitivity=2.0)),
        ("gauss-analytic", Gaussian(epsilon=1.0, delta=1e-5, sensitivity=1.0)),
        ("gauss-analytic-big-eps", Gaussian(epsilon=5.0, delta=1e-6, sensitivity=2.0)),
        ("gauss-classical", Gaussian(epsilon=0.5, delta=1e-5, sensitivity=1.0,
                                     calibration="classical")),
    ]
    out += [(f"huber-{a}", Huber(epsilon=a, sensitivity=1.0)) for a in HUBER_ALPHAS]
    # alpha = epsilon / Delta_1: same noise as alpha = 1.076, twice the sensitivity
    out.append(("huber-s2", Huber(epsilon=2 * 1.076, sensitivity=2.0)))
    return out


ADDITIVE = additive_mechanisms()
ADDITIVE_IDS = [name for name, _ in ADDITIVE]
ADDITIVE_MECHS = [m for _, m in ADDITIVE]


def noise_extent(mech) -> float:
    """A half-width that holds essentially all the noise mass (for interval grids)."""
    if isinstance(mech, Gaussian):
        return 6.0 * mech.sigma
    if isinstance(mech, Laplace):
        return 12.0 * mech.scale
    return mech.alpha + 12.0 / mech.alpha


def interval_grid(lo: float, hi: float, k: int = 40) -> tuple[np.ndarray, np.ndarray]:
    """k equal intervals covering [lo, hi], the two outer half-lines, and every half-line
    (-inf, e] / [e, inf) at the grid edges."""
    edges = np.linspace(lo, hi, k + 1)
    a = np.concatenate([edges[:-1], [-np.inf, hi], np.full(k + 1, -np.inf), edges])
    b = np.concatenate([edges[1:], [lo, np.inf], edges, np.full(k + 1, np.inf)])
    return a, b


# ----------------------------------------------------------------------------------------------
# 1. exact samplers: KS against the exact CDF


@pytest.mark.parametrize("name, mech", ADDITIVE, ids=ADDITIVE_IDS)
def test_ks_additive(name, mech):
    x = mech.sample(N, rng_for(1, ADDITIVE_IDS.index(name)))
    assert x.shape == (N,)
    assert stats.kstest(x, mech.cdf).pvalue > 1e-3


@pytest.mark.parametrize("alpha", HUBER_ALPHAS)
def test_ks_huber_inverse_cdf_sampler(alpha):
    h = Huber(epsilon=alpha, sensitivity=1.0)
    x = h.ppf(rng_for(2, int(alpha * 1000)).random(N))
    assert stats.kstest(x, h.cdf).pvalue > 1e-3


# ----------------------------------------------------------------------------------------------
# 2. the DP inequality on neighbouring inputs, exact and empirical


def _check_dp_inequality(p, q, eps, delta, n=None, exact=None, slack=1e-12):
    """P[M(x) in S] <= e^eps P[M(x') in S] + delta (+ slack), in both directions.

    Exact version: p, q are exact probabilities and the slack is rounding (1e-12). Empirical
    version: p, q are frequencies over n draws each, and the slack is 4 binomial standard errors
    of p - e^eps q, computed from the exact probabilities ``exact = (P, Q)`` (the sampling spread
    under the model; estimated spreads are too small in cells with a handful of counts)."""
    pairs = [(p, q, None), (q, p, None)] if exact is None else [
        (p, q, exact), (q, p, exact[::-1])]
    for pp, qq, ex in pairs:
        if ex is None:
            tol = slack
        else:
            pe, qe = ex
            tol = 4.0 * np.sqrt((pe * (1 - pe) + math.exp(2 * eps) * qe * (1 - qe)) / n) + 1e-12
        excess = pp - math.exp(eps) * qq - delta
        assert np.all(excess <= tol), f"max excess {np.max(excess - tol):.3g} over tolerance"


@pytest.mark.parametrize("mech", ADDITIVE_MECHS, ids=ADDITIVE_IDS)
def test_ratio_exact_additive(mech):
    x, x2 = 0.0, mech.sensitivity
    w = noise_extent(mech)
    a, b = interval_grid(-w, x2 + w)
    p = mech.cdf(b - x) - mech.cdf(a - x)
    q = mech.cdf(b - x2) - mech.cdf(a - x2)
    _check_dp_inequality(p, q, mech.epsilon, mech.delta)
    if mech.delta == 0.0:
        # pure mechanisms are tight: a tail half-line attains the ratio e^eps
        ratio = np.max(np.maximum(q / np.maximum(p, 1e-300), p / np.maximum(q, 1e-300)))
        assert ratio == pytest.approx(math.exp(mech.epsilon), rel=1e-7)


@pytest.mark.parametrize("name, mech", ADDITIVE, ids=ADDITIVE_IDS)
def test_ratio_empirical_additive(name, mech):
    rng = rng_for(4, ADDITIVE_IDS.index(name))
    x, x2 = 0.0, mech.sensitivity
    w = noise_extent(mech)
    a, b = interval_grid(-w, x2 + w)
    s1 = mech.randomise(np.full(N, x), rng)
    s2 = mech.randomise(np.full(N, x2), rng)
    s1.sort()
    s2.sort()

    def freq(s):
        return (np.searchsorted(s, b, side="right") - np.searchsorted(s, a, side="left")) / N

    exact = (mech.cdf(b - x) - mech.cdf(a - x), mech.cdf(b - x2) - mech.cdf(a - x2))
    _check_dp_inequality(freq(s1), freq(s2), mech.epsilon, mech.delta, n=N, exact=exact)


# ----------------------------------------------------------------------------------------------
# 3. normalising constants and moments by quadrature


@pytest.mark.parametrize("alpha", HUBER_ALPHAS + [0.05, 8.0])
def test_huber_normaliser_variance_cdf_by_quadrature(alpha):
    h = Huber(epsilon=alpha, sensitivity=1.0)

    def integral(f):
        pieces = [(-np.inf, -alpha), (-alpha, alpha), (alpha, np.inf)]
        return sum(integrate.quad(f, lo, hi, epsabs=0, epsrel=1e-12, limit=200)[0]
                   for lo, hi in pieces)

    assert integral(h.pdf) == pytest.approx(1.0, rel=1e-6)
    assert integral(lambda t: math.exp(-float(Huber.rho(t, alpha)))) == pytest.approx(
        h.normaliser, rel=1e-6)
    assert integral(lambda t: t * t * h.pdf(t)) == pytest.approx(h.variance, rel=1e-6)
    for x in [-alpha - 2.0, -alpha, -0.5 * alpha, 0.0, 0.3 * alpha, alpha, alpha + 1.5]:
        pts = [p for p in (-alpha, alpha) if p < x]
        lo = -np.inf
        acc = 0.0
        for p in pts + [x]:
            acc += integrate.quad(h.pdf, lo, p, epsabs=0, epsrel=1e-12, limit=200)[0]
            lo = p
        assert h.cdf(x) == pytest.approx(acc, rel=1e-6, abs=1e-15)


# ----------------------------------------------------------------------------------------------
# 4. Huber inverse CDF: the corrected third branch


def _printed_third_branch(h: Huber, y):
    """[T] eq. 4.4 third branch exactly as printed (with its sign error)."""
    a = h.alpha
    return np.log(2 * math.exp(-a * a / 2) + a * math.sqrt(2 * math.pi) * math.erf(a / math.sqrt(2))
                  - y * a * h.normaliser) / a + a / 2


@pytest.mark.parametrize("alpha", HUBER_ALPHAS)
def test_huber_inverse_cdf_corrected(alpha):
    h = Huber(epsilon=alpha, sensitivity=1.0)
    # continuity at both junctions
    assert h.ppf(h.y1) == pytest.approx(-alpha, rel=1e-9)
    assert h.ppf(h.y2) == pytest.approx(alpha, rel=1e-9)
    for y in (h.y1, h.y2):
        below, above = h.ppf(np.nextafter(y, 0)), h.ppf(np.nextafter(y, 1))
        assert abs(above - below) < 1e-9
    # F(F^-1(y)) = y on a grid that includes points near y1, y2 and the extremes
    ys = np.concatenate([np.linspace(1e-9, 1 - 1e-9, 4001),
                         h.y1 + np.linspace(-1e-3, 1e-3, 21) * h.y1,
                         h.y2 + np.linspace(-1e-3, 1e-3, 21) * h.y1])
    assert np.allclose(h.cdf(h.ppf(ys)), ys, rtol=1e-10, atol=1e-13)
    # F^-1(F(x)) = x: to full precision on the lower half (where F keeps its relative
    # precision), and on the upper half while 1 - F(x) is still well above rounding
    xs = np.linspace(-alpha - 10, 0, 501)
    assert np.allclose(h.ppf(h.cdf(xs)), xs, rtol=1e-9, atol=1e-12)
    xs = np.linspace(0, alpha + 2, 201)
    assert np.allclose(h.ppf(h.cdf(xs)), xs, rtol=0, atol=1e-6)
    # symmetry of the corrected branch: F^-1(y) = -F^-1(1 - y)
    tail_ys = np.linspace(h.y2, 1 - 1e-12, 101)[1:]
    assert np.allclose(h.ppf(tail_ys), -h.ppf(1 - tail_ys), rtol=1e-8)
    assert h.ppf(0.0) == -np.inf and h.ppf(1.0) == np.inf and h.ppf(0.5) == 0.0
    assert np.isnan(h.ppf(-0.1)) and np.isnan(h.ppf(1.1))

    # the thesis's printed branch fails all of this
    assert _printed_third_branch(h, h.y2) == pytest.approx(0.0, abs=1e-9)  # should be alpha
    printed = _printed_third_branch(h, tail_ys)
    assert np.all(printed < alpha)  # the upper tail never reaches beyond alpha
    assert not np.allclose(h.cdf(printed), tail_ys, atol=1e-3)
    u = rng_for(6, int(alpha * 1000)).random(N)
    wrong = np.where(u > h.y2, _printed_third_branch(h, np.minimum(u, 1 - 1e-16)), h.ppf(u))
    right = h.ppf(u)
    # the printed branch never puts mass beyond alpha; the upper tail should hold y1 of it
    assert np.count_nonzero(wrong > alpha) == 0
    assert abs(np.mean(right > alpha) - h.y1) < 5 * math.sqrt(h.y1 / N)
    if h.y1 > 0.01:  # at alpha = 3 the tail holds only 0.13%: too little for KS to notice
        assert stats.kstest(wrong, h.cdf).pvalue < 1e-10


# ----------------------------------------------------------------------------------------------
# 5. analytic Gaussian


@pytest.mark.parametrize("eps", [0.05, 0.3, 0.7, 0.99])
@pytest.mark.parametrize("delta", [1e-3, 1e-5, 1e-9])
@pytest.mark.parametrize("sens", [1.0, 3.0])
def test_gaussian_analytic_vs_classical(eps, delta, sens):
    an = Gaussian(epsilon=eps, delta=delta, sensitivity=sens)
    cl = Gaussian(epsilon=eps, delta=delta, sensitivity=sens, calibration="classical")
    assert cl.sigma == pytest.approx(sens * math.sqrt(2 * math.log(1.25 / delta)) / eps, rel=1e-14)
    assert an.sigma < cl.sigma
    achieved = analytic_gaussian_delta(an.sigma, epsilon=eps, sensitivity=sens)
    assert abs(achieved - delta) <= 1e-9 * delta
    assert achieved <= delta  # on the private side of the root
    # smallest such sigma: slightly less noise breaks the delta bound
    assert analytic_gaussian_delta(an.sigma * (1 - 1e-7), epsilon=eps, sensitivity=sens) > delta
    # the classical sigma is (eps, delta)-DP too, by the exact criterion
    assert analytic_gaussian_delta(cl.sigma, epsilon=eps, sensitivity=sens) <= delta


@pytest.mark.parametrize("var, expected", [(1, 33.10), (2, 20.68), (3, 15.87), (4, 13.21)])
def test_gaussian_analytic_epsilon_table(var, expected):
    # digest §2: exact analytic epsilon at delta = 1e-5, Delta = 5, for noise variance 1..4
    sigma = math.sqrt(var)
    eps = brentq(lambda e: analytic_gaussian_delta(sigma, epsilon=e, sensitivity=5.0) - 1e-5,
                 1e-3, 200.0, xtol=1e-12)
    assert eps == pytest.approx(expected, abs=5e-3)
    assert Gaussian(epsilon=eps, delta=1e-5, sensitivity=5.0).sigma == pytest.approx(sigma,
                                                                                     rel=1e-8)


def test_gaussian_analytic_large_epsilon():
    g = Gaussian(epsilon=200.0, delta=1e-10, sensitivity=1.0)
    assert 0 < g.sigma < 0.1
    assert analytic_gaussian_delta(g.sigma, epsilon=200.0, sensitivity=1.0) <= 1e-10


# ----------------------------------------------------------------------------------------------
# 6. Huber adds at least as much noise as Laplace at equal epsilon


def test_huber_variance_at_least_laplace():
    alphas = np.logspace(-3, 1.5, 300)
    ratios = np.array([Huber(epsilon=a, sensitivity=1.0).variance * a * a / 2 for a in alphas])
    assert np.all(ratios >= 1 - 1e-12)
    assert ratios[0] == pytest.approx(1.0, abs=1e-6)  # Laplace-like for small alpha
    variances = np.array([Huber(epsilon=a, sensitivity=1.0).variance for a in alphas])
    # decreasing towards 1 (and > 1 wherever the excess is above rounding)
    assert np.all(np.diff(variances) <= 0) and np.all(variances >= 1.0)
    assert np.all(variances[alphas <= 8] > 1.0)
    assert Huber(epsilon=3.0, sensitivity=1.0).variance == pytest.approx(1.0036, abs=1e-4)
    # digest Table-1 check: sigma^2 = 2 at alpha = 1.0760
    assert Huber(epsilon=1.076, sensitivity=1.0).variance == pytest.approx(2.0, abs=1e-3)


@pytest.mark.parametrize("alpha", HUBER_ALPHAS)
def test_huber_tail_dominates_laplace(alpha):
    # the likelihood ratio argument: P[|H| > t] >= P[|Lap(1/alpha)| > t] for every t >= 0
    h = Huber(epsilon=alpha, sensitivity=1.0)
    lap = Laplace(epsilon=alpha, sensitivity=1.0)
    ts = np.linspace(0, alpha + 20 / alpha, 500)
    assert np.all(h.cdf(-ts) >= lap.cdf(-ts) - 1e-15)


# ----------------------------------------------------------------------------------------------
# interfaces


def test_randomise_shapes_and_types():
    rng = rng_for(7)
    for _, mech in ADDITIVE:
        assert isinstance(mech.randomise(2.0, rng), float)
        out = mech.randomise(np.zeros((3, 4)), rng)
        assert out.shape == (3, 4)
        assert mech.sample((2, 5), rng).shape == (2, 5)
        assert isinstance(mech.pdf(0.0), float) and isinstance(mech.cdf(0.0), float)
    bl = BoundedLaplace(epsilon=1.0, lower=L, upper=U)
    assert isinstance(bl.randomise(3.0, rng), float)
    values = np.array([[1.0, 2.0], [4.5, 5.0]])
    out = bl.randomise(values, rng)
    assert out.shape == (2, 2) and np.all((out >= L) & (out <= U))
    assert bl.sample(7, rng, value=2.0).shape == (7,)
    assert bl.pdf(np.array([1.0, 2.0]), 3.0).shape == (2,)
    assert bl.cdf(2.0, np.array([1.0, 3.0])).shape == (2,)
    for mech in ADDITIVE_MECHS + [bl]:
        assert mech.epsilon > 0 and mech.sensitivity > 0
    assert [m.delta for m in ADDITIVE_MECHS if not isinstance(m, Gaussian)] == [0.0] * 6
    assert bl.delta == 0.0


def test_huber_alpha_and_scaling():
    h = Huber(epsilon=1.5, sensitivity=3.0)
    assert h.alpha == 0.5
    assert Laplace(epsilon=2.0, sensitivity=3.0).scale == 1.5


# ----------------------------------------------------------------------------------------------
# 7. bad arguments


BAD = [
    lambda: Laplace(epsilon=0.0, sensitivity=1.0),
    lambda: Laplace(epsilon=-1.0, sensitivity=1.0),
    lambda: Laplace(epsilon=float("nan"), sensitivity=1.0),
    lambda: Laplace(epsilon=float("inf"), sensitivity=1.0),
    lambda: Laplace(epsilon=1.0, sensitivity=0.0),
    lambda: Laplace(epsilon=True, sensitivity=1.0),
    lambda: Laplace(epsilon="1", sensitivity=1.0),
    lambda: Gaussian(epsilon=1.0, delta=0.0, sensitivity=1.0),
    lambda: Gaussian(epsilon=1.0, delta=1.0, sensitivity=1.0),
    lambda: Gaussian(epsilon=1.0, delta=-1e-5, sensitivity=1.0),
    lambda: Gaussian(epsilon=0.0, delta=1e-5, sensitivity=1.0),
    lambda: Gaussian(epsilon=1.0, delta=1e-5, sensitivity=-2.0),
    lambda: Gaussian(epsilon=1.0, delta=1e-5, sensitivity=1.0, calibration="classical"),
    lambda: Gaussian(epsilon=2.0, delta=1e-5, sensitivity=1.0, calibration="classical"),
    lambda: Gaussian(epsilon=0.5, delta=1e-5, sensitivity=1.0, calibration="renyi"),
    lambda: Huber(epsilon=0.0, sensitivity=1.0),
    lambda: Huber(epsilon=1.0, sensitivity=-1.0),
    lambda: Huber(epsilon=float("nan"), sensitivity=1.0),
    lambda: BoundedLaplace(epsilon=1.0, lower=5.0, upper=1.0),
    lambda: BoundedLaplace(epsilon=1.0, lower=1.0, upper=1.0),
    lambda: BoundedLaplace(epsilon=1.0, lower=-np.inf, upper=1.0),
    lambda: BoundedLaplace(epsilon=0.0, lower=1.0, upper=5.0),
    lambda: BoundedLaplace(epsilon=1.0, lower=1.0, upper=5.0, sensitivity=0.0),
    lambda: BoundedLaplace(epsilon=1.0, lower=1.0, upper=5.0, sensitivity=4.5),
    lambda: BoundedLaplace(epsilon=1.0, lower=1.0, upper=5.0).randomise(5.5, rng_for(0)),
    lambda: BoundedLaplace(epsilon=1.0, lower=1.0, upper=5.0).randomise([1.0, 0.9], rng_for(0)),
    lambda: BoundedLaplace(epsilon=1.0, lower=1.0, upper=5.0).pdf(2.0, 7.0),
    lambda: BoundedLaplace(epsilon=1.0, lower=1.0, upper=5.0).sample(3, rng_for(0), value=0.0),
    lambda: Laplace(epsilon=1.0, sensitivity=1.0).randomise(float("nan"), rng_for(0)),
    lambda: Laplace(epsilon=1.0, sensitivity=1.0).sample(-1, rng_for(0)),
]


@pytest.mark.parametrize("make", BAD)
def test_bad_arguments_raise_value_error(make):
    with pytest.raises(ValueError):
        make()


def test_keyword_only_and_rng_type():
    with pytest.raises(TypeError):
        Laplace(1.0, 1.0)  # type: ignore[misc]
    with pytest.raises(TypeError):
        BoundedLaplace(1.0, 1.0, 5.0)  # type: ignore[misc]
    with pytest.raises(TypeError):
        Huber(epsilon=1.0, sensitivity=1.0).sample(3, np.random.RandomState(0))  # type: ignore
