"""qolsh: thesis Table 5.1 on synthetic data — the quality of LSH, LSH with a tight frame, qoLSH
(M = 5 flips) and the optimal quantizer (exhaustive over all 2^L codes) for d = 8, L = 16, 1M
database vectors and 10k queries (isotropic Gaussian directions) — and the recall@R of the true
nearest neighbour (by cosine) when the database is ranked by each code's similarity estimate:
Hamming distance for LSH and LSH+frame (ties broken at random, counted in expectation), the
asymmetric estimator (5.14) for qoLSH and the optimal quantizer.

MSE is E ||x - x^/||x^|| ||^2 over unit vectors x (= 2 (1 - mean cosine)); entropy is the plug-in
entropy of the codes over the database, in bits; µs/vector is the encoding time. LSH's MSE depends
strongly on the draw of its 16 Gaussian directions, so every figure is the mean over several
draws (seeds), with the spread beside it (the optimal quantizer, whose exhaustive search costs
minutes per million vectors, on the first draw only).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from sketchrec.experiments.common import write
from sketchrec.sketches.cosine import CosineSketch

NAME = "qolsh"
DESCRIPTION = "Table 5.1: MSE, entropy and µs/vector of LSH, LSH+frame, qoLSH and the optimal quantizer; recall@R"
THESIS = {"lsh": {"mse": 0.434, "entropy_bits": 11.39, "us_per_vector": 0.12},
          "lsh_frame": {"mse": 0.207, "entropy_bits": 12.47, "us_per_vector": 0.12},
          "qolsh": {"mse": 0.107, "entropy_bits": 15.43, "us_per_vector": 3.89},
          "optimal": {"mse": 0.075, "entropy_bits": 15.75, "us_per_vector": 324.4}}
METHODS = {"lsh": "lsh", "lsh_frame": "frame", "qolsh": "qolsh", "optimal": "frame"}
RS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)
DIM, BITS = 8, 16
CODES = np.arange(1 << BITS, dtype=np.int64)  # code c's bits are c's, MSB first (as _all_codes)
PLACE = 1 << np.arange(BITS - 1, -1, -1, dtype=np.int64)
POPCOUNT = np.array([bin(c).count("1") for c in range(1 << BITS)], dtype=np.int64)


def _unit(rng, n):
    x = rng.standard_normal((n, DIM))
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _all_codes() -> np.ndarray:
    """Every +-1 code of BITS bits, row c = the bits of the integer c (MSB first, as packbits)."""
    c = np.arange(1 << BITS, dtype=np.uint32)
    return (((c[:, None] >> np.arange(BITS - 1, -1, -1)) & 1) * 2 - 1).astype(np.float32)


def _optimal_codes(sketch: CosineSketch, X: np.ndarray, chunk: int = 64) -> np.ndarray:
    """argmax over all 2^L codes of x . W b / ||W b|| (the best any L-bit code can do).

    Small row blocks: a block's similarities to all 2^L codes are written and then scanned by
    argmax, so a few rows keep that (rows x 2^L) block far smaller than thousands of rows do; each
    row's codes do not depend on the block size."""
    recon = _all_codes() @ sketch.W.T.astype(np.float32)
    recon /= np.linalg.norm(recon, axis=1, keepdims=True)
    best = np.empty(len(X), dtype=np.int64)
    for s in range(0, len(X), chunk):
        best[s:s + chunk] = np.argmax(X[s:s + chunk].astype(np.float32) @ recon.T, axis=1)
    return best


def _code_ints(packed: np.ndarray) -> np.ndarray:
    return (packed[:, 0].astype(np.int64) << 8) | packed[:, 1].astype(np.int64)


def _recall(similarity_of_code, db_codes: np.ndarray, queries: np.ndarray, nn_code: np.ndarray) -> dict:
    """Expected recall@R of the true NN when the database is ranked by a similarity that depends
    on the code only: per query, similarities of all 2^L codes weighted by how many database
    vectors carry each code; ties in random order."""
    counts = np.bincount(db_codes, minlength=1 << BITS).astype(np.float64)
    hits = np.zeros(len(RS))
    for q in range(len(queries)):
        sim = similarity_of_code(queries[q])
        s_true = sim[nn_code[q]]
        better = counts[sim > s_true].sum()
        tied = counts[sim == s_true].sum()  # includes the true neighbour itself
        r = np.asarray(RS, dtype=np.float64)
        hits += np.clip((r - better) / tied, 0.0, 1.0)
    return {str(R): float(h / len(queries)) for R, h in zip(RS, hits)}


