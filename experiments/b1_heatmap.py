"""b1-heatmap: test RMSE over latent dimension d x space gain gamma, for k = 1 and k = 4
(thesis figs. 4.1/4.2). One mean-corrected 80/10/10 split, eta = 0.03, lambda = 0.1 (the b1-table
line search's choice at d = 32, gamma = 1), T = 20 epochs; no per-cell line search."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from sketchrec.experiments.common import SUBSTITUTION, fit, load, make, split_80_10_10, write

NAME = "b1-heatmap"
DESCRIPTION = "Figs. 4.1/4.2: RMSE over d x gamma for feature hashing (k=1) and the count sketch (k=4)"
DIMS = (1, 2, 3, 4, 6, 8, 11, 16, 23, 32)
GAINS = (1, 2, 2.83, 4, 5.66, 8, 11.31, 16, 23, 32)
KINDS = {"k1": "hashing", "k4": "sketch"}


def run(data: Path | None, out: Path, quick: bool) -> dict:
    ratings = load(data)
    dims, gains, epochs = ((2, 16), (1, 8), 2) if quick else (DIMS, GAINS, 20)
    split, n = split_80_10_10(ratings, fold=0), ratings.n_ids()
    rmse = {k: [[fit(make(kind, n, d, g), split, epochs) for g in gains] for d in dims]
            for k, kind in KINDS.items()}
    result = {"data": str(data or "ml-100k"), "dims": dims, "space_gains": gains, "epochs": epochs,
              "lr": 0.03, "reg": 0.1, "quick": quick, "rmse": rmse, "trends": _trends(rmse)}
    return write(out, "b1_heatmap", result, _markdown(result), lambda plt: _plot(plt, result))


def _trends(rmse: dict) -> dict:
    """How often RMSE rises with gamma (at fixed d) and falls with d (at fixed gamma)."""
    out = {}
    for k, grid in rmse.items():
        a = np.array(grid)
        out[k] = {"rises_with_gamma": float(np.mean(np.diff(a, axis=1) > 0)),
                  "falls_with_d": float(np.mean(np.diff(a, axis=0) < 0)),
                  "best": float(a.min()), "at_gamma_1_best_d": float(a[:, 0].min())}
    out["k4_beats_k1_share"] = float(np.mean(np.array(rmse["k4"]) < np.array(rmse["k1"])))
    return out


def _markdown(result: dict) -> str:
    lines = ["# b1-heatmap (thesis figs. 4.1/4.2)", "", SUBSTITUTION,
             f"One mean-corrected 80/10/10 split, η = {result['lr']}, λ = {result['reg']}, "
             f"T = {result['epochs']} epochs.", ""]
    for k in ("k1", "k4"):
        lines += [f"## k = {k[1:]}", "", "| d \\ γ | " + " | ".join(f"{g:g}" for g in result["space_gains"]) + " |",
                  "|---" * (len(result["space_gains"]) + 1) + "|"]
        lines += [f"| {d} | " + " | ".join(f"{x:.4f}" for x in row) + " |"
                  for d, row in zip(result["dims"], result["rmse"][k])]
        t = result["trends"][k]
        lines += ["", f"RMSE rises with γ in {t['rises_with_gamma']:.0%} of adjacent pairs and falls "
                  f"with d in {t['falls_with_d']:.0%}; best {t['best']:.4f}.", ""]
    lines.append(f"k = 4 beats k = 1 in {result['trends']['k4_beats_k1_share']:.0%} of the cells.")
    return "\n".join(lines) + "\n"


def _plot(plt, result: dict):
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True, layout="constrained")
    grids = [np.array(result["rmse"][k]) for k in ("k1", "k4")]
    lo, hi = min(g.min() for g in grids), max(g.max() for g in grids)
    for ax, k, grid in zip(axes, ("k = 1 (feature hashing)", "k = 4 (count sketch)"), grids):
        im = ax.imshow(grid, origin="lower", cmap="viridis", vmin=lo, vmax=hi, aspect="auto")
        ax.set_xticks(range(len(result["space_gains"])), [f"{g:g}" for g in result["space_gains"]])
        ax.set_yticks(range(len(result["dims"])), result["dims"])
        ax.set_xlabel("space gain γ")
        ax.set_title(k)
    axes[0].set_ylabel("latent dimension d")
    fig.colorbar(im, ax=axes, label="test RMSE")
    return fig
