"""Additive-noise differential-privacy mechanisms on real values: Laplace, Gaussian and Huber
(Bounded Laplace, whose noise depends on the input, is in ``privacy.bounded_laplace``).

Every mechanism is built with keyword-only arguments, validated on construction (``ValueError`` on
bad input), and exposes

* ``epsilon``, ``delta`` (0.0 for the pure mechanisms) and ``sensitivity``;
* ``pdf(x)`` / ``cdf(x)``: exact density and distribution function of the additive noise (for
  ``BoundedLaplace`` the output distribution depends on the input, so it is ``pdf(x, value)`` /
  ``cdf(x, value)`` of the released value);
* ``sample(size, rng)``: the additive noise, drawn exactly (no approximate samplers);
* ``randomise(value, rng)``: ``value`` plus noise, ``value`` a scalar or an array (each entry gets
  independent noise). ``rng`` is a ``numpy.random.Generator``.

Sources: Huber mechanism — Gowtham et al., arXiv 2206.07910 and the IIT Madras thesis (digest
``seed-huber-mechanism.md`` §1). Bounded Laplace — Holohan et al. and its use for local DP
ratings (digest ``seed-ldp-blp-and-dp-nmf.md`` §A2). Analytic Gaussian — Balle & Wang, ICML 2018.
"""

from __future__ import annotations

import math
from numbers import Real

import numpy as np
from numpy.typing import ArrayLike
from scipy.special import log_ndtr, ndtr, ndtri

__all__ = [
    "Laplace",
    "Gaussian",
    "Huber",
    "analytic_gaussian_delta",
]

_SQRT_2PI = math.sqrt(2.0 * math.pi)
_SQRT2 = math.sqrt(2.0)


# ----------------------------------------------------------------------------------------------
# validation helpers


