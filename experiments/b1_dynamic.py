"""b1-dynamic: the one-pass setting at equal memory (thesis fig. 4.4) and convergence per epoch
(fig. 4.3). Regular MF with d_r in 1..32 holds d_r (|U| + |I|) numbers; a sketch with d_s = 32
and gamma = 32 / d_r holds the same, so each regular model is set against the sketch (k = 4) and
feature hashing (k = 1) of equal memory, all trained by one pass over the shuffled training
part of a mean-corrected 80/10/10 split (eta = 0.03, lambda = 0.1)."""

from __future__ import annotations

from pathlib import Path

from sketchrec.experiments.common import SUBSTITUTION, Split, load, make, split_80_10_10, write
from sketchrec.replay.protocols import rmse_on, train_epochs

NAME = "b1-dynamic"
DESCRIPTION = "Fig. 4.4: one pass at equal memory (regular d_r vs sketch d_s=32); fig. 4.3: RMSE per epoch"
DIMS = (1, 2, 3, 4, 6, 8, 11, 16, 23, 32)
D_SKETCH = 32


def _one_pass(kind: str, split: Split, n: int, dim: int, gain: float) -> float:
    model = make(kind, n, dim, gain)
    train_epochs(model, split.train, 1, seed=0)
    return rmse_on(model, split.test)


def _per_epoch(kind: str, split: Split, n: int, epochs: int) -> list[float]:
    model, curve = make(kind, n, D_SKETCH), []
    train_epochs(model, split.train, epochs, seed=0,
                 after_epoch=lambda epoch, learned: curve.append(rmse_on(model, split.test)))
    return curve


def run(data: Path | None, out: Path, quick: bool) -> dict:
    ratings = load(data)
    dims, epochs = ((2, 8, 32), 3) if quick else (DIMS, 20)
    split, n = split_80_10_10(ratings, fold=0), ratings.n_ids()
    one_pass = {"regular": [_one_pass("regular", split, n, d, 1.0) for d in dims],
                "sketch": [_one_pass("sketch", split, n, D_SKETCH, D_SKETCH / d) for d in dims],
                "hashing": [_one_pass("hashing", split, n, D_SKETCH, D_SKETCH / d) for d in dims]}
    curves = {kind: _per_epoch(kind, split, n, epochs) for kind in ("regular", "sketch", "hashing")}
    sketch_wins = [d for d, r, s in zip(dims, one_pass["regular"], one_pass["sketch"]) if s < r]
    result = {"data": str(data or "ml-100k"), "d_regular": dims, "d_sketch": D_SKETCH,
              "space_gain": [D_SKETCH / d for d in dims], "quick": quick, "one_pass_test_rmse": one_pass,
              "per_epoch_test_rmse": curves, "sketch_beats_regular_at_d_r": sketch_wins}
    return write(out, "b1_dynamic", result, _markdown(result), lambda plt: _plot(plt, result))


def _markdown(result: dict) -> str:
    p = result["one_pass_test_rmse"]
    lines = ["# b1-dynamic (thesis figs. 4.3/4.4)", "", SUBSTITUTION,
             "One pass, equal memory: regular MF at d_r against the count sketch (k = 4) and feature "
             f"hashing (k = 1) at d_s = {result['d_sketch']}, γ = d_s / d_r. Test RMSE:", "",
             "| d_r (= memory) | γ | regular | count sketch | feature hashing |", "|---|---|---|---|---|"]
    lines += [f"| {d} | {g:g} | {r:.4f} | {s:.4f} | {h:.4f} |" for d, g, r, s, h in
              zip(result["d_regular"], result["space_gain"], p["regular"], p["sketch"], p["hashing"])]
    c = result["per_epoch_test_rmse"]
    lines += ["", f"The sketch beats regular MF at equal memory for d_r in {result['sketch_beats_regular_at_d_r']} "
              "(thesis: for d_r > 7).", "",
              f"Convergence at d = {result['d_sketch']}, γ = 1 (test RMSE after epoch 1 / 5 / last):", "",
              "| model | " + " | ".join(f"epoch {e}" for e in (1, min(5, len(c['regular'])), len(c["regular"]))) + " |",
              "|---|---|---|---|"]
    for kind, curve in c.items():
        lines.append(f"| {kind} | " + " | ".join(f"{curve[e - 1]:.4f}" for e in (1, min(5, len(curve)), len(curve))) + " |")
    return "\n".join(lines) + "\n"


def _plot(plt, result: dict):
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    for kind, style in (("regular", "k-o"), ("sketch", "b-s"), ("hashing", "r-^")):
        a.plot(result["d_regular"], result["one_pass_test_rmse"][kind], style, label=kind)
        curve = result["per_epoch_test_rmse"][kind]
        b.plot(range(1, len(curve) + 1), curve, style, label=kind)
    a.set_xscale("log", base=2)
    a.set_xlabel("memory: d_r (regular) = 32 / γ (sketches)")
    a.set_ylabel("test RMSE after one pass")
    a.legend()
    b.set_xlabel("epoch")
    b.set_ylabel("test RMSE")
    b.set_title("d = 32, γ = 1")
    b.legend()
    return fig