def run(data: Path | None, out: Path, quick: bool) -> dict:
    n_db, n_q, seeds = (20_000, 500, (0, 1)) if quick else (1_000_000, 10_000, tuple(range(10)))
    rng = np.random.default_rng(123)
    database, queries = _unit(rng, n_db), _unit(rng, n_q)
    nearest = np.empty(n_q, dtype=np.int64)
    for s in range(0, n_q, 100):  # the true nearest neighbours by cosine
        nearest[s:s + 100] = np.argmax(queries[s:s + 100] @ database.T, axis=1)
    per_seed = {name: [] for name in METHODS}
    recall = {name: [] for name in METHODS}
    all_codes = _all_codes()
    for seed in seeds:
        for name, method in METHODS.items():
            if name == "optimal" and seed != seeds[0]:
                continue  # exhaustive search over 2^16 codes: ~3 minutes per 1M vectors, one draw
            sketch = CosineSketch(DIM, BITS, seed=seed, method=method)
            t0 = time.perf_counter()
            if name == "optimal":
                ints = _optimal_codes(sketch, database)
            else:
                ints = _code_ints(sketch.encode(database))
            us = (time.perf_counter() - t0) / n_db * 1e6
            recon = all_codes @ sketch.W.T
            recon /= np.linalg.norm(recon, axis=1, keepdims=True)
            mse = float(np.mean(np.sum((database - recon[ints]) ** 2, axis=1)))
            p = np.bincount(ints, minlength=1 << BITS) / n_db
            p = p[p > 0]
            per_seed[name].append({"mse": mse, "entropy_bits": float(-(p * np.log2(p)).sum()),
                                   "us_per_vector": us})
            if name in ("lsh", "lsh_frame"):
                def similarity(y, sketch=sketch):
                    query = int((y @ sketch.W >= 0) @ PLACE)  # y's code as an integer
                    return -POPCOUNT[CODES ^ query]  # minus Hamming distance to every code
            else:
                def similarity(y, recon=recon):
                    return recon @ y  # asymmetric estimator (5.14) for every code
            recall[name].append(_recall(similarity, ints, queries, ints[nearest]))
    summary = {}
    for name, rows in per_seed.items():
        summary[name] = {k: float(np.mean([r[k] for r in rows])) for k in ("mse", "entropy_bits", "us_per_vector")}
        summary[name]["mse_std_over_draws"] = float(np.std([r["mse"] for r in rows]))
    result = {**summary,
              "recall_at_R": {name: {R: float(np.mean([r[R] for r in runs])) for R in runs[0]}
                              for name, runs in recall.items()},
              "thesis": THESIS, "per_draw": per_seed,
              "params": {"dim": DIM, "bits": BITS, "max_flips": 5, "database": n_db, "queries": n_q,
                         "draws": list(seeds), "quick": quick}}
    return write(out, "qolsh", result, _markdown(result), lambda plt: _plot(plt, result))


def _markdown(result: dict) -> str:
    p = result["params"]
    lines = ["# qolsh (thesis Table 5.1)", "",
             f"Synthetic isotropic data, d = {p['dim']}, L = {p['bits']}, {p['database']:,} database vectors, "
             f"{p['queries']:,} queries, mean over {len(p['draws'])} draws of the projections (± std of MSE; "
             "optimal: first draw only).", "",
             "| method | MSE (this run) | MSE (thesis) | entropy bits (run / thesis) | µs/vector (run / thesis) |",
             "|---|---|---|---|---|"]
    for name in METHODS:
        r, t = result[name], result["thesis"][name]
        lines.append(f"| {name} | {r['mse']:.3f} ± {r['mse_std_over_draws']:.3f} | {t['mse']:.3f} | "
                     f"{r['entropy_bits']:.2f} / {t['entropy_bits']:.2f} | {r['us_per_vector']:.2f} / {t['us_per_vector']:.2f} |")
    lines += ["", "Recall@R of the true nearest neighbour:", "",
              "| method | " + " | ".join(f"R={R}" for R in RS) + " |", "|---" * (len(RS) + 1) + "|"]
    for name, rec in result["recall_at_R"].items():
        lines.append(f"| {name} | " + " | ".join(f"{rec[str(R)]:.3f}" for R in RS) + " |")
    order = result["qolsh"]["mse"] < result["lsh_frame"]["mse"] < result["lsh"]["mse"]
    lines += ["", f"MSE ordering qoLSH < LSH+frame < LSH: {'holds' if order else 'does NOT hold'}."]
    return "\n".join(lines) + "\n"


def _plot(plt, result: dict):
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for name, style in zip(METHODS, ("k:o", "b-s", "g-^", "r--")):
        rec = result["recall_at_R"][name]
        ax.plot(RS, [rec[str(R)] for R in RS], style, label=name, ms=4)
    ax.set_xscale("log")
    ax.set_xlabel("R")
    ax.set_ylabel("recall@R of the nearest neighbour")
    ax.set_title(f"d = {DIM}, L = {BITS}, {result['params']['database']:,} vectors")
    ax.legend()
    return fig