def _real(name: str, value: object) -> float:
    # bool is a Real subclass; True as an epsilon is almost certainly a bug, so refuse it
    if isinstance(value, bool) or not isinstance(value, Real):
        raise ValueError(f"{name} must be a real number, got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return value


def _positive(name: str, value: object) -> float:
    value = _real(name, value)
    if value <= 0.0:
        raise ValueError(f"{name} must be > 0, got {value!r}")
    return value


def _check_rng(rng: object) -> np.random.Generator:
    if not isinstance(rng, np.random.Generator):
        raise TypeError("rng must be a numpy.random.Generator (e.g. numpy.random.default_rng(seed))")
    return rng


def _size(size: int | tuple[int, ...]) -> tuple[int, ...]:
    shape = (size,) if isinstance(size, (int, np.integer)) else tuple(size)
    if any(int(n) < 0 for n in shape):
        raise ValueError(f"size must be non-negative, got {size!r}")
    return tuple(int(n) for n in shape)


def _as_output(arr: ArrayLike) -> float | np.ndarray:
    # a scalar in gives a Python float out, so callers can use the result as a number
    return float(arr) if np.ndim(arr) == 0 else np.asarray(arr)


class _Additive:
    """Shared ``randomise`` for the mechanisms whose noise does not depend on the input."""

    epsilon: float
    delta: float
    sensitivity: float

    def sample(self, size: int | tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
        raise NotImplementedError

    def randomise(self, value: ArrayLike, rng: np.random.Generator) -> float | np.ndarray:
        """``value`` + independent noise for each entry."""
        arr = np.asarray(value, dtype=float)
        if not np.all(np.isfinite(arr)):
            raise ValueError("value must be finite")
        return _as_output(arr + self.sample(arr.shape, rng))


# ----------------------------------------------------------------------------------------------
# Laplace


class Laplace(_Additive):
    """Laplace mechanism: noise Lap(0, b) with b = sensitivity / epsilon; pure epsilon-DP for a
    query of l1 sensitivity ``sensitivity``. Noise variance 2 b^2."""

    def __init__(self, *, epsilon: float, sensitivity: float) -> None:
        self.epsilon = _positive("epsilon", epsilon)
        self.sensitivity = _positive("sensitivity", sensitivity)
        self.delta = 0.0
        self.scale = self.sensitivity / self.epsilon

    def __repr__(self) -> str:
        return f"Laplace(epsilon={self.epsilon!r}, sensitivity={self.sensitivity!r})"

    @property
    def variance(self) -> float:
        return 2.0 * self.scale**2

    def pdf(self, x: ArrayLike) -> float | np.ndarray:
        x = np.asarray(x, dtype=float)
        return _as_output(np.exp(-np.abs(x) / self.scale) / (2.0 * self.scale))

    def cdf(self, x: ArrayLike) -> float | np.ndarray:
        x = np.asarray(x, dtype=float)
        # each tail as 0.5*exp(-|x|/b) so the small side keeps full relative precision
        half_tail = 0.5 * np.exp(-np.abs(x) / self.scale)
        return _as_output(np.where(x < 0, half_tail, 1.0 - half_tail))

    def sample(self, size: int | tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
        return _check_rng(rng).laplace(0.0, self.scale, _size(size))


# ----------------------------------------------------------------------------------------------
# Gaussian


def analytic_gaussian_delta(sigma: float, *, epsilon: float, sensitivity: float) -> float:
    """Exact delta(sigma) of the Gaussian mechanism at this epsilon (Balle & Wang 2018, Thm 8):
    Phi(D/(2s) - eps*s/D) - exp(eps) * Phi(-D/(2s) - eps*s/D), with D the l2 sensitivity.
    Decreasing in sigma, from 1 (sigma -> 0) to 0 (sigma -> inf)."""
    d, s, eps = float(sensitivity), float(sigma), float(epsilon)
    a = d / (2.0 * s) - eps * s / d
    b = -d / (2.0 * s) - eps * s / d
    # exp(eps) * Phi(b) in log space: for large eps exp(eps) overflows while Phi(b) underflows
    return float(ndtr(a) - np.exp(eps + log_ndtr(b)))


class Gaussian(_Additive):
    """Gaussian mechanism: noise N(0, sigma^2), (epsilon, delta)-DP for a query of l2 sensitivity
    ``sensitivity``.

    ``calibration="analytic"`` (default) is Balle & Wang's analytic Gaussian mechanism: the
    smallest sigma with ``analytic_gaussian_delta(sigma) <= delta``; exact (necessary and
    sufficient) for every epsilon > 0. ``calibration="classical"`` is the textbook
    sigma = D sqrt(2 ln(1.25/delta)) / epsilon (Dwork & Roth Thm A.1), which is only proven for
    epsilon < 1 and so is refused otherwise.
    """

    CALIBRATIONS = ("analytic", "classical")

    def __init__(self, *, epsilon: float, delta: float, sensitivity: float,
                 calibration: str = "analytic") -> None:
        self.epsilon = _positive("epsilon", epsilon)
        self.delta = _real("delta", delta)
        if not 0.0 < self.delta < 1.0:
            raise ValueError(f"delta must be in (0, 1), got {delta!r}")
        self.sensitivity = _positive("sensitivity", sensitivity)
        if calibration not in self.CALIBRATIONS:
            raise ValueError(f"calibration must be one of {self.CALIBRATIONS}, got {calibration!r}")
        self.calibration = calibration
        if calibration == "classical":
            if self.epsilon >= 1.0:
                raise ValueError("the classical Gaussian calibration is only valid for epsilon < 1; "
                                 "use calibration='analytic'")
            self.sigma = self.classical_sigma(epsilon=self.epsilon, delta=self.delta,
                                              sensitivity=self.sensitivity)
        else:
            self.sigma = self._analytic_sigma()

    def __repr__(self) -> str:
        return (f"Gaussian(epsilon={self.epsilon!r}, delta={self.delta!r}, "
                f"sensitivity={self.sensitivity!r}, calibration={self.calibration!r})")

    @staticmethod
    def classical_sigma(*, epsilon: float, delta: float, sensitivity: float) -> float:
        return sensitivity * math.sqrt(2.0 * math.log(1.25 / delta)) / epsilon

    def _analytic_sigma(self) -> float:
        eps, d, target = self.epsilon, self.sensitivity, self.delta

        def excess(s: float) -> float:
            return analytic_gaussian_delta(s, epsilon=eps, sensitivity=d) - target

        # bracket the root around the classical value (delta(s) is monotone decreasing)
        lo = hi = d * math.sqrt(2.0 * math.log(1.25 / target)) / eps
        while excess(lo) <= 0.0:
            lo /= 2.0
        while excess(hi) > 0.0:
            hi *= 2.0
        # scipy.optimize only where a root is found (as in bounded_laplace): no service calibrates
        # a Gaussian, and the mechanisms' helpers are imported by every one through privacy.ldp
        from scipy.optimize import brentq
        sigma = brentq(excess, lo, hi, xtol=1e-300, rtol=4 * np.finfo(float).eps, maxiter=500)
        # brentq may land a hair on the wrong side; step up until delta(sigma) <= delta holds
        for _ in range(64):
            if excess(sigma) <= 0.0:
                break
            sigma = float(np.nextafter(sigma, np.inf))
        return float(sigma)

    @property
    def variance(self) -> float:
        return self.sigma**2

    def pdf(self, x: ArrayLike) -> float | np.ndarray:
        x = np.asarray(x, dtype=float)
        z = x / self.sigma
        return _as_output(np.exp(-0.5 * z * z) / (_SQRT_2PI * self.sigma))

    def cdf(self, x: ArrayLike) -> float | np.ndarray:
        x = np.asarray(x, dtype=float)
        return _as_output(ndtr(x / self.sigma))

    def sample(self, size: int | tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
        return _check_rng(rng).normal(0.0, self.sigma, _size(size))


# ----------------------------------------------------------------------------------------------
# Huber


class Huber(_Additive):
    """Huber mechanism (Gowtham et al. 2022): noise with density kappa_alpha * exp(-rho_alpha(t)),
    rho_alpha the Huber loss (t^2/2 for |t| <= alpha, alpha(|t| - alpha/2) beyond), i.e. a unit
    Gaussian core with exponential tails of rate alpha.

    alpha = epsilon / sensitivity with ``sensitivity`` the l1 sensitivity. rho_alpha is
    alpha-Lipschitz, so the log density ratio of a shift d is at most alpha*||d||_1, with equality
    in the tail: epsilon = alpha * Delta_1 is tight (pure DP). The noise has unit curvature and NO
    scale parameter: alpha alone fixes both the privacy level and the noise level, and the
    variance is always > 1 however large epsilon is.

    At equal epsilon the Huber mechanism adds at least as much noise as Laplace: Laplace uses scale
    b = 1/alpha, and the likelihood ratio huber/laplace ∝ exp(alpha|t| - rho_alpha(t)) is
    non-decreasing in |t|, so |Huber noise| stochastically dominates |Laplace noise| and
    variance(alpha) >= 2/alpha^2 (ratio -> 1 as alpha -> 0). Any accuracy advantage comes from
    the shape, never from adding less noise.
    """

    def __init__(self, *, epsilon: float, sensitivity: float) -> None:
        self.epsilon = _positive("epsilon", epsilon)
        self.sensitivity = _positive("sensitivity", sensitivity)
        self.delta = 0.0
        a = self.alpha = self.epsilon / self.sensitivity
        self._tail_w = math.exp(-0.5 * a * a)  # e^{-alpha^2/2}
        self._core_mass = _SQRT_2PI * math.erf(a / _SQRT2)  # integral of e^{-t^2/2} on [-a, a]
        # Z_alpha = 1/kappa_alpha: core mass plus two exponential tails of mass e^{-a^2/2}/a each
        self.normaliser = self._core_mass + 2.0 * self._tail_w / a
        self.kappa = 1.0 / self.normaliser
        # y1 = F(-alpha) = mass of one tail; y2 = F(alpha) = 1 - y1
        self.y1 = self._tail_w / (a * self.normaliser)
        self.y2 = 1.0 - self.y1
        self.core_probability = self._core_mass / self.normaliser  # p_c of the mixture sampler
        self._phi_minus_a = float(ndtr(-a))

    def __repr__(self) -> str:
        return f"Huber(epsilon={self.epsilon!r}, sensitivity={self.sensitivity!r})"

    @staticmethod
    def rho(t: ArrayLike, alpha: float) -> np.ndarray:
        """Huber loss rho_alpha(t)."""
        t = np.abs(np.asarray(t, dtype=float))
        return np.where(t <= alpha, 0.5 * t * t, alpha * (t - 0.5 * alpha))

    @property
    def variance(self) -> float:
        """Closed form ([T] eq. 4.5): (4(1 + a^-2) e^{-a^2/2} + a sqrt(2 pi) erf(a/sqrt2)) /
        (2 e^{-a^2/2} + a sqrt(2 pi) erf(a/sqrt2))."""
        a, w, core = self.alpha, self._tail_w, self._core_mass
        return (4.0 * (1.0 + 1.0 / (a * a)) * w + a * core) / (2.0 * w + a * core)

    def pdf(self, x: ArrayLike) -> float | np.ndarray:
        x = np.asarray(x, dtype=float)
        return _as_output(self.kappa * np.exp(-self.rho(x, self.alpha)))

    def cdf(self, x: ArrayLike) -> float | np.ndarray:
        """Exact CDF ([T] eq. 4.3), evaluated on the lower half and mirrored (F(x) = 1 - F(-x))
        so that both tails keep full relative precision."""
        x = np.asarray(x, dtype=float)
        a, z = self.alpha, self.normaliser
        t = -np.abs(x)  # <= 0
        with np.errstate(under="ignore"):
            # x <= -a: e^{a(x + a/2)}/(a Z), written as e^{-a^2/2} e^{a(x+a)} to avoid overflow
            tail = self._tail_w * np.exp(a * (np.minimum(t, -a) + a)) / (a * z)
        core = self.y1 + _SQRT_2PI / z * (ndtr(t) - self._phi_minus_a)
        lower = np.where(t <= -a, tail, core)
        return _as_output(np.where(x <= 0, lower, 1.0 - lower))

    def ppf(self, y: ArrayLike) -> float | np.ndarray:
        """Inverse CDF ([T] eq. 4.4 / B.25) with the third branch CORRECTED.

        The thesis prints F^-1(y) = (1/a) log(2e^{-a^2/2} + a sqrt(2pi) erf(a/sqrt2) - y a Z) + a/2
        for y > y2. That has a sign error (log e^{-a(x - a/2)} = -a(x - a/2)): it returns 0 instead
        of alpha at y2 and tends to -inf as y -> 1. The correct branch is
        F^-1(y) = a/2 - (1/a) log(a Z (1 - y)) = -F^-1(1 - y).
        """
        y = np.asarray(y, dtype=float)
        a, z = self.alpha, self.normaliser
        out = np.full(y.shape, np.nan)
        with np.errstate(divide="ignore", invalid="ignore"):
            # branch 1, y in [0, y1): lower exponential tail
            low = (y >= 0.0) & (y < self.y1)
            out = np.where(low, np.log(a * z * y) / a - 0.5 * a, out)
            # branch 2, y in [y1, y2]: Gaussian core, Phi(x) = Phi(-a) + (y - y1) Z / sqrt(2 pi).
            # ndtri on the lower half and mirrored (instead of the thesis's erf^-1 series), since
            # erf^-1 near +-1 loses all precision for large alpha
            mid = (y >= self.y1) & (y <= self.y2)
            q = np.minimum(y, 1.0 - y)
            core = ndtri(self._phi_minus_a + (q - self.y1) * z / _SQRT_2PI)
            out = np.where(mid, np.where(y <= 0.5, core, -core), out)
            # branch 3, y in (y2, 1]: CORRECTED upper tail (see docstring), = -F^-1(1 - y)
            high = (y > self.y2) & (y <= 1.0)
            out = np.where(high, 0.5 * a - np.log(a * z * (1.0 - y)) / a, out)
        return _as_output(out)

    def sample(self, size: int | tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
        """Exact mixture sampler: with probability p_c a standard normal truncated to
        [-alpha, alpha], otherwise sign * (alpha + Exp(rate alpha)) (each tail is an exponential
        of rate alpha beyond alpha, with mass e^{-a^2/2}/(a Z))."""
        rng = _check_rng(rng)
        shape = _size(size)
        a = self.alpha
        is_core = rng.random(shape) < self.core_probability
        # |core| is a half-normal truncated to [0, a]: invert Phi on [Phi(-a), 1/2] (lower half,
        # where ndtri is accurate) and negate
        u = rng.random(shape)
        core_mag = -ndtri(self._phi_minus_a + u * (0.5 - self._phi_minus_a))
        tail_mag = a + rng.exponential(1.0 / a, shape)
        sign = np.where(rng.random(shape) < 0.5, -1.0, 1.0)
        return sign * np.where(is_core, core_mag, tail_mag)
