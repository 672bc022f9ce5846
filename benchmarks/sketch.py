"""Micro-benchmark: CountSketch vector read+update throughput against a dense numpy array.

    python -m sketchrec.benchmarks.sketch [--ids 1000000] [--dim 32] [--depth 4] [--batch 10000]

Both sides do the same work per id: read a d-vector, then add a d-vector back. The dense baseline
is the unbounded alternative (one row per id, numpy fancy indexing); the sketch uses the space
gain gamma=1 width for the same number of distinct ids. Figures are the best of 3 runs.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from sketchrec.sketches import CountSketch, keys_of, width_for_space_gain


def _best_of(runs: int, fn) -> float:
    best = float("inf")
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ids", type=int, default=1_000_000, help="random ids per run")
    ap.add_argument("--distinct", type=int, default=100_000, help="distinct ids they are drawn from")
    ap.add_argument("--dim", type=int, default=32)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--batch", type=int, default=10_000)
    args = ap.parse_args(argv)

    rng = np.random.default_rng(0)
    ids = rng.integers(0, args.distinct, args.ids)
    keys = keys_of(ids)  # hashing happens once at ingestion, not per access
    deltas = rng.normal(0, 0.01, (args.batch, args.dim))
    sketch = CountSketch(width_for_space_gain(args.distinct, args.dim, 1.0, args.depth), args.depth,
                         args.dim, seed=1)
    dense = np.zeros((args.distinct, args.dim), dtype=np.float32)
    sketch.update_many(keys[:10], deltas[:10])  # compile before timing

    def run_sketch():
        for s in range(0, args.ids, args.batch):
            k = keys[s:s + args.batch]
            sketch.read_many(k)
            sketch.update_many(k, deltas[: len(k)])

    def run_dense():
        for s in range(0, args.ids, args.batch):
            i = ids[s:s + args.batch]
            _ = dense[i]
            np.add.at(dense, i, deltas[: len(i)])  # add.at: repeated ids in a batch all count

    t_sketch, t_dense = _best_of(3, run_sketch), _best_of(3, run_dense)
    result = {"ids": args.ids, "dim": args.dim, "depth": args.depth, "width": sketch.width,
              "sketch_ids_per_s": args.ids / t_sketch, "dense_ids_per_s": args.ids / t_dense,
              "ratio_sketch_over_dense": t_dense / t_sketch,
              "sketch_bytes": sketch.nbytes, "dense_bytes": dense.nbytes}
    print(f"CountSketch d={args.dim} k={args.depth} w={sketch.width}: "
          f"{result['sketch_ids_per_s']:,.0f} vector read+update/s ({sketch.nbytes / 1e6:.1f} MB)")
    print(f"dense numpy baseline:            {result['dense_ids_per_s']:,.0f} vector read+update/s "
          f"({dense.nbytes / 1e6:.1f} MB)")
    print(f"ratio sketch/dense: {result['ratio_sketch_over_dense']:.2f}")
    return result


if __name__ == "__main__":
    main()
