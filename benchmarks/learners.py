"""Learn+predict throughput and prequential accuracy of the learners on the same stream, in one
process (a benchmark, not a test).

    python -m sketchrec.benchmarks.learners [PATH] [--runs 3] [--limit N]

Each learner sees the same ratings in time order, predicting each before learning it. Figures are
the median of `--runs` runs; the slow per-rating learners (river, Vowpal Wabbit, SketchMF through
`learn_one`) run on a prefix (`--slow-limit`), and their throughput is measured on that prefix.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import numpy as np

from sketchrec.models import DenseMF, SketchMF
from sketchrec.models.mix import Experts
from sketchrec.models.metrics import ErrorStats
from sketchrec.models.river_adapters import RiverBiasedMF
from sketchrec.privacy.monitor import PrivacyMonitor
from sketchrec.replay.protocols import prequential
from sketchrec.models.wrapped import Wrapped
from sketchrec.data import Ratings, order_ratings, read_ratings
from sketchrec.benchmarks import PATH_HELP, data_file



class _OneByOne:
    """SketchMF driven through river's learn_one/predict_one, one rating at a time."""

    def __init__(self, model):
        self.model = model

    def learn_many(self, users, items, ratings, epoch=0):
        out = np.empty(len(ratings))
        for n, (u, i, r) in enumerate(zip(users.tolist(), items.tolist(), ratings.tolist())):
            out[n] = self.model.predict_one(u, i)
            self.model.learn_one(u, i, r)
        return out


class VowpalWabbitMF:
    """Vowpal Wabbit's matrix factorization (`--rank d -q ui`), fed the same examples one by one.

    VW's `learn` predicts before it updates, which is the prequential prediction."""

    def __init__(self, dim: int = 64, lr: float = 0.05):
        import vowpalwabbit
        self.ws = vowpalwabbit.Workspace(f"--quiet --rank {dim} -q ui --l2 0.0001 --learning_rate {lr} "
                                         "--power_t 0 --loss_function squared")

    def learn_many(self, users, items, ratings, epoch=0):
        out = np.empty(len(ratings))
        ws = self.ws
        for n, (u, i, r) in enumerate(zip(users.tolist(), items.tolist(), ratings.tolist())):
            ex = ws.parse(f"{r} |u {u} |i {i}")
            ws.learn(ex)
            out[n] = ex.get_simplelabel_prediction()
            ws.finish_example(ex)
        return np.clip(out, 1.0, 5.0)


def vw_available() -> bool:
    try:
        import vowpalwabbit  # noqa: F401
        return True
    except ImportError:
        return False


def _timed_rounds(makes: list, parts: list[Ratings], runs: int, max_rounds: int = 25) -> list[list[dict]]:
    """Prequential runs of each learner (on its part) in turn, round after round: at least `runs`
    rounds, and up to `max_rounds` while a round of the first learner lasts under a second in all (a
    run on ML-100k lasts a fraction of a second). Alternating within a round lets two learners be compared pair by pair."""
    rounds: list[list[dict]] = []
    while True:
        rounds.append([prequential(make(), part.batches(10_000)) for make, part in zip(makes, parts)])
        spent = sum(r[0]["seconds"] for r in rounds)
        if len(rounds) >= runs and (spent >= 1.0 or len(rounds) >= max_rounds):
            return rounds


