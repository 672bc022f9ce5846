"""The heavy-hitter filter in front of SketchMF's count sketch: exchanges keep the model exact,
admission finds the heavy ids, state survives checkpoints, memory stays fixed, DP refuses it."""

import numpy as np
import pytest

from sketchrec.models import DenseMF, SketchMF
from sketchrec.models.base import ITEM, USER
from sketchrec.sketches import keys_of
from sketchrec.models.heavy_filter import WAYS, slot_bytes
from sketchrec.data import SyntheticStream

HUGE_WIDTH = 1 << 24  # no collisions among 100 ids (800 components): p ~ 0.06 for any seed; none here


def stream(n=4000, users=300, items=150, seed=0):
    return SyntheticStream(n_ratings=n, n_users=users, n_items=items, seed=seed).all()


def test_exchanges_between_filter_and_sketch_lose_nothing():
    # without collisions the sketch is exact, so a model whose ids move in and out of a tiny
    # filter must compute exactly what DenseMF computes, rating after rating
    data = stream(users=60, items=40)
    kw = dict(dim=8, lr=0.05, reg=0.02, init_std=0.1, seed=3)
    sketch = SketchMF(width=HUGE_WIDTH, depth=3, heavy_slots=16, **kw)  # far fewer slots than ids
    dense = DenseMF(**kw)
    half = len(data) // 2
    pred_s = sketch.learn_many(data.users[:half], data.items[:half], data.ratings[:half])
    monitored_at_half = set(sketch.heavy.keys[sketch.heavy.counts > 0].tolist())
    pred_s = np.concatenate([pred_s, sketch.learn_many(data.users[half:], data.items[half:],
                                                       data.ratings[half:])])
    pred_d = dense.learn_many(data.users, data.items, data.ratings)
    np.testing.assert_allclose(pred_s, pred_d, rtol=0, atol=1e-5)
    users = np.unique(data.users)
    np.testing.assert_allclose(sketch.user_vectors(users),
                               dense._tables[USER].vectors[dense._rows(keys_of(users), USER, False)],
                               atol=1e-5)
    # the filter was full and its membership changed: exchanges did happen
    assert sketch.heavy.n_used == sketch.heavy.n_slots == 16
    assert set(sketch.heavy.keys[sketch.heavy.counts > 0].tolist()) != monitored_at_half


