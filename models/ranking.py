"""The served top-N ranking: an online combination of rankers, weighted by their hits.

RMSE-trained scores rank an obscure item with a few high ratings first; popularity (the log of an
item's count of ratings so far) ranks what most users like. Which is better, and which blend of the
two, depends on the stream and moves along it, so no constant is chosen here per data set: each
ranker is a blend ``a * z(model score) + b * z(log(1 + count))`` of the two standardised signals
(z: minus the mean, over the standard deviation, over the candidates of one request), for a fixed
grid of (a, b) from the model alone to popularity alone. Every relevant event the caller sees (a
rating >= 4 of an item in the catalogue, scored just before it is learned) is a round of Hedge
(Cesa-Bianchi and Lugosi, "Prediction, Learning, and Games", ch. 2) over the grid: each ranker's
gain is whether it put the item in its top k, discounted by ``forget`` per event, and the weights
are proportional to ``exp(eta * gains)``.

The served ranking is the weighted average of the blends' (a, b): one blend, so serving stays one
vectorised scoring of the catalogue (``combine``), and the served ranker is never far from the grid
ranker with the most recent hits (the blends are ordered along one line, so their average sits
between the leaders).

>>> mix = RankerMix()
>>> model, counts = np.array([3.0, 2.0, 1.0, 0.0]), np.array([0, 1, 5, 100])
>>> [round(x, 3) for x in mix.blend]              # even weights: the middle blend
[0.5, 0.5]
>>> for _ in range(50):                             # popularity keeps finding the item 3
...     mix.update(mix.hits(model, counts, target=3, k=1))
>>> int(np.argmax(mix.scores(model, counts)))
3
"""

from __future__ import annotations

import numpy as np

# (model, popularity) coefficients: the model alone, blends with beta = b / a from 1/4 to 4, and
# popularity alone; a grid of angles rather than a tuned beta
GRID = ((1.0, 0.0), (0.8, 0.2), (2 / 3, 1 / 3), (0.5, 0.5), (1 / 3, 2 / 3), (0.2, 0.8), (0.0, 1.0))


def standardised(x: np.ndarray) -> np.ndarray:
    """(x - mean) / std over the array (zeros when it is constant or empty).

    >>> standardised(np.array([1.0, 3.0])).tolist()
    [-1.0, 1.0]
    >>> standardised(np.array([2.0, 2.0])).tolist()
    [0.0, 0.0]
    """
    x = np.asarray(x, dtype=np.float64)
    if not len(x):
        return x
    sd = x.std()
    return (x - x.mean()) / sd if sd > 0 else np.zeros_like(x)


def log_popularity(counts: np.ndarray) -> np.ndarray:
    """log(1 + count): a count's value as evidence grows with its order of magnitude."""
    return np.log1p(np.maximum(np.asarray(counts, dtype=np.float64), 0.0))


class RankerMix:
    """Hedge over the blends of ``grid`` (pairs (a, b) of the model's and popularity's weight).

    ``eta``: the weights' sharpness per discounted hit; ``forget``: the per-event discount (about
    1 / (1 - forget) recent events count, so the mix follows a stream whose best blend moves)."""

    def __init__(self, grid=GRID, eta: float = 0.5, forget: float = 0.995):
        self.grid = np.asarray(grid, dtype=np.float64)
        if self.grid.ndim != 2 or self.grid.shape[1] != 2 or eta <= 0 or not 0 < forget <= 1:
            raise ValueError("grid must be pairs (a, b), eta positive and forget in (0, 1]")
        self.eta, self.forget = float(eta), float(forget)
        self.gains = np.zeros(len(self.grid))
        self.events = 0

    @property
    def weights(self) -> np.ndarray:
        w = np.exp(self.eta * (self.gains - self.gains.max()))
        return w / w.sum()

    @property
    def blend(self) -> tuple[float, float]:
        """The served (a, b): the blends' weighted average."""
        a, b = self.weights @ self.grid
        return float(a), float(b)

    def scores(self, model: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """The served ranking's scores of candidates (higher first)."""
        return combine(model, log_popularity(counts), *self.blend)

    def hits(self, model: np.ndarray, counts: np.ndarray, target: int, k: int = 10) -> np.ndarray:
        """Each grid ranker's expected hit (ties broken at random) of candidate ``target`` in its
        top k among the candidates."""
        zm, zp = standardised(model), standardised(log_popularity(counts))
        out = np.empty(len(self.grid))
        for j, (a, b) in enumerate(self.grid):
            s = a * zm + b * zp
            greater = np.count_nonzero(s > s[target])
            ties = np.count_nonzero(s == s[target]) - 1
            out[j] = max(0, min(k, greater + ties + 1) - greater) / (ties + 1)
        return out

    def update(self, hits: np.ndarray) -> None:
        """One event: every ranker's hit (0..1) of it."""
        self.gains = self.forget * self.gains + np.asarray(hits, dtype=np.float64)
        self.events += 1

    def state(self) -> dict:
        return {"grid": self.grid.tolist(), "eta": self.eta, "forget": self.forget,
                "gains": self.gains.tolist(), "events": self.events}

    @classmethod
    def from_state(cls, state: dict) -> "RankerMix":
        mix = cls(state["grid"], state["eta"], state["forget"])
        mix.gains, mix.events = np.asarray(state["gains"], dtype=np.float64), int(state["events"])
        return mix


def combine(model: np.ndarray, logpop: np.ndarray, a: float, b: float) -> np.ndarray:
    """``a * z(model) + b * z(logpop)``, up to a positive scale and shift (same ranking): a
    popularity term per candidate can be standardised once per catalogue, the model's per user.

    >>> [int(combine(np.array([1.0, 0.0]), np.array([0.0, 3.0]), a, 1 - a).argmax()) for a in (1, 0)]
    [0, 1]
    """
    return a * standardised(model) + b * standardised(logpop)
