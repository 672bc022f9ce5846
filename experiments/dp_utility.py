"""dp-utility: holdout RMSE against epsilon of the joint-DP modes, rating and user level.

For each data set (ML-100k; in the full run also ml-latest-small when present) and each epsilon in
{0.5, 1, 2, 4, 8} (delta = 1e-5), ``runs`` fits with fresh noise of: the joint-DP model (the
default: DP mean, damped DP item biases, each user's own offset; ``replay --dp-unit user``), the
same with private ALS item factors of rank 4, and the private baseline (DP mean + DP item biases)
under the same budget; mean and spread (sample std) of their RMSE. Beside them: the non-private
sketch learner (`replay --holdout 0.2 --epochs 20 --seed 1`) and the joint-DP algorithm without
noise. Split: ``replay.protocols.split_holdout(ratings, 0.2, seed=1)``, as `replay --holdout 0.2
--seed 1`. The hyper-parameters are ``JointDPConfig``'s defaults, tuned on ML-100k's training part.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np

from sketchrec.data import read_ratings
from sketchrec.paths import DATA_ENV, MissingData, data_dir
from sketchrec.models import SketchMF
from sketchrec.models.private.joint_als import JointDPConfig
from sketchrec.replay.joint_holdout import public_catalogue, train_user_private
from sketchrec.replay.protocols import holdout, split_holdout

NAME = "dp-utility"
DESCRIPTION = "joint-DP modes: holdout RMSE against epsilon (rating and user level) beside the baseline"
DATASETS = {"ml-100k": Path("ml-100k") / "u.data", "ml-latest-small": Path("ml-latest-small") / "ratings.csv"}
RANGES = {"u.data": (1.0, 5.0), "ratings.csv": (0.5, 5.0)}
EPSILONS = (0.5, 1.0, 2.0, 4.0, 8.0)
DELTA = 1e-5
# the non-private sketch learner as `replay --model sketch` runs it (replay.cli DEFAULTS, plain SGD)
SKETCH = dict(dim=64, depth=4, space_gain=1.0, lr=0.03, reg=0.085, bias_reg=0.05, init_std=0.05, seed=1,
              optimizer="sgd")


def _stats(values: list[float]) -> dict:
    arr = np.asarray(values)
    return {"mean": float(arr.mean()), "std": float(arr.std(ddof=1)) if len(arr) > 1 else 0.0,
            "runs": [float(v) for v in arr]}


def _curve(train, test, catalogue, rating_range, unit: str, eps: float, runs: int, rank: int) -> dict:
    cfg = replace(JointDPConfig(), rank=rank)
    res = [train_user_private(train, test, eps, DELTA, unit, catalogue, rating_range, cfg)
           for _ in range(runs)]
    return {"unit": unit, "epsilon": eps, "rank": rank, "rmse": _stats([r["rmse"] for r in res]),
            "baseline_rmse": _stats([r["baseline_rmse"] for r in res]),
            "accounted_epsilon": res[0]["privacy"]["epsilon"], "fallbacks": sum(r["fallback"] for r in res),
            "accountant": res[0]["privacy"].get("accountant")}


def run_dataset(path: Path, quick: bool, runs: int) -> dict:
    ratings, _ = read_ratings(path)
    rating_range = RANGES.get(path.name, (float(ratings.ratings.min()), float(ratings.ratings.max())))
    catalogue, source = public_catalogue(path, ratings)
    train, test = split_holdout(ratings, 0.2, 1)
    capacity = len(np.unique(ratings.users)) + len(np.unique(ratings.items))
    epochs = 0 if quick else 20  # --quick skips the sketch learner (its 20 epochs take minutes)
    sketch = holdout(SketchMF(capacity=capacity, **SKETCH), ratings, 0.2, epochs, seed=1)["rmse"] \
        if epochs else None
    epsilons = (1.0, 8.0) if quick else EPSILONS
    rows = [_curve(train, test, catalogue, rating_range, unit, eps, runs, rank)
            for unit in ("user", "rating") for eps in epsilons for rank in ((0,) if quick else (0, 4))]
    clean = train_user_private(train, test, math.inf, DELTA, "user", catalogue, rating_range)["rmse"]
    return {"data": str(path), "catalogue": source, "rating_range": rating_range,
            "non_private_sketch": {"rmse": sketch, "epochs": epochs},
            "joint_dp_without_noise": clean, "rows": rows}


def run(data: Path | None, out: Path, quick: bool) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    runs = 3
    paths = [data] if data else [data_dir() / p for name, p in DATASETS.items()
                                 if (data_dir() / p).exists() and (not quick or name == "ml-100k")]
    if not paths:
        raise MissingData(f"no MovieLens ratings under {data_dir()} (give --data PATH, or set "
                          f"${DATA_ENV} to the directory holding ml-100k/u.data)")
    result = {"protocol": "holdout 0.2 (split_holdout seed 1)", "delta": DELTA, "runs": runs,
              "quick": quick, "config": asdict(JointDPConfig()),
              "datasets": [run_dataset(Path(p), quick, runs) for p in paths]}
    (out / "dp_utility.json").write_text(json.dumps(result, indent=1, default=float))
    (out / "dp_utility.md").write_text(_markdown(result))
    _plot(result, out / "dp_utility.png")
    return result


def _markdown(result: dict) -> str:
    shown = {k: v for k, v in result["config"].items() if k not in ("epsilon", "delta", "unit")}
    lines = ["# dp-utility: joint-DP modes, holdout RMSE against ε", "",
             f"{result['protocol']}, δ = {result['delta']:g}, mean ± std over {result['runs']} runs "
             "(fresh noise each). Hyper-parameters: `JointDPConfig` defaults "
             f"`{json.dumps(shown)}`.",
             ""]
    for ds in result["datasets"]:
        sketch = ds["non_private_sketch"]["rmse"] or math.nan
        lines += [f"## {Path(ds['data']).parent.name}", "",
                  f"Non-private sketch ({ds['non_private_sketch']['epochs']} epochs): **{sketch:.4f}**; "
                  f"the joint-DP algorithm without noise: {ds['joint_dp_without_noise']:.4f}; "
                  f"catalogue: {ds['catalogue']}.", "",
                  "| unit | ε | rank | joint-DP RMSE | ratio to sketch | private baseline | fallbacks |",
                  "|---|---|---|---|---|---|---|"]
        for r in ds["rows"]:
            lines.append(f"| {r['unit']} | {r['epsilon']:g} | {r['rank']} | {r['rmse']['mean']:.4f} ± "
                         f"{r['rmse']['std']:.4f} | {r['rmse']['mean'] / sketch:.3f} | "
                         f"{r['baseline_rmse']['mean']:.4f} ± {r['baseline_rmse']['std']:.4f} | "
                         f"{r['fallbacks']}/{len(r['rmse']['runs'])} |")
        lines.append("")
    return "\n".join(lines)


def _plot(result: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    sets = result["datasets"]
    fig, axes = plt.subplots(1, len(sets), figsize=(5.2 * len(sets), 3.8), squeeze=False)
    for ax, ds in zip(axes[0], sets):
        for unit, color in (("user", "tab:blue"), ("rating", "tab:green")):
            for rank, style in ((0, "o-"), (4, "s:")):
                rows = [r for r in ds["rows"] if r["unit"] == unit and r["rank"] == rank]
                if rows:
                    ax.errorbar([r["epsilon"] for r in rows], [r["rmse"]["mean"] for r in rows],
                                [r["rmse"]["std"] for r in rows], fmt=style, color=color, capsize=2,
                                label=f"joint-DP, {unit} level" + (f", ALS rank {rank}" if rank else ""))
            rows = [r for r in ds["rows"] if r["unit"] == unit and r["rank"] == 0]
            ax.errorbar([r["epsilon"] for r in rows], [r["baseline_rmse"]["mean"] for r in rows],
                        [r["baseline_rmse"]["std"] for r in rows], fmt="x--", color=color, alpha=0.6,
                        capsize=2, label=f"private baseline, {unit} level")
        sketch = ds["non_private_sketch"]["rmse"]
        if sketch is not None:
            ax.axhline(sketch, color="gray", ls="--", label="non-private sketch")
            ax.axhline(1.1 * sketch, color="gray", ls=":", label="1.10 × non-private")
        ax.set_xscale("log")
        ax.set_xticks(EPSILONS, [f"{e:g}" for e in EPSILONS])
        ax.minorticks_off()
        ax.set_xlabel("ε (δ = 1e-5)")
        ax.set_ylabel("holdout RMSE")
        ax.set_title(Path(ds["data"]).parent.name, fontsize=9)
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
