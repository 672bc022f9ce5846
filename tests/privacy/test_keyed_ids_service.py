"""End to end: in a DP mode the service keys ids under its secret id key, so an id forged offline
to collide with another user's under the public hash (MurmurHash3) is a stranger to the model;
the key is operator state, carried by checkpoints and shown on no public route. With the key
disabled (the broken variant) the same forged id is served the other user's history."""

from __future__ import annotations

import json

import numpy as np
import pytest
from fastapi.testclient import TestClient

from sketchrec.data import SyntheticStream
from sketchrec.models.private.dp_sgd import DPConfig
from sketchrec.models.private.fallback import with_fallback
from sketchrec.models.sketch_mf import SketchMF
from sketchrec.privacy import keys as id_keys_module
from sketchrec.privacy.access import UserTokens
from sketchrec.privacy.keys import ID_KEY_PART
from sketchrec.privacy.mode import mode_of
from sketchrec.sketches.hashing import key_of
from sketchrec.stream.checkpoint import CheckpointStore
from sketchrec.stream.recommender import Recommender
from sketchrec.stream.serving.http import create_app
from sketchrec.stream.service import LearningService
from tests.privacy.test_keyed_ids import forge

ADMIN = "backend-token"
TOKENS = UserTokens(b"keyed-ids-test-key")
VICTIM = 405
DATA = SyntheticStream(3000, n_users=60, n_items=50, seed=7).all()


def _ratings():
    """The synthetic stream plus the victim's own history (items 0..19, all liked)."""
    users = np.concatenate([DATA.users.astype(object), np.full(20, VICTIM, dtype=object)])
    items = np.concatenate([DATA.items.astype(object), np.arange(20).astype(object)])
    return users, items, np.concatenate([DATA.ratings, np.full(20, 5.0)])


def _dp_service(directory=None) -> LearningService:
    model = with_fallback(SketchMF(dim=4, width=512, seed=1,
                                   dp=DPConfig(1.0, batch_size=200)), 64)
    assert mode_of(model).private
    service = LearningService(Recommender(model, pair_capacity=5000, seed=1),
                              CheckpointStore(directory) if directory is not None else None)
    service.begin_private_pass("rating", 1e-5, None)
    service.recommender.learn_many(*_ratings())
    # the baseline answers every user alike; the factor model's answers are what could leak
    service.recommender.model.chose_factors = True
    return service


def _forged() -> bytes:
    forged = forge(key_of(VICTIM), split=0xDEADBEEF)
    assert forged != str(VICTIM).encode() and key_of(forged) == key_of(VICTIM)
    return forged


def _leaks(rec: Recommender) -> bool:
    """Whether the forged id is served as the victim: their ranking (from their history) and
    their predictions."""
    forged, items = _forged(), list(range(30))
    same_ranking = rec.recommend(forged, 10) == rec.recommend(VICTIM, 10)
    same_predictions = [rec.predict(forged, i) for i in items] == [rec.predict(VICTIM, i) for i in items]
    return same_ranking and same_predictions


def test_a_forged_collision_is_a_stranger_in_a_dp_service():
    rec = _dp_service().recommender
    assert rec.id_keys.keyed
    assert rec.id_keys.key_of(_forged()) != rec.id_keys.key_of(VICTIM)
    ranking, source = rec.recommend(_forged(), 10)
    assert source == "popular"                          # unknown: no one's history behind it
    assert rec.recommend(VICTIM, 10)[1] != "popular"     # the victim is known
    assert not _leaks(rec)


def test_with_the_key_disabled_the_forged_id_is_served_the_victims_history(monkeypatch):
    """The broken variant (the public hash in a DP mode, as before): the attack succeeds."""
    monkeypatch.setattr(id_keys_module, "id_key_for", lambda mode, stored=None: None)
    rec = _dp_service().recommender
    assert not rec.id_keys.keyed
    assert rec.recommend(_forged(), 10)[1] != "popular" and _leaks(rec)


