"""The served top-N ranking: an online combination of rankers, weighted by their hits.

RMSE-trained scores rank an obscure item with a few high ratings first; popularity ranks what most
users like, and recent popularity what they like now. Which is better, and which blend, depends on
the stream and moves along it, so no constant is chosen here per data set. The signals are the
model's score and the log of an item's count of ratings, all-time and discounted with half-lives
on a geometric grid (``DECAYS``: ~700 to ~23,000 ratings), each standardised over the candidates of
one request (z: minus the mean, over the standard deviation). A ranker is a blend of them: each
signal alone, and the model with each popularity at weights 0.8/0.2 ... 0.2/0.8 (``grid``). Every
relevant event the caller sees (a rating >= 4 of an item in the catalogue, scored just before it is
learned) is a round of Hedge (Cesa-Bianchi and Lugosi, "Prediction, Learning, and Games", ch. 2)
over the rankers: each one's gain is whether it put the item in its top k, discounted by ``forget``
per event, and the weights are proportional to ``exp(eta * gains)``.

The served ranking is the weighted average of the rankers' coefficients: itself one blend, so
serving stays one vectorised scoring of the catalogue plus a popularity term read once per refresh.
On ML-100k and ml-latest-small (2,000 sampled events each) it is above all-time popularity at
recall@10 with the defaults here (``replay DATA --topn``; docs/cli.md, "Curve, top-N and drift").

>>> mix = RankerMix(decays=())                    # the model and all-time popularity only
>>> model, counts = np.array([3.0, 2.0, 1.0, 0.0]), np.array([0, 1, 5, 100])
>>> for _ in range(50):                             # popularity keeps finding the item 3
...     mix.update(mix.hits(model, [counts], target=3, k=1))
>>> int(np.argmax(mix.scores(model, [counts])))
3
"""

from __future__ import annotations

import numpy as np

# per-rating discounts of the recent-popularity signals: half-lives ~700, 2,300, 7,000, 23,000
DECAYS = (0.999, 0.9997, 0.9999, 0.99997)
SHARES = (0.8, 2 / 3, 0.5, 1 / 3, 0.2)   # the model's share in its blends with one popularity


def grid(signals: int) -> np.ndarray:
    """Rankers as rows of coefficients over ``signals`` signals (the model's first): each signal
    alone, then the model blended with each other one at ``SHARES``.

    >>> grid(2).round(2).tolist()[:3]
    [[1.0, 0.0], [0.0, 1.0], [0.8, 0.2]]
    """
    rows = list(np.eye(signals))
    for j in range(1, signals):
        for share in SHARES:
            row = np.zeros(signals)
            row[0], row[j] = share, 1 - share
            rows.append(row)
    return np.array(rows)


def standardised(x: np.ndarray) -> np.ndarray:
    """(x - mean) / std over the last axis (zeros where it is constant).

    >>> standardised(np.array([1.0, 3.0])).tolist()
    [-1.0, 1.0]
    >>> standardised(np.array([2.0, 2.0])).tolist()
    [0.0, 0.0]
    """
    x = np.asarray(x, dtype=np.float64)
    if not x.shape[-1]:
        return x
    sd = x.std(axis=-1, keepdims=True)
    return np.divide(x - x.mean(axis=-1, keepdims=True), sd, out=np.zeros_like(x), where=sd > 0)


def popularity_signals(counts) -> np.ndarray:
    """log(1 + count) of each count vector (rows): evidence grows with a count's order of magnitude."""
    return np.log1p(np.maximum(np.asarray(counts, dtype=np.float64), 0.0))


class RecentCounts:
    """Counts of ratings per row of a growing catalogue discounted by each of ``decays`` per rating
    (rows: one per decay). ``add(rows, n)``: ``n`` ratings were learned, those in ``rows`` (row
    numbers, repeats counted, or with ``weights``) among them; all of them count as the latest.

    >>> recent = RecentCounts((0.5,))
    >>> recent.add(np.array([0, 0, 1]), 3); recent.add(np.array([1]), 1)
    >>> recent.counts.tolist()
    [[1.0, 1.5]]
    """

    def __init__(self, decays=DECAYS):
        self.decays = np.asarray(decays, dtype=np.float64)
        self.counts = np.zeros((len(self.decays), 0))

    def add(self, rows: np.ndarray, n: int, weights: np.ndarray | None = None) -> None:
        size = int(rows.max()) + 1 if len(rows) else 0
        if size > self.counts.shape[1]:
            self.counts = np.pad(self.counts, ((0, 0), (0, size - self.counts.shape[1])))
        self.counts *= (self.decays ** n)[:, None]
        added = np.bincount(rows, weights, minlength=self.counts.shape[1])
        self.counts += added[None, :]


class RankerMix:
    """Hedge over rankers (``grid``: rows of coefficients over the model's score, all-time
    popularity and one recent popularity per ``decays``; default ``grid(2 + len(decays))``).

    ``eta``: the weights' sharpness per discounted hit; ``forget``: the per-event discount (about
    1 / (1 - forget) recent events count, so the mix follows a stream whose best ranker moves)."""

    def __init__(self, decays=DECAYS, rankers: np.ndarray | None = None, eta: float = 0.5,
                 forget: float = 0.995):
        self.decays = tuple(float(d) for d in decays)
        signals = 2 + len(self.decays)
        self.grid = np.asarray(grid(signals) if rankers is None else rankers, dtype=np.float64)
        if self.grid.ndim != 2 or self.grid.shape[1] != signals or eta <= 0 or not 0 < forget <= 1:
            raise ValueError("rankers must be rows of one coefficient per signal, eta positive "
                             "and forget in (0, 1]")
        self.eta, self.forget = float(eta), float(forget)
        self.gains = np.zeros(len(self.grid))
        self.events = 0

    @property
    def weights(self) -> np.ndarray:
        w = np.exp(self.eta * (self.gains - self.gains.max()))
        return w / w.sum()

    @property
    def blend(self) -> np.ndarray:
        """The served ranker's coefficients: the rankers' weighted average."""
        return self.weights @ self.grid

    def popularity_term(self, counts) -> np.ndarray:
        """The served blend's popularity part of the score of candidates whose counts (all-time,
        then one row per decay) are given: what serving reads once per refresh."""
        return self.blend[1:] @ standardised(popularity_signals(counts))

    def scores(self, model: np.ndarray, counts) -> np.ndarray:
        """The served ranking's scores of candidates (higher first)."""
        return self.blend[0] * standardised(model) + self.popularity_term(counts)

    def hits(self, model: np.ndarray, counts, target: int, k: int = 10) -> np.ndarray:
        """Each ranker's expected hit (ties broken at random) of candidate ``target`` in its top k
        among the candidates."""
        signals = np.vstack([standardised(model), standardised(popularity_signals(counts))])
        scores = self.grid @ signals
        at = scores[:, target:target + 1]
        greater = np.count_nonzero(scores > at, axis=1)
        ties = np.count_nonzero(scores == at, axis=1) - 1
        return np.maximum(0, np.minimum(k, greater + ties + 1) - greater) / (ties + 1)

    def update(self, hits: np.ndarray) -> None:
        """One event: every ranker's hit (0..1) of it."""
        self.gains = self.forget * self.gains + np.asarray(hits, dtype=np.float64)
        self.events += 1
