"""Learners that work the same on any rating scale: ratings are mapped affinely onto the scale the
default settings were tuned on (1..5) before a learner sees them, and its predictions mapped back.

The defaults (step sizes, regularisation, start vectors, the mix's forgetting) were chosen on
MovieLens' 1..5 stars; the same learner on -10..10 sees errors five times larger, its L2 weight
five times weaker relative to them, and its step sizes take it elsewhere. Mapping the declared
or learned scale [L, U] onto [1, 5] makes a rating on any scale the same problem, so the RMSE
relative to the scale's span is what it would be on stars. A MovieLens scale (1..5, 0.5..5) is
left alone: its results stay exactly what they were.

>>> m = ScaleMap(-10.0, 10.0); m.inward(np.array([-10.0, 0.0, 10.0])).tolist(), m.outward(np.array([3.0])).tolist()
([1.0, 3.0, 5.0], [0.0])
>>> ScaleMap.for_range((0.5, 5.0)) is None and ScaleMap.for_range((1.0, 5.0)) is None
True
"""

from __future__ import annotations

import numpy as np

TUNED = (1.0, 5.0)                          # the scale the learners' defaults were tuned on
LEFT_ALONE = ((1.0, 5.0), (0.5, 5.0))       # MovieLens' scales: learned as they are


class ScaleMap:
    """r -> 1 + 4 (r - lower) / (upper - lower), and back."""

    def __init__(self, lower: float, upper: float):
        if not upper > lower:
            raise ValueError("a scale needs lower < upper")
        self.lower, self.upper = float(lower), float(upper)
        self.factor = (TUNED[1] - TUNED[0]) / (self.upper - self.lower)

    @classmethod
    def for_range(cls, bounds: tuple[float, float] | None) -> "ScaleMap | None":
        """The map for a file's rating range, or None: no range, or a MovieLens scale."""
        if bounds is None or tuple(map(float, bounds)) in LEFT_ALONE or not bounds[1] > bounds[0]:
            return None
        return cls(*bounds)

    def inward(self, ratings: np.ndarray) -> np.ndarray:
        return TUNED[0] + (np.asarray(ratings, dtype=np.float64) - self.lower) * self.factor

    def outward(self, predictions: np.ndarray) -> np.ndarray:
        return self.lower + (np.asarray(predictions, dtype=np.float64) - TUNED[0]) / self.factor


class ScaleFree:
    """A learner seen through a ScaleMap: ``learn_many`` and ``predict_many`` take and give
    ratings on the file's scale; everything else is the learner's own (its figures, its state)."""

    def __init__(self, learner, scale: ScaleMap):
        self.learner, self.scale = learner, scale

    def learn_many(self, users, items, ratings, **kwargs):
        out = self.learner.learn_many(users, items, self.scale.inward(ratings), **kwargs)
        return None if out is None else self.scale.outward(out)

    def predict_many(self, users, items, *args, **kwargs):
        return self.scale.outward(self.learner.predict_many(users, items, *args, **kwargs))

    def noisy_step(self, users, items, ratings, **kwargs):
        out = self.learner.noisy_step(users, items, self.scale.inward(ratings), **kwargs)
        return None if out is None else self.scale.outward(out)

    def __getattr__(self, name: str):
        return getattr(self.learner, name)
