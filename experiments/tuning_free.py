"""tuning-free: the default learner (``--model mix``) against the damped bias baseline and against
a grid over step size x regularisation of one sketch model (plain SGD and AdaGrad), one
prequential pass in time order, on every data set found (ML-100k, ml-latest-small), on a seeded
synthetic low-rank stream whose users' tastes are redrawn halfway (a change-point), and on sparse
streams where most users rate once (80% and 95% of the ratings from users never seen again: the
factor model has nothing to learn about them, the biases little).

Done when the defaults are <= the bias baseline and within 2% of the grid's best everywhere.
The change-point stream also reports the RMSE of its last tenth (recovery)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from sketchrec.data import Ratings, order_ratings, read_ratings
from sketchrec.models.bias_baseline import BiasBaseline
from sketchrec.models.mix import Experts
from sketchrec.models.sketch_mf import SketchMF
from sketchrec.paths import data_dir, ml100k
from sketchrec.experiments.common import write

NAME = "tuning-free"
DESCRIPTION = "Defaults (mix) vs the damped bias baseline and an lr x reg grid, incl. a change-point stream"
GRID = {"sgd": ((0.01, 0.03, 0.06, 0.1), (0.02, 0.05, 0.085, 0.15)),
        "adagrad": ((0.05, 0.1, 0.2, 0.4), (0.02, 0.05, 0.085, 0.15)),
        "adagrad-id": ((0.05, 0.1, 0.2, 0.4), (0.02, 0.05, 0.085, 0.15))}
QUICK_GRID = {"sgd": ((0.03, 0.1), (0.02, 0.085)), "adagrad": ((0.1, 0.2), (0.02, 0.085))}
TOLERANCE = 1.02


def change_point_stream(n_ratings: int = 100_000, n_users: int = 1_000, n_items: int = 500,
                        rank: int = 8, noise: float = 0.35, seed: int = 0) -> Ratings:
    """Low-rank ratings (mu 3.6, biases, rank-``rank`` tastes, Gaussian noise: the noise floor),
    Zipf-skewed ids; at the halfway point every user's taste vector and bias are redrawn.

    >>> s = change_point_stream(1_000, 50, 20)
    >>> len(s), float(s.ratings.min()) >= 1.0
    (1000, True)
    """
    rng = np.random.default_rng(seed)
    scale = 1.0 / math.sqrt(rank)
    tastes = [rng.normal(0, scale, (n_users, rank)) for _ in range(2)]
    user_bias = [rng.normal(0, 0.4, n_users) for _ in range(2)]
    items, item_bias = rng.normal(0, scale, (n_items, rank)), rng.normal(0, 0.4, n_items)

    u, i = _zipf(rng, n_users, n_ratings), _zipf(rng, n_items, n_ratings)
    era = (np.arange(n_ratings) >= n_ratings // 2).astype(np.int64)
    taste = np.where(era[:, None] == 0, tastes[0][u], tastes[1][u])
    bias = np.where(era == 0, user_bias[0][u], user_bias[1][u])
    raw = 3.6 + bias + item_bias[i] + 3.0 * np.einsum("nr,nr->n", taste, items[i]) \
        + rng.normal(0, noise, n_ratings)
    return Ratings(u + 1, i + 1, np.clip(raw, 1.0, 5.0), np.arange(n_ratings, dtype=np.int64))


def sparse_stream(n_ratings: int = 100_000, once: float = 0.8, n_regulars: int = 2_000,
                  n_items: int = 1_000, rank: int = 8, noise: float = 0.35, seed: int = 0) -> Ratings:
    """Low-rank ratings as ``change_point_stream``'s (no change-point) where a share ``once`` of
    the ratings come from users who rate once, the rest from ``n_regulars`` Zipf-skewed
    returning users, in a random order.

    >>> s = sparse_stream(1_000, once=0.9, n_regulars=20)
    >>> len(s), len(set(s.users.tolist())) > 900
    (1000, True)
    """
    rng = np.random.default_rng(seed)
    scale = 1.0 / math.sqrt(rank)
    n_once = int(round(once * n_ratings))
    n_users = n_regulars + n_once
    taste, user_bias = rng.normal(0, scale, (n_users, rank)), rng.normal(0, 0.4, n_users)
    items, item_bias = rng.normal(0, scale, (n_items, rank)), rng.normal(0, 0.4, n_items)
    i = _zipf(rng, n_items, n_ratings)
    u = np.concatenate([_zipf(rng, n_regulars, n_ratings - n_once), n_regulars + np.arange(n_once)])
    u = u[rng.permutation(n_ratings)]
    raw = 3.6 + user_bias[u] + item_bias[i] + 3.0 * np.einsum("nr,nr->n", taste[u], items[i]) \
        + rng.normal(0, noise, n_ratings)
    return Ratings(u + 1, i + 1, np.clip(raw, 1.0, 5.0), np.arange(n_ratings, dtype=np.int64))


def _zipf(rng: np.random.Generator, n: int, size: int) -> np.ndarray:
    p = 1.0 / np.arange(1, n + 1) ** 0.6
    return rng.choice(n, size=size, p=p / p.sum())


def prequential_rmse(model, data: Ratings, batch: int = 10_000) -> tuple[float, float]:
    """(RMSE over the whole pass, RMSE over its last tenth)."""
    errors = np.concatenate([model.learn_many(data.users[s:s + batch], data.items[s:s + batch],
                                              data.ratings[s:s + batch]) - data.ratings[s:s + batch]
                             for s in range(0, len(data), batch)])
    tail = errors[-max(1, len(errors) // 10):]
    return float(np.sqrt(np.mean(errors ** 2))), float(np.sqrt(np.mean(tail ** 2)))


def streams(data: Path | None, quick: bool) -> dict[str, Ratings]:
    """The data sets to measure on: the change-point stream, ML-100k and (not quick)
    ml-latest-small when present, each in time order."""
    out = {"change-point": change_point_stream(20_000, 300, 200) if quick else change_point_stream()}
    for once in (0.8, 0.95):   # a family, not one stream: the defaults are not tuned to a share
        out[f"sparse {once:.0%} once"] = (sparse_stream(20_000, once, n_regulars=400, n_items=300)
                                          if quick else sparse_stream(once=once))
    paths = {"ml-100k": ml100k(data) if data or ml100k_present() else None}
    if not quick:
        paths["ml-latest-small"] = data_dir() / "ml-latest-small" / "ratings.csv"
    for name, path in paths.items():
        if path is not None and Path(path).is_file():
            out[name] = order_ratings(read_ratings(path)[0], "time")
    return out


def ml100k_present() -> bool:
    try:
        ml100k()
    except FileNotFoundError:
        return False
    return True


def measure(data: Ratings, grid: dict) -> dict:
    """Defaults, bias baseline and the grid on one stream."""
    n = data.n_ids()
    rows = {"defaults (mix)": prequential_rmse(Experts(capacity=n), data),
            "bias baseline": prequential_rmse(BiasBaseline(capacity=n), data)}
    for optimizer, (lrs, regs) in grid.items():
        for lr in lrs:
            for reg in regs:
                model = SketchMF(capacity=n, optimizer=optimizer, lr=lr, reg=reg)
                rows[f"{optimizer} lr={lr:g} reg={reg:g}"] = prequential_rmse(model, data)
    grid_rows = {k: v for k, v in rows.items() if k not in ("defaults (mix)", "bias baseline")}
    winner = min(grid_rows, key=lambda k: grid_rows[k][0])
    default, bias, best = rows["defaults (mix)"][0], rows["bias baseline"][0], grid_rows[winner][0]
    return {"ratings": len(data), "rmse": {k: v[0] for k, v in rows.items()},
            "last_tenth_rmse": {k: v[1] for k, v in rows.items()}, "winner": winner,
            "defaults": default, "bias_baseline": bias, "best_of_grid": best,
            "defaults_le_bias": default <= bias, "defaults_within_2pct": default <= TOLERANCE * best}


def run(data: Path | None, out: Path, quick: bool) -> dict:
    grid = QUICK_GRID if quick else GRID
    per_stream = {name: measure(ratings, grid) for name, ratings in streams(data, quick).items()}
    result = {"quick": quick, "grid": {k: {"lr": v[0], "reg": v[1]} for k, v in grid.items()},
              "streams": per_stream,
              "done": all(s["defaults_le_bias"] and s["defaults_within_2pct"] for s in per_stream.values())}
    return write(out, "tuning_free", result, _markdown(result), lambda plt: _plot(plt, result))


def _markdown(result: dict) -> str:
    lines = ["# tuning-free", "",
             "One prequential pass in time order. Defaults: `replay` without options (`--model mix`); "
             "bias baseline: `--model bias`; grid: `--model sketch --optimizer O --lr X --reg Y`.", "",
             "| stream | ratings | defaults | bias baseline | best of grid | winner | <= bias | within 2% |",
             "|---|---|---|---|---|---|---|---|"]
    for name, s in result["streams"].items():
        lines.append(f"| {name} | {s['ratings']:,} | {s['defaults']:.4f} | {s['bias_baseline']:.4f} | "
                     f"{s['best_of_grid']:.4f} | {s['winner']} | {s['defaults_le_bias']} | "
                     f"{s['defaults_within_2pct']} |")
    lines += ["", "Grid: " + "; ".join(f"{k}: lr {v['lr']} x reg {v['reg']}" for k, v in result["grid"].items()),
              "", f"All targets met: {result['done']}", ""]
    for name, s in result["streams"].items():
        lines += [f"## {name}", "", "| configuration | RMSE | last tenth |", "|---|---|---|"]
        lines += [f"| {k} | {v:.4f} | {s['last_tenth_rmse'][k]:.4f} |" for k, v in s["rmse"].items()]
        lines.append("")
    return "\n".join(lines)


def _plot(plt, result: dict):
    names = list(result["streams"])
    fig, ax = plt.subplots(figsize=(7, 3.5))
    for offset, (key, label) in enumerate((("defaults", "defaults (mix)"), ("bias_baseline", "bias baseline"),
                                           ("best_of_grid", "best of grid"))):
        ax.bar(np.arange(len(names)) + 0.27 * (offset - 1), [result["streams"][n][key] for n in names],
               width=0.27, label=label)
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel("prequential RMSE")
    low = min(result["streams"][n]["best_of_grid"] for n in names)
    ax.set_ylim(low * 0.9, None)
    ax.legend()
    return fig
