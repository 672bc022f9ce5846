"""A learning member's kernels called once at start-up on throwaway replicas (stream/fleet/warm.py)."""

import logging

import numpy as np

from sketchrec.models import SketchMF
from sketchrec.stream.fleet.warm import warm
from sketchrec.stream.recommender import Recommender


def _parts(**model) -> dict:
    rec = Recommender(SketchMF(dim=4, capacity=200, **model), pair_capacity=1000)
    rec.learn_many(np.arange(20), np.arange(20) % 7, np.full(20, 4.0))
    return rec.state_parts()


def test_warm_learns_takes_and_applies_on_copies_and_leaves_the_snapshot_as_it_was():
    parts = _parts()
    before = {name: bytes(part) for name, part in parts.items()}
    assert warm(parts, SketchMF)
    assert {name: bytes(part) for name, part in parts.items()} == before
    restored = Recommender.from_parts(parts, SketchMF)
    assert restored.model.n_learned == 20   # what the member starts from: the snapshot, unchanged


def test_a_model_in_a_privacy_mode_is_not_warmed():
    """Nothing is learned outside the member's own accounting."""
    assert not warm(_parts(clip_loss=1.0), SketchMF)


def test_a_failed_warm_up_is_one_log_line_and_changes_nothing(caplog):
    with caplog.at_level(logging.WARNING):
        assert not warm({"serving": b"not json"}, SketchMF)
    assert any("event=warm_failed" in r.getMessage() for r in caplog.records)


def test_warm_restores_the_snapshot_once_and_applies_a_delta_on_a_small_fresh_model(monkeypatch):
    """Learning and a take on one restored copy; the apply on a small fresh model of the same
    class and parameters (a second restored copy would cost the model's size again)."""
    from sketchrec.stream.fleet import warm as module
    from sketchrec.stream.fleet.deltas import ModelReplica
    restores, applied = [], []
    from_parts, apply = Recommender.from_parts.__func__, ModelReplica.apply
    monkeypatch.setattr(module.Recommender, "from_parts",
                        classmethod(lambda cls, *a, **k: restores.append(1) or from_parts(cls, *a, **k)))
    monkeypatch.setattr(ModelReplica, "apply",
                        lambda self, arrays: applied.append((self.model, arrays)) or apply(self, arrays))
    parts = _parts(width=4000)
    assert warm(parts, SketchMF)
    assert len(restores) == 1 and len(applied) == 1
    model, arrays = applied[0]
    assert model.width < 4000 and model.dim == 4 and type(model) is SketchMF
    assert "slot_keys" in arrays or "announce_keys" in arrays   # the slots' kernels ran too