def learner_table(data: Ratings, runs: int = 3, slow_limit: int = 100_000, dim: int = 64,
                  max_rounds: int = 25) -> dict:
    """Median throughput and RMSE of every learner on the same prequential stream (from `runs` to
    `max_rounds` rounds each: see ``_timed_rounds``)."""
    capacity = data.n_ids()
    slow = min(len(data), slow_limit)
    learners = {
        "sketch_batch": (lambda: SketchMF(capacity=capacity, dim=dim), len(data)),
        "sketch_batch_monitored": (lambda: Wrapped(SketchMF(capacity=capacity, dim=dim), PrivacyMonitor()),
                                   len(data)),
        "sketch_learn_one": (lambda: _OneByOne(SketchMF(capacity=capacity, dim=dim)), min(slow, 20_000)),
        "dense_batch": (lambda: DenseMF(dim=dim), len(data)),
        # replay's default learner: the bias baseline and an AdaGrad sketch model combined
        "mix_batch": (lambda: Experts(capacity=capacity), len(data)),
        "river_biasedmf": (lambda: RiverBiasedMF(dim=dim), slow),
    }
    if vw_available():
        learners["vowpal_wabbit"] = (lambda: VowpalWabbitMF(dim=dim), slow)
    # compile outside the timings (the learner's kernels and the monitor's)
    Wrapped(SketchMF(capacity=10, dim=dim), PrivacyMonitor(window=2, reservoir=2, probe_every=1)).learn_many(
        [1, 2, 3], [1, 2, 3], [3.0, 4.0, 5.0])
    Experts(capacity=10).learn_many([1, 2, 3], [1, 2, 3], [3.0, 4.0, 5.0])
    results: dict = {"dim": dim, "ratings": len(data)}
    # the monitor's overhead and the mix's speed over river's are medians over alternating pairs:
    # pairing cancels the machine's drift between two separately timed medians (on a shared
    # machine larger than either figure's margin)
    paired = [("sketch_batch", "sketch_batch_monitored"), ("mix_batch", "river_biasedmf")]
    groups = paired + [(name,) for name in learners if all(name not in p for p in paired)]
    ratios = {}
    for group in groups:
        rounds = _timed_rounds([learners[name][0] for name in group],
                               [data.take(slice(0, learners[name][1])) for name in group], runs, max_rounds)
        for column, name in enumerate(group):
            timed = [r[column] for r in rounds]
            results[name] = {"ratings": learners[name][1], "rmse": timed[0]["rmse"], "runs": len(timed),
                             "throughput_per_s": statistics.median(r["throughput_per_s"] for r in timed)}
        if len(group) == 2:
            ratios[group] = statistics.median(a["throughput_per_s"] / b["throughput_per_s"]
                                              for a, b in rounds)
    results["ratio_monitor_overhead"] = ratios[paired[0]]  # monitored seconds / plain seconds
    prefix = data.take(slice(0, slow))  # accuracy on the prefix the slow learners saw
    same = ErrorStats()
    same.add(SketchMF(capacity=capacity, dim=dim).learn_many(prefix.users, prefix.items, prefix.ratings),
             prefix.ratings)
    results["sketch_rmse_on_slow_prefix"] = same.rmse
    rate = {name: results[name]["throughput_per_s"] for name in learners}
    results["ratio_sketch_over_river"] = rate["sketch_batch"] / rate["river_biasedmf"]
    results["ratio_sketch_over_dense"] = rate["sketch_batch"] / rate["dense_batch"]
    results["ratio_mix_over_river"] = ratios[paired[1]]
    results["ratio_mix_over_sketch"] = rate["mix_batch"] / rate["sketch_batch"]
    results["ratio_sketch_over_vw"] = rate["sketch_batch"] / rate["vowpal_wabbit"] if vw_available() else None
    return results


def print_table(results: dict) -> None:
    for name, row in results.items():
        if isinstance(row, dict):
            print(f"  {name:24s} {row['ratings']:>9,} ratings  RMSE {row['rmse']:.4f}  "
                  f"{row['throughput_per_s']:>12,.0f} ratings/s")
    vw = results["ratio_sketch_over_vw"]
    print(f"  sketch/river {results['ratio_sketch_over_river']:.1f}x, sketch/VW "
          + (f"{vw:.2f}x" if vw else "n/a (vowpalwabbit not installed)")
          + f", sketch/dense {results['ratio_sketch_over_dense']:.2f}x, "
          f"mix (replay's default)/river {results['ratio_mix_over_river']:.1f}x "
          f"(mix/sketch {results['ratio_mix_over_sketch']:.2f}), "
          f"monitor overhead {results['ratio_monitor_overhead']:.3f}")


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("path", nargs="?", type=Path, help=PATH_HELP)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--slow-limit", type=int, default=100_000)
    ap.add_argument("--dim", type=int, default=64)
    args = ap.parse_args(argv)
    data, _ = read_ratings(data_file(args.path))
    results = learner_table(order_ratings(data, "time"), args.runs, args.slow_limit, args.dim)
    print_table(results)
    print(json.dumps(results))
    return results


if __name__ == "__main__":
    main()
