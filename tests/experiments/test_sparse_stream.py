"""Sparse streams (most users rate once): the default learner is never worse than the damped bias
baseline on them, while a factor model alone is (the comparison can fail)."""

from __future__ import annotations

import numpy as np
import pytest

from sketchrec.experiments.tuning_free import prequential_rmse, sparse_stream
from sketchrec.models.bias_baseline import BiasBaseline
from sketchrec.models.mix import Experts
from sketchrec.models.sketch_mf import SketchMF


def test_the_stream_is_sparse():
    data = sparse_stream(20_000, 0.95, n_regulars=400, n_items=300)
    users, counts = np.unique(data.users, return_counts=True)
    assert (counts == 1).sum() >= 0.95 * 20_000 - 1 and len(users) > 19_000


@pytest.mark.parametrize("once,seed", [(0.8, 0), (0.95, 1)])
def test_the_default_is_not_worse_than_the_bias_baseline_and_a_plain_factor_model_is(once, seed):
    data = sparse_stream(20_000, once, n_regulars=400, n_items=300, seed=seed)
    n = data.n_ids()
    bias = prequential_rmse(BiasBaseline(capacity=n), data)[0]
    assert prequential_rmse(Experts(capacity=n), data)[0] <= bias
    # the broken variant: one factor model with plain SGD steps (no per-id damping, no bias
    # member to fall back on) spends its steps on users it never sees again and loses
    assert prequential_rmse(SketchMF(capacity=n, optimizer="sgd", lr=0.1, reg=0.02), data)[0] > bias
