"""blp-mog: seed 002 on ML-100k — training ratings perturbed on the device by Bounded Laplace (BLP)
or by Laplace-then-clamp (ISGD's perturbation), for eps in {0.1, 0.5, 1, 1.6, 3}; then MoG-MF
(EM over a zero-mean Gaussian mixture of the noise, precision-weighted ALS), plain MF (ALS) and the
streaming sketch learner (SGD, 20 epochs) fitted to the perturbed ratings. Test ratings stay raw.

One holdout split (0.2, seed 1) instead of the seed's 10-fold cross-validation; F-score@10 per
user: the top 10 of the items not in the user's training part, against the user's test items rated
>= 4 (the seed states no threshold), averaged over users with at least one such item. Rank 10,
lambda = 10 for the ALS-based learners (chosen on the unperturbed split).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from sketchrec.models import SketchMF
from sketchrec.models.base import ITEM, USER
from sketchrec.models.private.seed_methods import BlpMogMF, NoisyALS
from sketchrec.privacy.ldp import DeviceRandomiser
from sketchrec.privacy.mechanisms import Laplace
from sketchrec.experiments.common import load, write
from sketchrec.replay.protocols import split_holdout, train_epochs
from sketchrec.data import Ratings

NAME = "blp-mog"
DESCRIPTION = "Seed 002: BLP vs Laplace+clamp perturbation, MoG-MF vs plain MF vs the sketch learner, RMSE and F@10"
EPSILONS = (0.1, 0.5, 1.0, 1.6, 3.0)
LOW, HIGH = 1.0, 5.0


def _perturb(kind: str, eps: float, ratings: np.ndarray, seed: int) -> np.ndarray:
    if kind == "blp":
        return DeviceRandomiser(eps, LOW, HIGH, seed=seed).perturb(ratings)
    noise = Laplace(epsilon=eps, sensitivity=HIGH - LOW)  # clamping afterwards is post-processing
    return np.clip(noise.randomise(ratings, np.random.default_rng(seed)), LOW, HIGH)


class _Scores:
    """Dense score matrix of a fitted learner over the users and items of the data."""

    def __init__(self, model, users, items):
        if isinstance(model, SketchMF):
            p, bu = model.factors(users, USER)
            q, bi = model.factors(items, ITEM)
            self.matrix = model.global_mean + bu[:, None] + bi[None, :] + p @ q.T
        else:
            uu, ii = np.meshgrid(users, items, indexing="ij")
            self.matrix = model.predict(uu.ravel(), ii.ravel()).reshape(len(users), len(items))


def _evaluate(model, train: Ratings, test: Ratings, users, items) -> dict:
    scores = _Scores(model, users, items).matrix
    u_index = {u: n for n, u in enumerate(users.tolist())}
    i_index = {i: n for n, i in enumerate(items.tolist())}
    tu = np.array([u_index[u] for u in test.users.tolist()])
    ti = np.array([i_index.get(i, -1) for i in test.items.tolist()])
    known = ti >= 0
    pred = np.full(len(test), (LOW + HIGH) / 2)
    pred[known] = scores[tu[known], ti[known]]
    rmse = float(np.sqrt(np.mean((np.clip(pred, LOW, HIGH) - test.ratings) ** 2)))
    seen = np.zeros_like(scores, dtype=bool)
    seen[[u_index[u] for u in train.users.tolist()], [i_index[i] for i in train.items.tolist()]] = True
    scores = np.where(seen, -np.inf, scores)
    top = np.argpartition(-scores, 10, axis=1)[:, :10]
    liked: dict[int, set] = {}
    for u, i, r in zip(tu[known], ti[known], test.ratings[known]):
        if r >= 4:
            liked.setdefault(int(u), set()).add(int(i))
    f = []
    for u, relevant in liked.items():
        hits = len(relevant & set(top[u].tolist()))
        precision, recall = hits / 10, hits / len(relevant)
        f.append(0.0 if hits == 0 else 2 * precision * recall / (precision + recall))
    return {"rmse": rmse, "f_at_10": float(np.mean(f))}


def _fit(name: str, train: Ratings, capacity: int, iters: int, epochs: int):
    if name == "mog_mf":
        return BlpMogMF(rank=10, components=3, lam=10.0, iters=iters, seed=1).fit(train.users, train.items, train.ratings)
    if name == "plain_mf":
        return NoisyALS(rank=10, lam=10.0, iters=iters, center=True, seed=1).fit(train.users, train.items, train.ratings)
    model = SketchMF(capacity=capacity, seed=1)
    train_epochs(model, train, epochs, seed=2)
    return model


def run(data: Path | None, out: Path, quick: bool) -> dict:
    ratings = load(data)
    if quick:  # a fifth of the ratings keeps the quick run in seconds
        ratings = ratings.take(np.arange(min(len(ratings), 20_000)))
    train, test = split_holdout(ratings, 0.2, 1)
    users, items = np.unique(ratings.users), np.unique(ratings.items)
    capacity = len(users) + len(items)
    epsilons, iters, epochs = ((1.0,), 3, 2) if quick else (EPSILONS, 15, 20)
    models = ("mog_mf", "plain_mf", "sketch_sgd")
    clean = {m: _evaluate(_fit(m, train, capacity, iters, epochs), train, test, users, items) for m in models}
    rows = []
    for eps in epsilons:
        for kind in ("blp", "laplace_clamp"):
            noisy = Ratings(train.users, train.items, _perturb(kind, eps, train.ratings, seed=int(eps * 1000)),
                            train.timestamps)
            for m in models:
                rows.append({"epsilon": eps, "perturbation": kind, "model": m,
                             **_evaluate(_fit(m, noisy, capacity, iters, epochs), train, test, users, items)})
    result = {"data": str(data or "ml-100k"), "split": "holdout 0.2, seed 1", "rank": 10, "lam": 10.0,
              "em_iters": iters, "sgd_epochs": epochs, "quick": quick, "non_private": clean, "rows": rows}
    return write(out, "blp_mog", result, _markdown(result), lambda plt: _plot(plt, result))


def _markdown(result: dict) -> str:
    lines = ["# blp-mog (seed 002) on ML-100k", "",
             f"{result['split']}; rank {result['rank']}, λ = {result['lam']} (ALS-based), sketch learner "
             f"{result['sgd_epochs']} epochs. Test ratings raw. RMSE / F@10.", "",
             "Non-private: " + ", ".join(f"{m} {v['rmse']:.4f} / {v['f_at_10']:.4f}"
                                         for m, v in result["non_private"].items()), "",
             "| ε | perturbation | MoG-MF | plain MF (ALS) | sketch SGD |", "|---|---|---|---|---|"]
    by = {(r["epsilon"], r["perturbation"], r["model"]): r for r in result["rows"]}
    for eps in sorted({r["epsilon"] for r in result["rows"]}):
        for kind in ("blp", "laplace_clamp"):
            cells = [by[(eps, kind, m)] for m in ("mog_mf", "plain_mf", "sketch_sgd")]
            lines.append(f"| {eps:g} | {kind} | " + " | ".join(f"{c['rmse']:.4f} / {c['f_at_10']:.4f}" for c in cells) + " |")
    return "\n".join(lines) + "\n"


def _plot(plt, result: dict):
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    eps = sorted({r["epsilon"] for r in result["rows"]})
    for m, color in (("mog_mf", "tab:red"), ("plain_mf", "tab:blue"), ("sketch_sgd", "tab:green")):
        for kind, style in (("blp", "-o"), ("laplace_clamp", "--s")):
            rows = [r for r in result["rows"] if r["model"] == m and r["perturbation"] == kind]
            a.plot(eps, [r["rmse"] for r in rows], style, color=color, label=f"{m}, {kind}", ms=4)
            b.plot(eps, [r["f_at_10"] for r in rows], style, color=color, ms=4)
    for ax, label in ((a, "test RMSE"), (b, "F-score@10")):
        ax.set_xscale("log")
        ax.set_xlabel("ε (local DP)")
        ax.set_ylabel(label)
    a.legend(fontsize=7)
    return fig
