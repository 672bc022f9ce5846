"""The Bounded Laplace mechanism (Holohan et al.): input perturbation on a bounded range, pure
epsilon-DP, with an exact constant-time inverse-CDF sampler. Used for local DP on ratings
(``privacy.ldp``); it shares the validation helpers and the ``pdf``/``cdf``/``sample``/``randomise``
vocabulary of ``privacy.mechanisms`` (whose docstring describes it), but its output distribution
depends on the input value.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike
from scipy.special import expm1, gammainc

from sketchrec.privacy.mechanisms import _as_output, _check_rng, _positive, _real, _size

__all__ = ["BoundedLaplace"]

class BoundedLaplace:
    """Bounded Laplace mechanism (Holohan et al.), used for input perturbation on [lower, upper]:
    the output for input r in [l, u] has the Laplace(r, b) density truncated to [l, u] and
    renormalised by C(r) = 1 - (exp(-(r - l)/b) + exp(-(u - r)/b))/2. Pure epsilon-DP.

    Scale (Theorem 1 of the LDP/BLP digest): the smallest b with b >= Delta / (eps - log DeltaC(b)),
    DeltaC(b) = C(l + Delta)/C(l). For input perturbation ``sensitivity`` defaults to u - l, where
    DeltaC = 1 and b = (u - l)/epsilon exactly; for Delta < u - l, b = Delta/epsilon is NOT
    enough (the renormalisation leaks) and b is found by root-finding.

    The noise depends on the input, so ``pdf``/``cdf``/``sample`` take the input ``value``. The
    mechanism is biased toward the centre of the interval; ``mean(value)`` gives the exact
    expected output. Sampling is exact and constant-time (inverse CDF of the truncated Laplace),
    not rejection sampling, whose running time would depend on the input.
    """

    def __init__(self, *, epsilon: float, lower: float, upper: float,
                 sensitivity: float | None = None) -> None:
        self.epsilon = _positive("epsilon", epsilon)
        self.lower = _real("lower", lower)
        self.upper = _real("upper", upper)
        if not self.lower < self.upper:
            raise ValueError(f"need lower < upper, got lower={lower!r}, upper={upper!r}")
        width = self.upper - self.lower
        if sensitivity is None:
            self.sensitivity = width
        else:
            self.sensitivity = _positive("sensitivity", sensitivity)
            if self.sensitivity > width:
                raise ValueError(f"sensitivity must be <= upper - lower = {width!r}, "
                                 f"got {sensitivity!r}")
        self.delta = 0.0
        self.scale = self._calibrate_scale()

    def __repr__(self) -> str:
        return (f"BoundedLaplace(epsilon={self.epsilon!r}, lower={self.lower!r}, "
                f"upper={self.upper!r}, sensitivity={self.sensitivity!r})")

    # -- calibration -----------------------------------------------------------------------------

    def _c(self, value: ArrayLike, b: float) -> np.ndarray:
        # C(r) = 1 - (e^{-s} + e^{-t})/2 with s = (r-l)/b, t = (u-r)/b, via expm1 so that a wide
        # scale (C close to 0) keeps its relative precision
        s = (np.asarray(value, dtype=float) - self.lower) / b
        t = (self.upper - np.asarray(value, dtype=float)) / b
        return -0.5 * (expm1(-s) + expm1(-t))

    def privacy_loss_bound(self, b: float) -> float:
        """Largest log density ratio between inputs at most ``sensitivity`` apart, at scale b:
        Delta/b + log(C(l + Delta)/C(l)) (Lemma 2)."""
        d = self.sensitivity
        return d / b + math.log(float(self._c(self.lower + d, b)) / float(self._c(self.lower, b)))

    def _calibrate_scale(self) -> float:
        width, d, eps = self.upper - self.lower, self.sensitivity, self.epsilon
        if d == width:
            # C(u) == C(l) by symmetry, DeltaC = 1: Theorem 1 reduces to b = (u - l)/eps
            return width / eps

        def excess(b: float) -> float:
            return self.privacy_loss_bound(b) - eps

        # DeltaC >= 1, so b >= Delta/eps is necessary; the loss tends to 0 as b grows
        lo = hi = d / eps
        while excess(hi) > 0.0:
            hi *= 2.0
        if hi == lo:
            return lo
        # scipy.optimize is imported here only (a costly import at every process start): local DP
        # perturbs the whole range (privacy.ldp), which needs no root, so no local-DP service
        # reaches this (a central-DP service has it already: its accountant, dp-accounting,
        # imports SciPy on the main thread at start, cli.serving.accountant_first)
        from scipy.optimize import brentq
        b = brentq(excess, lo, hi, xtol=1e-300, rtol=4 * np.finfo(float).eps, maxiter=500)
        for _ in range(64):  # make sure the returned scale is on the private side of the root
            if excess(b) <= 0.0:
                break
            b = float(np.nextafter(b, np.inf))
        return float(b)

    # -- distribution of the output ----------------------------------------------------------------

    def _value(self, value: ArrayLike) -> np.ndarray:
        r = np.asarray(value, dtype=float)
        if not np.all((r >= self.lower) & (r <= self.upper)):
            raise ValueError(f"value must lie in [{self.lower}, {self.upper}] (clip it first)")
        return r

    def normaliser(self, value: ArrayLike) -> float | np.ndarray:
        """C(value): the Laplace(value, b) mass inside [lower, upper]."""
        return _as_output(self._c(self._value(value), self.scale))

    def pdf(self, x: ArrayLike, value: ArrayLike) -> float | np.ndarray:
        """Density of the released value at x given the true input ``value``."""
        x = np.asarray(x, dtype=float)
        r = self._value(value)
        b = self.scale
        dens = np.exp(-np.abs(x - r) / b) / (2.0 * b * self._c(r, b))
        inside = (x >= self.lower) & (x <= self.upper)
        return _as_output(np.where(inside, dens, 0.0))

    def cdf(self, x: ArrayLike, value: ArrayLike) -> float | np.ndarray:
        """CDF of the released value at x given the true input ``value``."""
        x = np.asarray(x, dtype=float)
        r = self._value(value)
        b = self.scale
        xc = np.clip(x, self.lower, self.upper)
        # Laplace(r, b) mass in [l, xc], split at r: each half is (1 - e^{-dist/b})/2
        below = 0.5 * (expm1(-(r - np.minimum(xc, r)) / b) - expm1(-(r - self.lower) / b))
        above = -0.5 * expm1(-(np.maximum(xc, r) - r) / b)
        mass = np.where(xc <= r, below, -0.5 * expm1(-(r - self.lower) / b) + above)
        out = np.clip(mass / self._c(r, b), 0.0, 1.0)
        return _as_output(out)

    def mean(self, value: ArrayLike) -> float | np.ndarray:
        """Exact expected output E[M(value)] (shows the bias toward the centre).

        With s = (r - l)/b, t = (u - r)/b and P the regularised lower incomplete gamma function:
        E[noise] = (b/2)(P(2, t) - P(2, s)) / C(r)."""
        r = self._value(value)
        b = self.scale
        s, t = (r - self.lower) / b, (self.upper - r) / b
        shift = 0.5 * b * (gammainc(2, t) - gammainc(2, s)) / self._c(r, b)
        return _as_output(r + shift)

    def variance(self, value: ArrayLike) -> float | np.ndarray:
        """Exact variance of the output: E[noise^2] - E[noise]^2 with
        E[noise^2] = b^2 (P(3, s) + P(3, t)) / C(r)."""
        r = self._value(value)
        b = self.scale
        s, t = (r - self.lower) / b, (self.upper - r) / b
        c = self._c(r, b)
        m1 = 0.5 * b * (gammainc(2, t) - gammainc(2, s)) / c
        m2 = b * b * (gammainc(3, s) + gammainc(3, t)) / c
        return _as_output(m2 - m1 * m1)

    # -- sampling --------------------------------------------------------------------------------

    def randomise(self, value: ArrayLike, rng: np.random.Generator) -> float | np.ndarray:
        """Release each entry of ``value`` (in [lower, upper]) through the mechanism.

        Exact, constant-time inverse-CDF sampling: p ~ U(F(l), F(u)) with F the Laplace(r, b) CDF,
        then r + b ln(2p) for p < 1/2, r - b ln(2(1 - p)) otherwise. Rejection sampling would take
        a number of draws (1/C(r)) that depends on r, which can leak r through timing."""
        rng = _check_rng(rng)
        r = self._value(value)
        b = self.scale
        lo_mass = 0.5 * np.exp(-(r - self.lower) / b)  # F(l)
        hi_mass = 0.5 * np.exp(-(self.upper - r) / b)  # 1 - F(u)
        c = self._c(r, b)
        u = rng.random(r.shape)
        p = lo_mass + u * c  # ~ U(F(l), F(u))
        q = hi_mass + (1.0 - u) * c  # = 1 - p, formed directly so it stays accurate near 0
        with np.errstate(divide="ignore"):
            out = np.where(p < 0.5, r + b * np.log(2.0 * p), r - b * np.log(2.0 * q))
        # rounding can put an endpoint draw a ulp outside the support
        out = np.clip(out, self.lower, self.upper)
        return _as_output(out)

    def sample(self, size: int | tuple[int, ...], rng: np.random.Generator, *,
               value: ArrayLike) -> np.ndarray:
        """Additive noise M(value) - value, ``size`` draws (``value`` broadcast to ``size``)."""
        shape = _size(size)
        r = np.broadcast_to(self._value(value), shape)
        return np.asarray(self.randomise(r, rng), dtype=float) - r
