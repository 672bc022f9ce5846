"""What the thesis-reproduction experiments share: the data, the §4.1.5.1 split with mean
correction, model construction, one training run, and writing the JSON / markdown / PNG outputs."""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sketchrec.data import Ratings, read_ratings
from sketchrec.models import DenseMF, SketchMF
from sketchrec.paths import ml100k
from sketchrec.replay.protocols import rmse_on, train_epochs

SUBSTITUTION = ("ML-100k stands in for the thesis's ML-1M/10M, EachMovie and Netflix, which are not "
                "available here.")


class Steps:
    """An experiment's progress on stderr, one line per fit: a grid of fits runs for minutes.

    >>> steps = Steps("demo", 2, stream=sys.stdout)
    >>> steps("fold 1")   # doctest: +ELLIPSIS
    demo: fit 1/2 (fold 1), ... s
    """

    def __init__(self, name: str, total: int, stream=None):
        self.name, self.total, self.done, self.t0 = name, total, 0, time.perf_counter()
        self.stream = stream

    def __call__(self, what: str) -> None:
        self.done += 1
        print(f"{self.name}: fit {self.done}/{self.total} ({what}), "
              f"{time.perf_counter() - self.t0:.0f} s", file=self.stream or sys.stderr, flush=True)


def load(data: Path | None) -> Ratings:
    """The ratings at ``data``, or ML-100k's (``sketchrec.paths``)."""
    ratings, _ = read_ratings(ml100k(data))
    return ratings


def mean_correct(train: Ratings, *others: Ratings) -> list[Ratings]:
    """Remove the training part's global, user and item means from every part (unseen ids: 0)."""
    mu = train.ratings.mean()

    def means(ids, values):
        keys, inverse = np.unique(ids, return_inverse=True)
        return dict(zip(keys.tolist(), (np.bincount(inverse, values) / np.bincount(inverse)).tolist()))

    user_mean = means(train.users, train.ratings - mu)
    item_mean = means(train.items, train.ratings - mu)

    def correct(part: Ratings) -> Ratings:
        offset = mu + np.array([user_mean.get(u, 0.0) for u in part.users.tolist()]) \
            + np.array([item_mean.get(i, 0.0) for i in part.items.tolist()])
        return Ratings(part.users, part.items, part.ratings - offset, part.timestamps)

    return [correct(p) for p in (train, *others)]


@dataclass
class Split:
    train: Ratings
    validation: Ratings
    test: Ratings


def split_80_10_10(ratings: Ratings, fold: int, corrected: bool = True) -> Split:
    """The thesis's random 80/10/10 split of one fold (seeded by the fold), mean-corrected."""
    perm = np.random.default_rng(fold).permutation(len(ratings))
    n_train, n_val = int(0.8 * len(ratings)), int(0.1 * len(ratings))
    parts = [ratings.take(np.sort(idx)) for idx in
             (perm[:n_train], perm[n_train:n_train + n_val], perm[n_train + n_val:])]
    return Split(*(mean_correct(*parts) if corrected else parts))


def make(kind: str, n: int, dim: int, space_gain: float = 1.0, lr: float = 0.03, reg: float = 0.1,
         seed: int = 0, **extra):
    """``regular`` (dense MF), ``sketch`` (count sketch, k = 4) or ``hashing`` (k = 1), with the
    biases regularised like the vectors, as in the thesis."""
    common = dict(dim=dim, lr=lr, reg=reg, bias_reg=reg, init_std=0.05, seed=seed, **extra)
    if kind == "regular":
        return DenseMF(**common)
    # the thesis's pure count sketch (no heavy-hitter filter, plain SGD) unless told otherwise
    return SketchMF(capacity=n, space_gain=space_gain, depth=4 if kind == "sketch" else 1,
                    **{"heavy_fraction": 0.0, "optimizer": "sgd", **common})


def fit(model, split: Split, epochs: int, seed: int = 0) -> float:
    """Train ``epochs`` epochs on the split's training part; the test RMSE."""
    train_epochs(model, split.train, epochs, seed=seed)
    return rmse_on(model, split.test)


def write(out: Path, stem: str, result: dict, markdown: str, plot) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(result, indent=1, default=float))
    (out / f"{stem}.md").write_text(markdown)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig = plot(plt)
    if fig.get_layout_engine() is None:  # figures with colour bars bring their own (constrained)
        fig.tight_layout()
    fig.savefig(out / f"{stem}.png", dpi=120)
    plt.close(fig)
    return result


def finite(x: float) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)
