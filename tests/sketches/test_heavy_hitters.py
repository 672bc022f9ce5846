"""Heavy hitters on a count-min sketch: the most frequent ids within a fixed capacity."""

import numpy as np

from sketchrec.sketches import CountMinSketch, HeavyHitters


def test_heavy_hitters_finds_most_frequent_within_capacity():
    rng = np.random.default_rng(3)
    stream = rng.zipf(1.5, 30_000) % 3000
    hh = HeavyHitters(10, CountMinSketch(epsilon=0.001, delta=0.01, seed=1))
    for chunk in np.array_split(stream, 30):
        hh.add_many(chunk)
    assert len(hh) == 10
    values, counts = np.unique(stream, return_counts=True)
    true_top = set(values[np.argsort(-counts)[:5]].tolist())
    found = [item for item, _ in hh.most_common(5)]
    assert set(found) == true_top
    estimates = [c for _, c in hh.most_common()]
    assert estimates == sorted(estimates, reverse=True)
