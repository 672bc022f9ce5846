"""b1-regularization: test RMSE against lambda from 10 to 0 (thesis fig. 4.5) for regular MF, the
count sketch (k = 4) and feature hashing (k = 1) at d = 32, gamma = 1; and the best lambda over
(d, gamma) for the sketch (fig. 4.6). Mean-corrected 80/10/10 split, eta = 0.03, T = 20; lambda
is chosen on the validation part."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from sketchrec.experiments.common import SUBSTITUTION, load, make, split_80_10_10, write
from sketchrec.replay.protocols import rmse_on, train_epochs

NAME = "b1-regularization"
DESCRIPTION = "Figs. 4.5/4.6: RMSE against lambda (10 -> 0) and the best lambda over (d, gamma)"
LAMBDAS = (10, 5, 2, 1, 0.5, 0.2, 0.1, 0.05, 0.02, 0.01, 0.0)
KINDS = ("regular", "sketch", "hashing")


def _scores(kind, split, n, dim, gain, reg, epochs) -> tuple[float, float]:
    model = make(kind, n, dim, gain, reg=reg)
    train_epochs(model, split.train, epochs, seed=0)
    return rmse_on(model, split.validation), rmse_on(model, split.test)


def run(data: Path | None, out: Path, quick: bool) -> dict:
    ratings = load(data)
    lambdas, epochs = ((1, 0.1, 0.0), 2) if quick else (LAMBDAS, 20)
    dims, gains = ((8, 32), (1, 4)) if quick else ((4, 8, 16, 32), (1, 2, 4, 8))
    best_grid = (0.0, 0.05, 0.1, 0.2, 0.5) if not quick else (0.0, 0.1)
    split, n = split_80_10_10(ratings, fold=0), ratings.n_ids()
    curves = {kind: [_scores(kind, split, n, 32, 1.0, lam, epochs)[1] for lam in lambdas] for kind in KINDS}
    best = [[min(best_grid, key=lambda lam: _scores("sketch", split, n, d, g, lam, epochs)[0])
             for g in gains] for d in dims]
    degrade = {kind: curves[kind][-1] - min(curves[kind]) for kind in KINDS}
    result = {"data": str(data or "ml-100k"), "lambdas": lambdas, "epochs": epochs, "quick": quick,
              "test_rmse_d32_gamma1": curves, "degradation_at_lambda_0": degrade,
              "best_lambda_sketch": {"dims": dims, "space_gains": gains, "grid": best_grid, "best": best}}
    return write(out, "b1_regularization", result, _markdown(result), lambda plt: _plot(plt, result))


def _markdown(result: dict) -> str:
    c = result["test_rmse_d32_gamma1"]
    lines = ["# b1-regularization (thesis figs. 4.5/4.6)", "", SUBSTITUTION,
             f"d = 32, γ = 1, η = 0.03, T = {result['epochs']}; test RMSE:", "",
             "| λ | regular | count sketch (k=4) | feature hashing (k=1) |", "|---|---|---|---|"]
    lines += [f"| {lam:g} | {r:.4f} | {s:.4f} | {h:.4f} |"
              for lam, r, s, h in zip(result["lambdas"], c["regular"], c["sketch"], c["hashing"])]
    d = result["degradation_at_lambda_0"]
    least = min(d, key=d.get)
    lines += ["", "RMSE at λ = 0 minus the best over λ: " + ", ".join(f"{k} {v:+.4f}" for k, v in d.items())
              + f" — {least} degrades least (thesis: the sketch).", "",
              "Best λ for the count sketch (chosen on validation) over d × γ:", "",
              "| d \\ γ | " + " | ".join(f"{g:g}" for g in result["best_lambda_sketch"]["space_gains"]) + " |",
              "|---" * (len(result["best_lambda_sketch"]["space_gains"]) + 1) + "|"]
    b = result["best_lambda_sketch"]
    lines += [f"| {dim} | " + " | ".join(f"{x:g}" for x in row) + " |" for dim, row in zip(b["dims"], b["best"])]
    return "\n".join(lines) + "\n"


def _plot(plt, result: dict):
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4), layout="constrained")
    x = np.arange(len(result["lambdas"]))
    for kind, style in (("regular", "k-o"), ("sketch", "b-s"), ("hashing", "r-^")):
        a.plot(x, result["test_rmse_d32_gamma1"][kind], style, label=kind)
    a.set_xticks(x, [f"{lam:g}" for lam in result["lambdas"]])
    a.set_xlabel("λ (decreasing)")
    a.set_ylabel("test RMSE (d = 32, γ = 1)")
    a.legend()
    bl = result["best_lambda_sketch"]
    im = b.imshow(np.array(bl["best"]), origin="lower", cmap="magma", aspect="auto")
    b.set_xticks(range(len(bl["space_gains"])), [f"{g:g}" for g in bl["space_gains"]])
    b.set_yticks(range(len(bl["dims"])), bl["dims"])
    b.set_xlabel("γ")
    b.set_ylabel("d")
    b.set_title("best λ, count sketch")
    fig.colorbar(im, ax=b)
    return fig
