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

from sketchrec.privacy.mechanisms import BoundedLaplace

HEADER = "sketchrec-ldp"  # Kafka header a producer sets on every perturbed message


class DeviceRandomiser:
    """What a rating device runs: ``perturb`` clamps each rating into [lower, upper] and draws
    its Bounded Laplace release (exact inverse-CDF sampling)."""

    def __init__(self, epsilon: float, lower: float, upper: float, seed: int | None = None):
        self.mechanism = BoundedLaplace(epsilon=epsilon, lower=lower, upper=upper)
        self.epsilon, self.lower, self.upper = float(epsilon), float(lower), float(upper)
        self.rng = np.random.default_rng(seed)

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
