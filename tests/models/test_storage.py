"""The model's storage object, the heavy filter on the Sketch protocol, params read from __init__,
and the public surface DP-SGD uses."""

from dataclasses import replace

import numpy as np
import pytest

from sketchrec.data import SyntheticStream
from sketchrec.models import DenseMF, SketchMF
from sketchrec.models.base import FactorizationModel
from sketchrec.models.private.dp_sgd import DPConfig
from sketchrec.models.heavy_filter import HeavyFilter


def data(seed=1):
    return SyntheticStream(n_ratings=3000, n_users=200, n_items=100, seed=seed).all()


def test_the_store_is_the_models_own_arrays_also_after_loading_a_checkpoint():
    d = data()
    model = SketchMF(dim=8, width=512, heavy_fraction=0.3, seed=1)
    model.learn_many(d.users, d.items, d.ratings)
    back = SketchMF.from_bytes(model.to_bytes())
    for m in (model, back):
        assert m.store.cells is m.vectors.cells and m.store.bias_cells is m.biases.cells
        assert m.store.heavy.counts is m.heavy.counts and m.store.heavy.vectors is m.heavy.cells
    before = back.predict_many(d.users[:20], d.items[:20], clip=False)
    back.store.bias_cells[:] = 0.0    # a write through the store is a write to the model
    assert not np.array_equal(back.predict_many(d.users[:20], d.items[:20], clip=False), before)


def test_heavy_filter_round_trips_as_a_sketch_and_refuses_to_merge():
    model = SketchMF(dim=8, width=512, heavy_fraction=0.3, seed=1)
    d = data()
    model.learn_many(d.users, d.items, d.ratings)
    heavy = model.heavy
    assert heavy.n_used > 0
    back = HeavyFilter.from_bytes(heavy.to_bytes())
    assert back == heavy and back.nbytes == heavy.nbytes
    back.counts[back.counts > 0] += 1
    assert back != heavy           # equality covers the arrays kept beside the cells
    with pytest.raises(TypeError):
        heavy.merge(back)


def test_params_are_read_from_the_constructor_and_rebuild_the_same_shape():
    model = SketchMF(dim=8, capacity=300, space_gain=2.0, seed=3,
                     dp=DPConfig(noise_multiplier=1.0, batch_size=50))
    params = model.params()
    assert params["width"] == model.width and params["heavy_slots"] == 0
    assert params["dp"]["batch_size"] == 50           # a configuration is stored as a dict
    assert SketchMF(**params).params() == params
    assert DenseMF(**DenseMF(dim=4, lr=0.1).params()).params() == DenseMF(dim=4, lr=0.1).params()
    with pytest.raises(TypeError):
        FactorizationModel()                          # abstract


def test_assigning_dp_takes_effect_at_the_next_noisy_step():
    d = data()
    cfg = DPConfig(noise_multiplier=0.0, batch_size=100)
    quiet, noisy = (SketchMF(dim=4, width=512, seed=6, dp=cfg) for _ in range(2))
    for m in (quiet, noisy):
        m.noisy_step(d.users[:100], d.items[:100], d.ratings[:100])   # builds the stepper
    noisy.dp = replace(cfg, noise_multiplier=5.0)
    for m in (quiet, noisy):
        m.noisy_step(d.users[:100], d.items[:100], d.ratings[:100])
    assert noisy.dp.noise_multiplier == 5.0 and noisy.dp_steps[0] == 2 and noisy.n_learned == 200
    assert np.abs(noisy.vectors.cells - quiet.vectors.cells).max() > 1e-3
    with pytest.raises(ValueError):
        noisy.dp = None
    with pytest.raises(ValueError):
        SketchMF(dim=4, width=512).dp = cfg
