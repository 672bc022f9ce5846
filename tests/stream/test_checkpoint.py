"""Model state to bytes and back, and checkpoints that survive corruption and truncation."""

import time

import numpy as np
import pytest

from sketchrec.models import DenseMF, SketchMF
from sketchrec.stream.checkpoint import CheckpointStore
from sketchrec.stream.recommender import Recommender
from sketchrec.data import SyntheticStream


def halves():
    data = SyntheticStream(n_ratings=6000, n_users=300, n_items=150, seed=2).all()
    return data.take(slice(0, 3000)), data.take(slice(3000, None))


@pytest.mark.parametrize("make", [lambda: SketchMF(capacity=450, dim=8, sgld_temperature=None),
                                  lambda: DenseMF(dim=8)])
def test_model_round_trip_continues_bit_exactly(make):
    first, second = halves()
    model = make()
    model.learn_many(first.users, first.items, first.ratings)
    back = type(model).from_bytes(model.to_bytes())
    assert back.params() == model.params() and back.n_learned == 3000
    assert np.array_equal(back.predict_many(second.users, second.items),
                          model.predict_many(second.users, second.items))
    # learning on from the restored state is identical to learning on from the original
    a = model.learn_many(second.users, second.items, second.ratings)
    b = back.learn_many(second.users, second.items, second.ratings)
    assert np.array_equal(a, b) and back.to_bytes() == model.to_bytes()


def test_wrong_model_kind_is_refused():
    with pytest.raises(ValueError):
        DenseMF.from_bytes(SketchMF(width=64, dim=4).to_bytes())


def test_store_falls_back_past_corrupt_and_truncated_checkpoints(tmp_path):
    store = CheckpointStore(tmp_path, keep=3)
    for n in range(1, 4):
        store.save({"a": bytes([n]) * 100, "b": b"x" * n}, {"n": n})
    assert store.latest().meta["n"] == 3 and store.latest().parts["b"] == b"xxx"
    files = sorted(tmp_path.glob("ckpt-*.skc"))
    assert len(files) == 3
    newest = files[-1].read_bytes()
    files[-1].write_bytes(newest[:-10])                       # truncated
    assert store.latest().meta["n"] == 2
    middle = bytearray(files[-2].read_bytes())
    middle[-5] ^= 0xFF                                        # one flipped byte
    files[-2].write_bytes(bytes(middle))
    assert store.latest().meta["n"] == 1
    with pytest.raises(ValueError, match="checksum"):
        CheckpointStore.read(files[-2])


def test_store_keeps_the_newest_and_ignores_temp_files(tmp_path):
    store = CheckpointStore(tmp_path, keep=2)
    (tmp_path / "ckpt-000000000009.tmp").write_bytes(b"half-written")
    for n in range(5):
        store.save({"p": b"%d" % n}, {"n": n})
    assert [p.name for p in sorted(tmp_path.glob("ckpt-*.skc"))] == ["ckpt-000000000004.skc",
                                                                     "ckpt-000000000005.skc"]
    assert store.latest().seq == 5 and store.latest().meta["n"] == 4
    assert CheckpointStore(tmp_path / "empty").latest() is None
    with pytest.raises(ValueError):
        CheckpointStore(tmp_path, keep=1)


def test_recommender_state_round_trip_serves_the_same_answers():
    data = SyntheticStream(n_ratings=8000, n_users=200, n_items=120, seed=4).all()
    rec = Recommender(SketchMF(capacity=320, dim=8), pair_capacity=20_000)
    rec.learn_many(data.users, data.items, data.ratings)
    back = Recommender.from_parts(rec.state_parts(), SketchMF)
    for user in (int(data.users[0]), int(data.users[-1]), "stranger"):
        assert back.recommend(user, 10) == rec.recommend(user, 10)
    assert back.catalogue.snapshot()[0] == rec.catalogue.snapshot()[0]


def test_item_snapshot_refreshes_only_when_learned_and_due(monkeypatch):
    data = SyntheticStream(n_ratings=4000, n_users=100, n_items=80, seed=6).all()
    rec = Recommender(SketchMF(capacity=180, dim=8), pair_capacity=10_000, refresh_s=3600)
    rec.learn_many(data.users[:2000], data.items[:2000], data.ratings[:2000])
    first = rec.item_snapshot()
    assert rec.item_snapshot() is first                       # nothing learned since
    rec.learn_many(data.users[2000:], data.items[2000:], data.ratings[2000:])
    assert rec.item_snapshot() is first                       # learned, but not due for an hour
    rec.refresh_s = 0.0
    # due also waits 10 x the last build's cost (a back-off that a loaded machine's slow first
    # build made the test's next call miss): read it an hour on, as on any machine
    later = time.monotonic() + 3600
    monkeypatch.setattr(time, "monotonic", lambda: later)
    fresh = rec.item_snapshot()
    assert fresh is not first and fresh.learned == 4000
    vectors, biases = rec.model.factors(fresh.keys, 1)
    np.testing.assert_allclose(fresh.vectors, vectors, atol=1e-6)
    np.testing.assert_allclose(fresh.biases, biases)
