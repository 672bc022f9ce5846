"""A replay hands its monitored learner each id's public key, hashed once per distinct id: the
same keys the learner would make, so the same result; ids it cannot table stay ids."""

from __future__ import annotations

import json

import numpy as np
import pytest

from sketchrec.cli import replay
from sketchrec.data import Ratings
from sketchrec.replay.batches import MAX_TABLE, hashed_once
from sketchrec.sketches.hashing import keys_of


def test_the_keys_are_the_public_hash_of_every_id():
    rng = np.random.default_rng(1)
    data = Ratings(rng.integers(-50, 400, 5_000), rng.integers(10**12, 10**12 + 900, 5_000),
                   rng.random(5_000), np.zeros(5_000, np.int64))
    batches = list(hashed_once(data.batches(1_000), data))
    assert np.array_equal(np.concatenate([b.users for b in batches]), keys_of(data.users))
    assert np.array_equal(np.concatenate([b.items for b in batches]), keys_of(data.items))
    assert np.array_equal(np.concatenate([b.ratings for b in batches]), data.ratings)


def test_text_ids_held_as_codes_are_hashed_once_per_distinct_id():
    import pyarrow as pa

    from sketchrec.text_ids import Coded, Vocabulary
    rng = np.random.default_rng(3)
    users = np.array([f"user-{x}" for x in rng.integers(0, 300, 5_000)], object)
    vocab = Vocabulary()
    data = Ratings(Coded(vocab.codes(pa.array(users.tolist())), vocab), rng.integers(1, 90, 5_000),
                   rng.random(5_000), np.zeros(5_000, np.int64))
    batches = list(hashed_once(data.batches(1_000), data))
    assert np.array_equal(np.concatenate([b.users for b in batches]), keys_of(users))
    assert np.array_equal(np.concatenate([b.items for b in batches]), keys_of(data.items))
    # an audit canary's id among them: the rows keep their ids (evaluation must see which they are)
    canary = Coded(vocab.codes(pa.array(["__canary__u0", "user-1"])), vocab)
    data = Ratings(canary, np.arange(2), np.ones(2), np.zeros(2, np.int64))
    assert next(hashed_once(data.batches(2), data)).users.tolist() == ["__canary__u0", "user-1"]


def test_ids_it_cannot_table_stay_ids():
    ints = np.arange(10)
    for users in (np.array(["a", "b"] * 5, object), np.arange(10) * MAX_TABLE, np.arange(10) * 3):
        data = Ratings(users, ints, np.ones(10), np.zeros(10, np.int64))
        batch = next(hashed_once(data.batches(10), data))
        assert batch.users is data.users or np.array_equal(batch.users, data.users)
    assert next(hashed_once(iter([data]), None)) is data   # a streamed file: no columns to table


def _replay(path, monkeypatch, once: bool, *extra) -> dict:
    monkeypatch.setattr(replay, "_hashes_as_wrapped", lambda run, real=replay._hashes_as_wrapped:
                        real(run) if once else False)
    seen = []
    monkeypatch.setattr(replay, "hashed_once", lambda b, d, real=replay.hashed_once: (
        seen.append(True), real(b, d))[1])
    out = {}
    monkeypatch.setattr(replay, "to_json", lambda result: out.update(result) or "{}")
    assert replay.replay_main([str(path), "--json", "--quiet", *extra]) == 0
    return {"result": {k: v for k, v in out.items() if k not in ("seconds", "throughput_per_s", "rss_mb",
                                                                 "rss_samples")}, "tabled": bool(seen)}


@pytest.mark.parametrize("prefix", ["", "user-"])
def test_a_replay_learns_the_same_with_the_ids_hashed_once(tmp_path, monkeypatch, capsys, prefix):
    rng = np.random.default_rng(2)
    path = tmp_path / "r.csv"
    path.write_text("userId,movieId,rating,timestamp\n" + "".join(
        f"{prefix}{u},{i},{r},{t}\n" for u, i, r, t in zip(rng.integers(1, 300, 4_000), rng.integers(1, 200, 4_000),
                                                  rng.integers(1, 11, 4_000) / 2, rng.integers(0, 10**6, 4_000))))
    once, every = _replay(path, monkeypatch, True), _replay(path, monkeypatch, False)
    assert once["tabled"] and not every["tabled"]
    assert json.dumps(once["result"], default=str) == json.dumps(every["result"], default=str)


def test_only_a_monitored_learner_under_the_public_hash_is_handed_keys():
    from types import SimpleNamespace

    from sketchrec.models import SketchMF
    from sketchrec.models.wrapped import Wrapped
    from sketchrec.privacy.keys import IdKey, IdKeys
    from sketchrec.scale import ScaleFree, ScaleMap
    model = SketchMF(capacity=50, dim=4)
    config = SimpleNamespace(evaluation=SimpleNamespace(topn=None))
    run = SimpleNamespace(learner=ScaleFree(Wrapped(model), ScaleMap.for_range((-10.0, 10.0))), config=config)
    assert replay._hashes_as_wrapped(run)
    assert not replay._hashes_as_wrapped(SimpleNamespace(learner=model, config=config))   # its own ids
    assert not replay._hashes_as_wrapped(SimpleNamespace(
        learner=run.learner, config=SimpleNamespace(evaluation=SimpleNamespace(topn=10))))
    model.id_keys = IdKeys(IdKey(bytes(range(32))))   # a secret key: the public keys would be others
    assert not replay._hashes_as_wrapped(run)