def test_admission_keeps_the_heaviest_ids():
    data = stream(n=60_000, users=5000, items=2000, seed=1)
    model = SketchMF(dim=8, width=4096, heavy_fraction=0.5)
    model.learn_many(data.users, data.items, data.ratings)
    slots = model.heavy.n_slots
    assert model.heavy.n_used == slots
    held = set(zip(model.heavy.keys[model.heavy.counts > 0].tolist(),
                   model.heavy.families[model.heavy.counts > 0].tolist()))
    ids, counts = [], []
    for family, column in ((USER, data.users), (ITEM, data.items)):
        keys, n = np.unique(keys_of(column), return_counts=True)
        ids += [(int(k), family) for k in keys]
        counts += n.tolist()
    order = np.argsort(counts)[::-1]
    top = [ids[i] for i in order[: slots // 4]]
    share_top = np.mean([t in held for t in top])
    assert share_top >= 0.9, share_top
    # ... and the held ids carry far more of the stream than as many average ids would
    by_id = dict(zip(ids, counts))
    held_ratings = sum(by_id.get(h, 0) for h in held)
    assert held_ratings > 3 * slots * (2 * len(data)) / len(ids)


def test_filter_state_survives_a_checkpoint_bit_exactly():
    data = stream(seed=2)
    make = lambda: SketchMF(dim=8, width=512, depth=3, seed=1, heavy_slots=32)  # noqa: E731
    straight = make()
    straight.learn_many(data.users, data.items, data.ratings)
    half = len(data) // 2
    first = make()
    first.learn_many(data.users[:half], data.items[:half], data.ratings[:half])
    resumed = SketchMF.from_bytes(first.to_bytes())
    assert resumed.heavy.n_slots == 32
    resumed.learn_many(data.users[half:], data.items[half:], data.ratings[half:])
    np.testing.assert_array_equal(resumed.heavy.keys, straight.heavy.keys)
    np.testing.assert_array_equal(resumed.heavy.counts, straight.heavy.counts)
    np.testing.assert_array_equal(resumed.vectors.cells, straight.vectors.cells)
    np.testing.assert_array_equal(resumed.predict_many(data.users[:50], data.items[:50]),
                                  straight.predict_many(data.users[:50], data.items[:50]))


def test_a_checkpoint_from_before_the_filter_still_loads_as_a_pure_sketch():
    from sketchrec.sketches import serial
    data = stream(seed=5)
    old = SketchMF(dim=8, width=512, heavy_fraction=0.0, seed=1)
    old.learn_many(data.users, data.items, data.ratings)
    params = {k: v for k, v in old.params().items()
              if k not in ("heavy_fraction", "heavy_slots", "light_dim")}
    arrays = {k: v for k, v in old._state_arrays().items() if not k.startswith("filter_")}
    blob = serial.pack("SketchMF", params, {"stats": old.stats, "counters": old.counters, **arrays})
    loaded = SketchMF.from_bytes(blob)
    assert loaded.heavy.n_slots == 0 and loaded.light_dim == 8
    np.testing.assert_array_equal(loaded.predict_many(data.users[:50], data.items[:50]),
                                  old.predict_many(data.users[:50], data.items[:50]))


def test_predictions_read_through_the_filter_like_the_factors():
    data = stream(seed=3)
    model = SketchMF(dim=8, width=256, heavy_fraction=0.3, seed=2)
    model.learn_many(data.users, data.items, data.ratings)
    assert 0 < model.heavy.n_used
    users, items = data.users[:200], data.items[:200]
    p, bu = model.factors(users, USER)
    q, bi = model.factors(items, ITEM)
    expected = model.global_mean + bu + bi + np.einsum("ij,ij->i", p, q)
    np.testing.assert_allclose(model.predict_many(users, items, clip=False), expected, atol=1e-9)


def test_memory_is_split_not_added_and_stays_fixed():
    plain = SketchMF(dim=16, width=8192, heavy_fraction=0.0)
    split = SketchMF(dim=16, width=8192, heavy_fraction=0.5)
    assert split.heavy.n_slots % WAYS == 0 and split.heavy.n_slots > 0
    assert split.heavy.nbytes <= 0.5 * plain.vectors.nbytes
    assert abs(split.nbytes - plain.nbytes) <= 4 * split.depth + slot_bytes(16) * WAYS
    before = split.nbytes
    for seed in range(3):
        data = stream(n=5000, users=20_000, items=3000, seed=seed)
        split.learn_many(data.users + seed * 10**6, data.items, data.ratings)
    assert split.nbytes == before


def test_light_ids_keep_only_light_dim_components():
    data = stream(seed=4)
    model = SketchMF(dim=8, width=4096, heavy_fraction=0.0, light_dim=3, seed=1)
    model.learn_many(data.users, data.items, data.ratings)
    from sketchrec.models._sgd import init_rows
    users = np.unique(data.users)
    learned = model.user_vectors(users) - init_rows(keys_of(users), model._init_salts[USER],
                                                    model.init_std)
    assert np.abs(learned[:, :3]).max() > 1e-3
    np.testing.assert_array_equal(learned[:, 3:], 0.0)


def test_light_dim_follows_the_memory_left_for_light_ids():
    # gamma <= 1 leaves room for every component; higher gamma keeps fewer
    roomy = SketchMF(dim=64, capacity=2625, space_gain=1.0)
    tight = SketchMF(dim=64, capacity=2625, space_gain=4.0)
    assert roomy.light_dim > 32 and tight.light_dim < 16
    assert SketchMF(dim=64, width=4096).light_dim == 64  # no capacity: no estimate


def test_privacy_modes_keep_the_pure_sketch_unless_told():
    assert SketchMF(dim=8, width=256).heavy.n_slots > 0
    assert SketchMF(dim=8, width=256, clip_loss=1.0).heavy.n_slots == 0
    assert SketchMF(dim=8, width=256, sgld_temperature=0.1).heavy.n_slots == 0
    assert SketchMF(dim=8, width=256, clip_loss=1.0, heavy_fraction=0.5).heavy.n_slots > 0


def test_replay_refuses_a_filter_with_dp_sgd_and_bad_filter_options():
    from sketchrec.cli import replay_main
    with pytest.raises(SystemExit) as stop:
        replay_main(["--synthetic-ratings", "1000", "--dp-noise", "1.0", "--heavy-fraction", "0.5", "--quiet"])
    assert "heavy-hitter filter" in str(stop.value) and stop.value.code == 2
    for option, value, says in (("--light-dim", "65", "light_dim"), ("--heavy-fraction", "1.5", "heavy_fraction")):
        with pytest.raises(SystemExit) as stop:
            replay_main(["--synthetic-ratings", "1000", option, value, "--quiet"])
        assert str(stop.value).startswith("replay: ") and says in str(stop.value).replace("-", "_")


def test_dp_keeps_no_filter():
    dp = {"noise_multiplier": 1.0, "batch_size": 10, "rating_range": (1.0, 5.0)}
    assert SketchMF(dim=8, width=256, dp=dp).heavy.n_slots == 0
    with pytest.raises(ValueError, match="heavy_fraction"):
        SketchMF(dim=8, width=256, dp=dp, heavy_fraction=0.5)
    with pytest.raises(ValueError, match="light_dim"):
        SketchMF(dim=8, width=256, dp=dp, light_dim=4)
    with pytest.raises(ValueError):
        SketchMF(dim=8, width=256, heavy_fraction=1.0)
    with pytest.raises(ValueError):
        SketchMF(dim=8, width=256, light_dim=9)
