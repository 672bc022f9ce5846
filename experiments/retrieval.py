"""retrieval: recall@10 and query latency of the retrieval index (qoLSH codes, Hamming short-list,
exact re-rank) against exact scoring of the whole catalogue, on item vectors learned by the
sketch learner from ML-100k (1,682 items) and from a synthetic stream with a 100,000-item
catalogue. Queries are learned user vectors; the exact top-10 by b_i + p_u . q_i is the truth;
both searches are timed in the same loop, per query, after a warm-up."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from sketchrec.models import SketchMF
from sketchrec.models.base import ITEM, USER
from sketchrec.stream.retrieval import RetrievalIndex
from sketchrec.experiments.common import load, write
from sketchrec.replay.protocols import train_epochs
from sketchrec.data import SyntheticStream

NAME = "retrieval"
DESCRIPTION = "Recall@10 and latency of the qoLSH retrieval index against exact top-10 (ML-100k, 100k-item catalogue)"
SHORTLISTS = (0.02, 0.05, 0.1, 0.2)
K = 10


def _learned(ratings, epochs: int, dim: int = 64):
    users, items = np.unique(ratings.users), np.unique(ratings.items)
    model = SketchMF(dim=dim, capacity=len(users) + len(items), seed=1)
    train_epochs(model, ratings, epochs, seed=1)
    q, b = model.factors(items, ITEM)
    p, _ = model.factors(users, USER)
    return q.astype(np.float32), b.astype(np.float32), p.astype(np.float32)


def _measure(vectors, biases, queries, shortlist: float) -> dict:
    index = RetrievalIndex(vectors.shape[1], bits=128, seed=2, shortlist=shortlist, min_shortlist=0)
    t0 = time.perf_counter()
    index.update(vectors, biases)
    build = time.perf_counter() - t0
    recalls, scored, t_index, t_exact = [], [], 0.0, 0.0
    for n, p in enumerate(queries):
        t0 = time.perf_counter()
        scores = vectors @ p + biases
        exact = np.argpartition(-scores, K)[:K]
        exact = exact[np.argsort(-scores[exact])]
        t1 = time.perf_counter()
        rows, _ = index.search(p, K)
        t2 = time.perf_counter()
        if n >= 5:  # warm-up queries are not timed
            t_exact += t1 - t0
            t_index += t2 - t1
        recalls.append(len(set(rows.tolist()) & set(exact.tolist())) / K)
        scored.append(index.last_scored / len(vectors))
    timed = max(len(queries) - 5, 1)
    return {"shortlist": shortlist, "scored_exactly": float(np.mean(scored)),
            "recall_at_10": float(np.mean(recalls)), "recall_at_10_min": float(np.min(recalls)),
            "index_us_per_query": t_index / timed * 1e6, "exact_us_per_query": t_exact / timed * 1e6,
            "build_s": build}


def run(data: Path | None, out: Path, quick: bool) -> dict:
    ml = load(data)
    synth = SyntheticStream(200_000 if quick else 3_000_000, 2_000 if quick else 30_000,
                            10_000 if quick else 100_000, seed=3).all()
    shortlists = (0.1, 0.2) if quick else SHORTLISTS
    catalogues = {}
    for name, ratings, epochs in (("ml-100k", ml, 2 if quick else 20), ("synthetic", synth, 1 if quick else 3)):
        q, b, p = _learned(ratings, epochs)
        queries = p[np.random.default_rng(4).permutation(len(p))[:100 if quick else 500]]
        catalogues[name] = {"items": len(q), "queries": len(queries), "epochs": epochs,
                            "runs": [_measure(q, b, queries, s) for s in shortlists]}
    result = {"k": K, "bits": 128, "dim": 64, "quick": quick, "catalogues": catalogues}
    return write(out, "retrieval", result, _markdown(result), lambda plt: _plot(plt, result))


def _markdown(result: dict) -> str:
    lines = ["# retrieval: the qoLSH index against exact top-10", "",
             f"128-bit qoLSH codes of the MIPS-transformed item points (d = {result['dim']} + bias), Hamming "
             "short-list, exact re-rank of the short-list; queries are learned user vectors.", "",
             "| catalogue | items | short-list (share scored exactly) | recall@10 (min) | index µs/query | exact µs/query |",
             "|---|---|---|---|---|---|"]
    for name, cat in result["catalogues"].items():
        for r in cat["runs"]:
            lines.append(f"| {name} | {cat['items']:,} | {r['scored_exactly']:.0%} | {r['recall_at_10']:.3f} "
                         f"({r['recall_at_10_min']:.1f}) | {r['index_us_per_query']:.0f} | {r['exact_us_per_query']:.0f} |")
    return "\n".join(lines) + "\n"


def _plot(plt, result: dict):
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for name, style in zip(result["catalogues"], ("b-o", "r-s")):
        runs = result["catalogues"][name]["runs"]
        ax.plot([r["scored_exactly"] for r in runs], [r["recall_at_10"] for r in runs], style, label=name)
    ax.axhline(0.9, color="gray", ls=":")
    ax.set_xlabel("share of the catalogue scored exactly")
    ax.set_ylabel("recall@10 against exact top-10")
    ax.legend()
    return fig
