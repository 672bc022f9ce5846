"""Learn+predict throughput and prequential accuracy of the learners on the same stream, in one
process (a benchmark, not a test).

    python -m replay.bench_learners [PATH] [--runs 3] [--limit N]

Each learner sees the same ratings in time order, predicting each before learning it. Figures are
the median of `--runs` runs; river's BiasedMF runs on a prefix (`--river-limit`) because it is slow,
and its throughput is measured on that prefix.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from models import DenseMF, SketchMF
from models.river_adapters import RiverBiasedMF
from privacy.monitor import PrivacyMonitor
from stream.recommender import Monitored
from replay.protocols import ErrorStats, prequential
from stream.sources import order_ratings, read_ratings

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "ml-100k" / "u.data"


class _OneByOne:
    """SketchMF driven through river's learn_one/predict_one, one rating at a time."""

    def __init__(self, model):
        self.model = model

    def learn_many(self, users, items, ratings, epoch=0):
        import numpy as np
        out = np.empty(len(ratings))
        for n, (u, i, r) in enumerate(zip(users.tolist(), items.tolist(), ratings.tolist())):
            out[n] = self.model.predict_one(u, i)
            self.model.learn_one(u, i, r)
        return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("path", nargs="?", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--river-limit", type=int, default=100_000)
    args = ap.parse_args(argv)
    data, _ = read_ratings(args.path)
    data = order_ratings(data, "time")
    capacity = len(set(data.users.tolist())) + len(set(data.items.tolist()))
    learners = {
        "sketch_batch": (lambda: SketchMF(capacity=capacity), len(data)),
        "sketch_learn_one": (lambda: _OneByOne(SketchMF(capacity=capacity)), min(len(data), 20_000)),
        "sketch_batch_monitored": (lambda: Monitored(SketchMF(capacity=capacity), PrivacyMonitor()), len(data)),
        "dense_batch": (lambda: DenseMF(), len(data)),
        "river_biasedmf": (lambda: RiverBiasedMF(), min(len(data), args.river_limit)),
    }
    SketchMF(capacity=capacity).learn_many(data.users[:10], data.items[:10], data.ratings[:10])  # compile
    results = {}
    for name, (make, n) in learners.items():
        part = data.take(slice(0, n))
        runs = [prequential(make(), part.batches(10_000)) for _ in range(args.runs)]
        results[name] = {"ratings": n, "rmse": runs[0]["rmse"],
                         "throughput_per_s": statistics.median(r["throughput_per_s"] for r in runs)}
        print(f"{name:18s} {n:>8,} ratings  RMSE {runs[0]['rmse']:.4f}  "
              f"{results[name]['throughput_per_s']:>12,.0f} ratings/s")
    # accuracy on the same prefix river saw, for a like-for-like RMSE
    prefix = data.take(slice(0, learners["river_biasedmf"][1]))
    same = ErrorStats()
    same.add(SketchMF(capacity=capacity).learn_many(prefix.users, prefix.items, prefix.ratings), prefix.ratings)
    results["sketch_rmse_on_river_prefix"] = same.rmse
    results["ratio_sketch_over_river"] = (results["sketch_batch"]["throughput_per_s"]
                                          / results["river_biasedmf"]["throughput_per_s"])
    results["ratio_sketch_over_dense"] = (results["sketch_batch"]["throughput_per_s"]
                                          / results["dense_batch"]["throughput_per_s"])
    results["ratio_monitor_overhead"] = (results["sketch_batch"]["throughput_per_s"]
                                         / results["sketch_batch_monitored"]["throughput_per_s"])
    print(f"monitor overhead: sketch alone / sketch with monitor = {results['ratio_monitor_overhead']:.3f}")
    print(f"ratio sketch(batch)/river: {results['ratio_sketch_over_river']:.1f}x   "
          f"sketch/dense: {results['ratio_sketch_over_dense']:.2f}x")
    print(json.dumps(results))
    return results


if __name__ == "__main__":
    main()
