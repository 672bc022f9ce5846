"""The mechanisms and accounting of the joint-DP modes: private ALS and its baseline.

What is released (and covered): the global mean, the item biases, the item factors and the one
bit "factors or baseline". Each is post-processing of Gaussian releases (Laplace for the one-cell
releases at rating level) of per-item sufficient statistics, clipped per contribution; nothing
else of the data leaves the trainer. Each user's own offset and vector are solved from the
released item side and that user's OWN ratings and answer only that user: joint DP (Kearns et
al. 2014; Chien et al. 2021), which holds only if the endpoint answers ``/recommend?user=U`` to U alone (``privacy.access``; docs/privacy/joint.md).

Budget. Every release's noise multiplier (std / L2 sensitivity; Laplace: scale / L1 sensitivity)
is recorded in a ``PrivacyLedger``. A Gaussian of multiplier z has Renyi DP alpha / (2 z^2) at every
order, so a composition costs exactly what one Gaussian of multiplier (sum 1/z_k^2)^(-1/2) costs.
``Budget`` calibrates that one multiplier to the target (epsilon, delta) with dp-accounting, then
splits its 1/z^2 among the stages by fixed public shares: the ledger's RDP epsilon equals the
target (to dp-accounting's calibration tolerance).

Sensitivities (in the scaled units of each release; see ``sensitivity``). The ledger's relation
is add/remove; unit "user" (a user and all their ratings) or "rating".

>>> b = Budget.calibrate(1.0, 1e-5, iterations=4)
>>> ledger = PrivacyLedger("user", 1e-5, b.accountant); b.record(ledger)
>>> abs(ledger.epsilon() - 1.0) < 2e-3
True
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from sketchrec.privacy.accounting import (GaussianSteps, PrivacyLedger, calibrate_noise, epsilon_of,
                                          neighbouring, pld_epsilon, rdp_epsilons)

# public splits of the budget (of 1/z^2, or of epsilon for the Laplace stages), tuned on ML-100k's
# training part; the baseline has no per-user offsets to absorb an error in the mean
SHARES = {"mean": 0.02, "biases": 0.35, "choice": 0.03, "factors": 0.6}
BASELINE_SHARES = {"mean": 0.2, "biases": 0.8, "choice": 0.0, "factors": 0.0}


def sensitivity(stage: str, unit: str, cap: int) -> float:
    """L2 sensitivity of one release, in its scaled units, for one ``unit`` added or removed.

    - ``mean``: the global (sum of clipped centred ratings / clip, count): a user moves both
      by at most ``cap``: sqrt(2) cap; a rating: sqrt(2).
    - ``biases``: per item (sum of clipped centred ratings / clip, count). A user touches at most
      ``cap`` items, each by at most (1, 1): sqrt(2 cap). A rating (no cap at rating level):
      one item by (1, 1): sqrt(2).
    - ``factors``: per item (upper triangle of sum u u^T, sum of clipped residual * u / clip),
      ||u|| <= 1. A user: each of <= cap items by at most (1, 1): sqrt(2 cap). A rating changes
      its user's vector, so every item of that user moves, by at most ||u u^T - u' u'^T||_F^2 <=
      2 and ||x u - x' u'||^2 <= 4; and the kept subset (the cap lowest random priorities,
      fixed per rating) swaps at most one item: sqrt(6 (cap + 1)).
    - ``choice``: the sum of per-user clipped error differences in [-CHOICE_CLIP, CHOICE_CLIP]:
      CHOICE_CLIP (user), 2 CHOICE_CLIP (rating: the user's term moves across its range).
    - ``choice_ratings``: the sum of per-rating clipped error differences (a stream, where users
      span windows): CHOICE_CLIP (rating), cap CHOICE_CLIP (user: at most cap terms).

    Replace-one neighbours (a stream pass, ``models.private_fallback``): twice these (triangle
    inequality: a removal then an addition), the ``factor`` of ``stage_noise``.
    """
    table = {("mean", "user"): math.sqrt(2) * cap, ("mean", "rating"): math.sqrt(2.0),
             ("biases", "user"): math.sqrt(2 * cap), ("biases", "rating"): math.sqrt(2.0),
             ("factors", "user"): math.sqrt(2 * cap), ("factors", "rating"): math.sqrt(6 * (cap + 1)),
             ("choice", "user"): CHOICE_CLIP, ("choice", "rating"): 2 * CHOICE_CLIP,
             ("choice_ratings", "user"): CHOICE_CLIP * cap, ("choice_ratings", "rating"): CHOICE_CLIP}
    return table[(stage, unit)]


LAPLACE_STAGES = ("mean", "biases", "choice")
CHOICE_CLIP = 0.25  # per-user mean squared-error difference, clipped (typical |d| ~ 0.1)
CHOICE_MARGIN = 3.0  # fall back only when the noisy sum is below -3 noise std


@dataclass(frozen=True)
class Budget:
    """Noise multipliers of every release: the global mean, the item bias statistics, one per ALS
    iteration of the factor statistics, the choice (factors or baseline).

    Gaussian (``laplace`` False): std / L2 sensitivity, shares of 1/z^2, RDP accounting (exact
    for compositions of Gaussians). Rating level (``laplace`` True): one rating touches one cell
    of the mean, bias and choice releases, where Laplace noise (scale / L1 sensitivity = 1 /
    epsilon_k) is about half the Gaussian's at epsilon ~ 1; those stages split the shares of
    epsilon not given to the factors, whose Gaussian multiplier is then calibrated so that the
    PLD-accounted composition meets the target.
    """

    mean: float
    biases: float
    factors: float
    choice: float
    iterations: int
    laplace: bool = False

    @property
    def accountant(self) -> str:
        return "pld" if self.laplace else "rdp"

    @classmethod
    def calibrate(cls, epsilon: float, delta: float, iterations: int,
                  shares: dict | None = None, laplace: bool = False) -> "Budget":
        shares = tuple(sorted((SHARES if shares is None else shares).items()))
        return _calibrated(cls, float(epsilon), float(delta), int(iterations), shares, bool(laplace))

    @classmethod
    def _calibrate(cls, epsilon: float, delta: float, iterations: int, shares: tuple,
                   laplace: bool) -> "Budget":
        shares = dict(shares)
        if iterations == 0:  # no factor model: its share goes to the biases
            shares = {**shares, "biases": shares["biases"] + shares["factors"], "factors": 0.0}
        if laplace:
            rest = sum(shares[k] for k in LAPLACE_STAGES)
            pure = epsilon * (rest if iterations else 1.0)
            lap = {k: (rest / (pure * shares[k]) if shares[k] > 0 else math.inf) for k in LAPLACE_STAGES}
            z = math.inf
            if iterations:
                z = _calibrate_after([GaussianSteps(v, mechanism="laplace") for v in lap.values()
                                      if math.isfinite(v)], epsilon, delta, iterations)
            return cls(lap["mean"], lap["biases"], z, lap["choice"], iterations, True)
        z = calibrate_noise(epsilon, delta)  # one Gaussian worth the whole budget

        def mult(share, count=1):
            return z * math.sqrt(count / share) if share > 0 else math.inf
        return cls(mult(shares["mean"]), mult(shares["biases"]), mult(shares["factors"], max(iterations, 1)),
                   mult(shares["choice"]), iterations)

    def mechanism(self, stage: str) -> str:
        return "laplace" if self.laplace and stage in LAPLACE_STAGES else "gaussian"

    def record(self, ledger: PrivacyLedger) -> None:
        """Charge every release to the ledger (add/remove relation)."""
        for stage in ("mean", "biases", "factors", "choice"):
            mult, count = getattr(self, stage), self.iterations if stage == "factors" else 1
            if math.isfinite(mult) and count:
                ledger.record(mult, count=count, mechanism=self.mechanism(stage))


@functools.lru_cache(maxsize=256)
def _calibrated(cls, *args) -> Budget:  # the same plan is calibrated once per process
    return cls._calibrate(*args)


def _calibrate_after(fixed: list, epsilon: float, delta: float, count: int,
                     sampling_rate: float = 1.0, accountant: str = "pld") -> float:
    """The smallest Gaussian multiplier (to 0.1 %) whose ``count`` releases (Poisson-sampled at
    ``sampling_rate``) after ``fixed`` keep the epsilon within the target: a geometric bisection
    (dp-accounting's own calibration wanders into tiny multipliers whose PLD is very slow to build).

    The answer is the high end of the bisection's last bracket (lo, hi], the one holding the
    threshold. Cheaper figures find that bracket, the accountant's verdicts on its two ends then
    settle every step of the bisection: the bisection's own answer, its epsilon within the target
    by the ledger's figure, at about two of the accountant's evaluations instead of a dozen. A
    wrong guess costs evaluations only, never the answer.
    """
    def steps(z):
        return fixed + [GaussianSteps(z, sampling_rate, count)]

    verdicts = _Verdicts(lambda z: epsilon_of(steps(z), delta, accountant) > epsilon)
    if accountant == "rdp":
        _rdp_settle(steps, epsilon, delta, verdicts)
    else:  # a coarser discretisation: about ten times cheaper, within ~1e-5 of the fine one here
        lo, hi = _bracket(lambda z: z < GUESS_CEILING and pld_epsilon(steps(z), delta, 1e-3) > epsilon)
        verdicts(hi)
        if lo != _START[0]:  # the start's low end is never evaluated by the bisection
            verdicts(lo)
    return _bracket(verdicts)[1]


_START = (0.25, 1.0)
# where guesses stop (noise a million times the sensitivity): a guess that cannot reach the target
# below it leaves the rest to the accountant
GUESS_CEILING = 4.0 ** 10


def _bracket(too_little, ratio: float = 1.001) -> tuple[float, float]:
    """The geometric bisection's last bracket (lo, hi], hi / lo <= ``ratio``, for the verdict
    ``too_little(z)`` (epsilon over the target), false above a threshold and true below it."""
    lo, hi = _START
    while too_little(hi):
        lo, hi = hi, hi * 4
    while hi / lo > ratio:
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if too_little(mid) else (lo, mid)
    return lo, hi


class _Verdicts:
    """The accountant's verdicts, each multiplier evaluated once: at or below a multiplier found
    too little is too little, at or above one found enough is enough (more noise never costs
    more epsilon)."""

    def __init__(self, too_little):
        self.too_little, self.low, self.high = too_little, 0.0, math.inf

    def known(self, z: float) -> bool:
        return z <= self.low or z >= self.high

    def record(self, z: float, too_little: bool) -> bool:
        if too_little:
            self.low = max(self.low, z)
        else:
            self.high = min(self.high, z)
        return too_little

    def __call__(self, z: float) -> bool:
        return z <= self.low if self.known(z) else self.record(z, self.too_little(z))


# The RDP accountant's epsilon is the least of its 156 orders' figures, each order computed
# alone: a bracket at a few orders costs a few 156ths of an evaluation, and what is enough at a
# subset of the orders is enough at all of them. First COARSE_ORDERS (a subset of the defaults),
# to 1 %; then the BEST orders of the multiplier nearest the threshold evaluated at every order.
COARSE_ORDERS = (2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 128)
BEST = 6


def _rdp_settle(steps, epsilon: float, delta: float, verdicts: _Verdicts) -> None:
    """Give ``verdicts`` what settles the bisection: its last bracket found at subsets of the RDP
    orders (its high end is enough), its low end evaluated at every order. When that is enough
    too, the bracket is found again at the orders with the least epsilon there."""
    def at(orders):
        def too_little(z):
            if verdicts.known(z):
                return z <= verdicts.low
            if z >= GUESS_CEILING:   # past where guesses stop: the accountant's own verdict, never
                return verdicts(z)   # a subset's unevaluated "enough" (its bracket end is recorded)
            return min(rdp_epsilons(steps(z), delta, orders).values(), default=0.0) > epsilon
        return too_little

    def every_order(z):  # the accountant's verdict, and the orders with the least epsilon at z
        figures = rdp_epsilons(steps(z), delta)
        verdicts.record(z, min(figures.values(), default=0.0) > epsilon)
        return sorted(figures, key=figures.get)[:BEST]

    orders = every_order(_bracket(at(COARSE_ORDERS), 1.01)[1])
    for _ in range(3):
        lo, hi = _bracket(at(orders))
        verdicts.record(hi, False)
        if lo == _START[0] or lo <= verdicts.low:
            return
        orders = every_order(lo)
        if lo <= verdicts.low:
            return


def l1_sensitivity(stage: str) -> float:
    """L1 sensitivity of the Laplace releases (rating level): one rating moves one (sum, count)
    cell by (1, 1); the choice's sum by 2 CHOICE_CLIP."""
    return 2 * CHOICE_CLIP if stage == "choice" else 2.0


def stage_noise(budget: Budget | None, stage: str, unit: str, cap: int, factor: float = 1.0,
                terms: str | None = None):
    """(noise function of a shape and a generator, its std) for one release; none without budget.
    ``factor`` scales the sensitivity (2: replace-one neighbours); ``terms`` names the sensitivity
    when it differs from the stage's (the stream's per-rating choice, "choice_ratings")."""
    if budget is None:
        return (lambda shape, rng: np.zeros(shape)), 0.0
    if budget.mechanism(stage) == "laplace":
        scale = getattr(budget, stage) * l1_sensitivity(stage) * factor
        return (lambda shape, rng: rng.laplace(0.0, scale, shape)), math.sqrt(2) * scale
    std = getattr(budget, stage) * sensitivity(terms or stage, unit, cap) * factor
    return (lambda shape, rng: gaussian(shape, std, rng)), std


def gaussian(shape, std: float, rng: np.random.Generator) -> np.ndarray:
    """Gaussian noise of this std (0 when std is 0: the non-private reference)."""
    return std * rng.standard_normal(shape) if std > 0 else np.zeros(shape)


def symmetric_noise(n: int, d: int, std: float, rng: np.random.Generator) -> np.ndarray:
    """(n, d, d) noise: i.i.d. on the upper triangle (with the diagonal), mirrored below — the
    release is the upper triangle, whose change is bounded by the full matrix's."""
    upper = np.triu(gaussian((n, d, d), std, rng))
    return upper + np.triu(upper, 1).transpose(0, 2, 1)


def noisy_choice(differences: np.ndarray, noise, std: float,
                 rng: np.random.Generator) -> tuple[bool, float]:
    """Whether to keep the joint model: a one-sided test on the noisy sum of per-user error
    differences (baseline minus joint model, each clipped to +-CHOICE_CLIP). Fall back only when
    the sum is below -CHOICE_MARGIN noise std — clear evidence that the baseline is better (a
    noise-driven fallback costs far more than a small loss would). Returns (keep, noisy sum)."""
    total = float(np.clip(differences, -CHOICE_CLIP, CHOICE_CLIP).sum() + noise((), rng))
    return keeps_factors(total, std), total


def keeps_factors(noisy_sum: float, std: float, margin: float = CHOICE_MARGIN) -> bool:
    """The one-sided test on a released noisy sum of (baseline minus model) error differences of
    noise std ``std``: keep the factor model unless the sum is below -margin std (a stream, which
    decides again at every window, asks the opposite: evidence for the factor model)."""
    return noisy_sum >= -margin * std


# The DP-SGD modes' fallback (``models.private_fallback``): public shares of the one Gaussian worth
# the whole budget (of 1/z^2) for the baseline's mean and item biases and the choice; DP-SGD gets
# the rest. Chosen before looking at any data: the baseline needs enough to beat a bad factor
# model, DP-SGD loses 1 - sqrt(1 - FALLBACK_SHARE) ~ 9 % of its noise-to-signal.
FALLBACK_SHARES = {"mean": 0.02, "biases": 0.13, "choice": 0.03}
FALLBACK_SHARE = sum(FALLBACK_SHARES.values())


def fallback_budget(z_total: float) -> Budget:
    """The Gaussian multipliers of the fallback's releases (mean, item biases, choice) when the
    whole budget is worth one Gaussian of multiplier ``z_total``: z_total / sqrt(share) each.

    >>> b = fallback_budget(2.0)
    >>> round(b.biases, 4), b.factors, b.iterations
    (5.547, inf, 0)
    """
    def mult(stage):
        return z_total / math.sqrt(FALLBACK_SHARES[stage]) if z_total > 0 else math.inf
    return Budget(mult("mean"), mult("biases"), math.inf, mult("choice"), 0)


def fallback_steps(budget: Budget) -> list:
    """The fallback's releases as ledger entries (add/remove; for calibrating what is left)."""
    return [GaussianSteps(getattr(budget, k)) for k in ("mean", "biases", "choice")
            if math.isfinite(getattr(budget, k))]


def calibrate_epochs(epsilon: float, delta: float, sampling_rate: float, steps: int,
                     fixed: list) -> float:
    """The DP-SGD epoch plan's multiplier: ``steps`` Poisson-sampled Gaussian steps that, composed
    with the ``fixed`` releases (the fallback's), cost ``epsilon`` at ``delta`` (RDP, as the
    DP-SGD ledger)."""
    return _epochs_calibrated(float(epsilon), float(delta), float(sampling_rate), int(steps), tuple(fixed))


@functools.lru_cache(maxsize=256)
def _epochs_calibrated(epsilon: float, delta: float, sampling_rate: float, steps: int,
                       fixed: tuple) -> float:  # a plan of the same public figures: once per process
    return _calibrate_after(list(fixed), epsilon, delta, steps, sampling_rate, "rdp")


FALLBACK = "private baseline (the factor model would lose: fallback chosen by a DP comparison)"


def joint_figures(ledger: PrivacyLedger, mode: str, serving: str, fallback: bool,
                  void: str | None = None, extra: dict | None = None) -> dict:
    """What /privacy and `replay --json` report for a joint-DP model; ``serving``: which model
    answers, ``fallback``: whether that is the baseline in place of the factor model."""
    eps = ledger.epsilon()
    label, phrase = neighbouring(ledger)
    guarantee = (f"({eps:.4g}, {ledger.delta:g})-joint-DP for {phrase}: the release (global mean, "
                 "item biases, item factors, the fallback bit) is DP by "
                 f"{ledger.accountant.upper()} accounting over every release; each user's offset "
                 "and vector are solved from the release and that user's own ratings and answer "
                 "that user only (the endpoint must enforce it: docs/privacy/joint.md); noise from "
                 "fresh secret entropy; the rating range and item catalogue are public")
    if void:
        guarantee = f"none: {void} (the accountant alone would say {eps:.4g})"
    return {"mode": mode, "epsilon": math.inf if void else eps, "delta": ledger.delta,
            "privacy_unit": label, "unit": ledger.unit, "neighbouring": ledger.relation,
            "proven_bound": not void, "accountant": ledger.accountant, "joint": True,
            "noisy_releases": ledger.n_releases, "serving": serving, "fallback": fallback,
            "guarantee": guarantee, **(extra or {})}
