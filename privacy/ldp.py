"""Local differential privacy on the device (seed 002): each rating is perturbed with the Bounded
Laplace mechanism before it leaves the producer, so the server never holds a raw rating.

What is protected: the VALUE of each rating — any two values in [lower, upper] are
epsilon-indistinguishable (b = (upper - lower) / epsilon, Theorem 1 of seed 002; a rating outside
the range is clamped into it first). What is not: which items a user rated, and when (the
message itself is sent); a user with n ratings is n*epsilon-LDP for the whole rating vector.

The output is biased toward the centre of the range: E[r* | r] = m(r) with m increasing and
|m(r) - r| largest at the ends (on [1, 5] at epsilon = 1, m(1) = 2.67). A learner fitted to
perturbed ratings predicts about E[m(r)]; ``Debias`` maps a prediction back through m^{-1}
(exact for the mean of one rating, an approximation for an average of several, since m is only
nearly linear), which is post-processing and costs no privacy.
"""

from __future__ import annotations

import numpy as np

from sketchrec.data import FORMAT_RANGES
from sketchrec.privacy.bounded_laplace import BoundedLaplace
from sketchrec.privacy.entropy import DEBUG_NOTE, fresh_generator

HEADER = "sketchrec-ldp"  # Kafka header a producer sets on every perturbed message


class DeviceRandomiser:
    """What a rating device runs: ``perturb`` clamps each rating into [lower, upper] and draws
    its Bounded Laplace release (exact inverse-CDF sampling).

    The noise comes from fresh secret entropy (``privacy.entropy``): whoever could regenerate it
    would subtract it and read every raw rating. ``seed`` is for debugging only: the noise is
    then reproducible by whoever knows the seed, so there is no guarantee (``proven`` False)."""

    def __init__(self, epsilon: float, lower: float, upper: float, seed: int | None = None):
        self.mechanism = BoundedLaplace(epsilon=epsilon, lower=lower, upper=upper)
        self.epsilon, self.lower, self.upper = float(epsilon), float(lower), float(upper)
        self.proven = seed is None
        self.rng = fresh_generator() if seed is None else np.random.default_rng(seed)

    def perturb(self, ratings) -> np.ndarray:
        values = np.clip(np.asarray(ratings, dtype=np.float64), self.lower, self.upper)
        return np.asarray(self.mechanism.randomise(values, self.rng), dtype=np.float64)

    def header(self) -> bytes:
        """The message header value naming the mechanism, so a consumer can report it."""
        return f"BoundedLaplace;epsilon={self.epsilon:g};range={self.lower:g},{self.upper:g}".encode()


class Debias:
    """m^{-1}: a prediction of a perturbed rating mapped back to the rating scale (monotone
    interpolation on a grid of the exact mean function m)."""

    def __init__(self, epsilon: float, lower: float, upper: float, grid: int = 2001):
        mech = BoundedLaplace(epsilon=epsilon, lower=lower, upper=upper)
        self.values = np.linspace(lower, upper, grid)
        self.means = np.array([float(mech.mean(v)) for v in self.values])

    def __call__(self, predictions) -> np.ndarray:
        return np.interp(np.asarray(predictions, dtype=np.float64), self.means, self.values)


def parse_header(value: bytes) -> dict | None:
    """The mechanism a message's ``sketchrec-ldp`` header names, or None if it is malformed."""
    try:
        name, eps, rng = value.decode().split(";")
        lower, upper = (float(x) for x in rng.split("=", 1)[1].split(","))
        return {"mechanism": name, "epsilon": float(eps.split("=", 1)[1]), "range": [lower, upper]}
    except (ValueError, UnicodeDecodeError, IndexError):
        return None


MIXED = {"mechanism": "mixed"}   # an origin whose ratings came under more than one mechanism
MIXED_LINE = ("none claimed as one epsilon: the ratings came perturbed on the device by different "
              "local-DP mechanisms (see the messages' sketchrec-ldp headers), so no single "
              "mechanism covers them all and predictions are not mapped back")


def combine(recorded: dict | None, mechanism: dict | None) -> dict | None:
    """The mechanism an origin records once ``mechanism`` is seen after ``recorded``: the one
    known when they agree (or one is None), else ``MIXED``, never the last one seen (its epsilon
    would be claimed for ratings perturbed under another).

    >>> eight = {"mechanism": "BoundedLaplace", "epsilon": 8.0, "range": [1.0, 5.0]}
    >>> combine(None, eight) == combine(eight, dict(eight)) == combine(eight, None) == eight
    True
    >>> combine(eight, {**eight, "epsilon": 0.5})
    {'mechanism': 'mixed'}
    """
    if recorded is None or mechanism is None or recorded == mechanism:
        return mechanism if recorded is None else recorded
    return dict(MIXED)


# FORMAT_RANGES (sketchrec.data): each format's declared scale; a format without one has no
# default: its range must be declared, never guessed (clamping 0.5 to 1 is a bias)


def declared_range(option: str | tuple | None, fmt: str | None = None) -> tuple[float, float]:
    """The LDP rating range: ``option`` ("L,U" or a pair) if given, else the format's scale.

    >>> declared_range(None, "movielens-csv"), declared_range("0.5,4")
    ((0.5, 5.0), (0.5, 4.0))
    """
    if option is None:
        if fmt not in FORMAT_RANGES:
            raise ValueError(f"the rating range of the {fmt or 'given'} data is not known: declare "
                             "it (--ldp-range L,U)")
        return FORMAT_RANGES[fmt]
    lo, hi = (float(x) for x in (option.split(",") if isinstance(option, str) else option))
    if not lo < hi:
        raise ValueError("the rating range must be L,U with L < U")
    return lo, hi


class LDPSettings:
    """What a local-DP run reports (`replay --ldp-epsilon` JSON, /privacy): ``mode: ldp``, the
    per-rating epsilon and the declared range.

    >>> LDPSettings(1.0, 0.5, 4.0).figures()["range"]
    [0.5, 4.0]
    """

    def __init__(self, epsilon: float, lower: float, upper: float, debug_seed: int | None = None):
        if not epsilon > 0 or not lower < upper:
            raise ValueError("LDP needs epsilon > 0 and lower < upper")
        self.epsilon, self.lower, self.upper = float(epsilon), float(lower), float(upper)
        self.debug_seed = debug_seed   # a simulation's reproducible device noise: no guarantee

    def randomiser(self) -> DeviceRandomiser:
        """The simulated devices' randomiser: fresh secret noise unless ``debug_seed`` is set."""
        return DeviceRandomiser(self.epsilon, self.lower, self.upper, seed=self.debug_seed)

    @classmethod
    def from_mechanism(cls, mech: dict) -> "LDPSettings":
        """From a parsed message header (``parse_header``)."""
        return cls(mech["epsilon"], *mech["range"])

    def figures(self) -> dict:
        guarantee = (f"{self.epsilon:g}-LDP for the value of each rating, clamped into the "
                     f"declared range [{self.lower:g}, {self.upper:g}] on the device; which "
                     "items a user rated, and when, are not protected; a user with n "
                     f"ratings is n*{self.epsilon:g}-LDP for the whole rating vector")
        if self.debug_seed is not None:
            guarantee = f"none: {DEBUG_NOTE}"
        return {"mode": "ldp", "epsilon": self.epsilon if self.debug_seed is None else float("inf"),
                "delta": 0.0, "range": [self.lower, self.upper],
                "privacy_unit": "one rating's value (local, per message)",
                "proven_bound": self.debug_seed is None, "mechanism": "BoundedLaplace",
                "guarantee": guarantee}