def test_the_id_key_survives_a_checkpoint_and_is_on_no_public_surface(tmp_path):
    service = _dp_service(tmp_path)
    rec = service.recommender
    secret = rec.id_keys.id_key.to_bytes()
    path = service.checkpoint()["path"]
    back = LearningService.from_checkpoint(tmp_path).recommender
    assert back.id_keys.id_key.to_bytes() == secret     # restored, not drawn afresh
    users, items = _ratings()[0][::50], _ratings()[1][::50]
    assert back.predict_many(users, items).tolist() == rec.predict_many(users, items).tolist()
    assert back.recommend(VICTIM, 10) == rec.recommend(VICTIM, 10)
    assert back.recommend(_forged(), 10)[1] == "popular"
    # in the checkpoint: its own operator part only (not the model's bytes, not the metadata)
    ckpt = CheckpointStore.read(type(tmp_path)(path))
    assert ckpt.parts[ID_KEY_PART] == secret
    assert not any(secret[8:] in blob for name, blob in ckpt.parts.items() if name != ID_KEY_PART)
    assert secret[8:].hex() not in json.dumps(ckpt.meta)
    # and on no public route (every GET without parameters, the admin ones excepted)
    with TestClient(create_app(service, ADMIN, TOKENS)) as client:
        paths = [r.path for r in client.app.routes if "GET" in getattr(r, "methods", ())
                 and "{" not in r.path and not r.path.startswith("/admin")]
        assert {"/stats", "/metrics", "/privacy"} <= set(paths)
        for route in paths:
            body = client.get(route).content
            assert secret[8:] not in body and secret[8:].hex().encode() not in body, route


@pytest.mark.parametrize("model", [SketchMF(dim=4, width=256, seed=1),
                                   SketchMF(dim=4, width=256, seed=1, clip_loss=1.0)])
def test_every_privacy_mode_keys_ids_and_the_non_private_mode_keeps_the_public_hash(model):
    keyed = mode_of(model).private
    assert model.id_keys.keyed == keyed
    assert (model.id_keys.key_of(VICTIM) == key_of(VICTIM)) == (not keyed)


def test_a_debug_noise_seed_derives_the_id_key_and_a_fresh_run_draws_its_own():
    """Neighbouring runs of the harness share a debug-seeded key (no guarantee, like the noise);
    without the debug seed every model draws its own."""
    def model(seed=None):
        return SketchMF(dim=4, width=256, seed=1, dp=DPConfig(1.0, debug_noise_seed=seed))
    assert model(3).id_keys.key_of(VICTIM) == model(3).id_keys.key_of(VICTIM) != model(4).id_keys.key_of(VICTIM)
    assert model().id_keys.key_of(VICTIM) != model().id_keys.key_of(VICTIM)


def test_a_service_fed_perturbed_ratings_keys_ids_and_keeps_the_key_across_a_checkpoint(tmp_path):
    """Local DP is the stream's mode: the first perturbed ratings give a fresh model a key."""
    from sketchrec.privacy.ldp import HEADER, DeviceRandomiser
    service = LearningService(Recommender(SketchMF(dim=4, width=512, seed=1), pair_capacity=5000),
                              CheckpointStore(tmp_path))
    users, items, ratings = _ratings()
    service.record_origin([(HEADER, DeviceRandomiser(2.0, 1.0, 5.0).header())], len(ratings))
    service.recommender.learn_many(users, items, ratings)
    rec = service.recommender
    assert service.privacy_mode.value == "ldp" and rec.id_keys.keyed
    assert rec.recommend(_forged(), 10)[1] == "popular" != rec.recommend(VICTIM, 10)[1]
    service.checkpoint()
    back = LearningService.from_checkpoint(tmp_path).recommender
    assert back.id_keys.id_key.to_bytes() == rec.id_keys.id_key.to_bytes()
    assert back.recommend(VICTIM, 10) == rec.recommend(VICTIM, 10)
