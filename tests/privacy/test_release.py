"""The one release boundary (``privacy.release``): what the public routes, /metrics and the
covered ``--json`` block show in the DP modes — no figure that one rating changes unless noised."""

from __future__ import annotations

import numpy as np
import pytest
from fastapi.testclient import TestClient

from sketchrec.data import SyntheticStream
from sketchrec.models.private.dp_sgd import DPConfig
from sketchrec.models.private.fallback import with_fallback
from sketchrec.models.private.joint_als import JointDPConfig, PrivateALS
from sketchrec.models.sketch_mf import SketchMF
from sketchrec.privacy.access import UserTokens
from sketchrec.privacy.accounting import PrivacyLedger
from sketchrec.privacy.mode import PrivacyMode, mode_of
from sketchrec.privacy.release import operator_part, release
from sketchrec.replay.protocols import holdout
from sketchrec.stream.recommender import Recommender
from sketchrec.stream.serving.http import create_app
from sketchrec.stream.serving.joint import JointRecommender, JointService
from sketchrec.stream.service import LearningService

ADMIN = "backend-token"
TOKENS = UserTokens(b"release-test-key")
DATA = SyntheticStream(1500, n_users=60, n_items=40, seed=4).all()
EXACT = ("ratings", "steps", "train_kept", "stopped_by_budget")


def _joint_service(n: int) -> JointService:
    data = DATA.take(np.arange(n))
    model = PrivateALS(JointDPConfig(epsilon=4.0, rank=2, iterations=1, cap=20),
                       np.unique(DATA.items)).fit(data.users, data.items, data.ratings)
    return JointService(JointRecommender(model, data))


def _dp_service(noise: float = 2.0) -> LearningService:
    model = with_fallback(SketchMF(dim=4, width=512, seed=1, dp=DPConfig(noise, batch_size=200)), 64)
    service = LearningService(Recommender(model, pair_capacity=5000, seed=1))
    service.begin_private_pass("rating", 1e-5, None)
    service.recommender.learn_many(DATA.users, DATA.items, DATA.ratings)
    return service


def test_the_joint_mode_shows_no_model_size_on_anonymous_routes():
    """A joint model's size grows with its training ratings (one rating: 8 bytes)."""
    shown = []
    for n in (1000, 1001):
        with TestClient(create_app(_joint_service(n), ADMIN, TOKENS)) as c:
            stats, metrics = c.get("/stats").json(), c.get("/metrics").text
            assert "model_bytes" not in stats and "serving_bytes" not in stats
            assert "sketchrec_model_bytes" not in metrics
            shown.append((stats.keys(), c.get("/stats").json().get("operator_state")))
    assert shown[0] == shown[1] and "/admin/privacy" in shown[0][1]


def test_a_dp_sgd_service_shows_no_model_size_or_count_either():
    with TestClient(create_app(_dp_service(), ADMIN, TOKENS)) as c:
        stats, metrics = c.get("/stats").json(), c.get("/metrics").text
        assert not {"model_bytes", "ratings_learned", "offsets", "catalogue_items"} & stats.keys()
        assert "sketchrec_model_bytes" not in metrics and "sketchrec_catalogue_items" not in metrics
        admin = c.get("/admin/privacy", headers={"Authorization": f"Bearer {ADMIN}"}).json()
        assert admin["stats"]["model_bytes"] > 0   # operator state, behind the admin token


def test_an_unknown_users_ranking_in_a_dp_mode_ignores_the_exact_counts():
    """The count-min's counts are operator state: an unknown user's ranking comes from the
    released model, so piling counts on one item (without the model learning) changes nothing."""
    service = _dp_service()
    rec = service.recommender
    before, source = rec.recommend("never-seen", 5)
    assert source == "popular" and len(before) == 5
    released = rec.item_snapshot().biases + rec.model.global_mean
    assert [s for _, s in before] == sorted(released.tolist(), reverse=True)[:5]   # the model's scale
    ids, keys = rec.catalogue.snapshot()
    shown = [i for i, _ in before]
    j = next(n for n in np.argsort(released, kind="stable") if ids[n] not in shown)
    # an item the ranking leaves out, made by far the most rated (the model learns nothing of it)
    rec.popularity.add_many(np.full(5000, ids[j]), np.full(5000, keys[j], dtype=np.uint64))
    rec._popular = None
    after, _ = rec.recommend("never-seen", 5)
    assert after == before and ids[j] not in [i for i, _ in after]


def test_a_non_private_service_still_ranks_unknown_users_by_popularity():
    rec = Recommender(SketchMF(dim=4, width=512, seed=1), pair_capacity=5000, seed=1)
    rec.learn_many(DATA.users, DATA.items, DATA.ratings)
    items, source = rec.recommend("never-seen", 3)
    scores = [s for _, s in items]
    assert source == "popular" and scores == sorted(scores, reverse=True)
    assert scores[0] >= np.bincount(DATA.items).max()   # the (count-min) count of the most rated


def test_the_covered_json_block_holds_no_exact_count():
    """The sum of the Poisson batch sizes and N under an add/remove label would make N public:
    they go to the operator block beside the covered one."""
    model = with_fallback(SketchMF(dim=4, width=512, seed=1, dp=DPConfig(1.0, batch_size=200)), 64)
    out = holdout(model, DATA, 0.2, 1, seed=1, ledger=PrivacyLedger("rating", 1e-5), target_epsilon=4.0)
    covered, operator = out["dp_training"], out["operator"]["dp_training"]
    assert not set(EXACT) & covered.keys() and "operator" in covered["operator_state"]
    assert operator["train_kept"] == 1200 and operator["ratings"] > 0 and set(EXACT) <= operator.keys()
    assert covered["fallback"]["serving"]   # the DP choice (a noised release) stays covered
    # the plan's figures are made from the training size's noised release, never from N
    assert covered["released_train_size"] != 1200
    assert covered["sampling_rate"] == 200 / covered["released_train_size"]


@pytest.mark.parametrize("mode", [m for m in PrivacyMode if m.central])
def test_release_keeps_only_public_or_noised_fields_and_fails_closed(mode):
    values = {"epsilon": 1.0, "model_bytes": 10, "ratings_learned": 3, "something_new": 1,
              "dp": {"clip": 1.0, "train_kept": 9}}
    out = release(mode, values)
    assert out["epsilon"] == 1.0 and out["dp"] == {"clip": 1.0}
    assert not {"model_bytes", "ratings_learned", "something_new"} & out.keys()
    assert operator_part(mode, values) == {"model_bytes": 10, "ratings_learned": 3,
                                           "something_new": 1, "dp": {"train_kept": 9}}


def test_every_learner_declares_its_mode():
    dp = SketchMF(dim=4, width=512, dp=DPConfig(1.0, unit="user", user_cap=5))
    assert with_fallback(dp, 64).privacy_mode is mode_of(dp) is PrivacyMode.DP_SGD_USER
    assert SketchMF(dim=4, width=512, sgld_temperature=1.0).privacy_mode is PrivacyMode.SGLD
    joint = PrivateALS(JointDPConfig(unit="rating"), np.arange(3))
    assert joint.privacy_mode is PrivacyMode.JOINT_RATING
    assert _dp_service(0.0).privacy_mode is PrivacyMode.DP_SGD_RATING


def _checkpoint_manifest(tmp_path, data, monkeypatch) -> dict:
    """A DP service's checkpoint, as its public part shows it (the clock fixed)."""
    from sketchrec.stream import checkpoint as checkpoint_module
    from sketchrec.stream.checkpoint import CheckpointStore
    from sketchrec.privacy.release import service_mode
    monkeypatch.setattr(checkpoint_module, "time", type("Clock", (), {"time": staticmethod(lambda: 1e9)}))
    model = with_fallback(SketchMF(dim=4, width=512, seed=1, dp=DPConfig(2.0, batch_size=200)), 64)
    service = LearningService(Recommender(model, pair_capacity=5000, seed=1),
                              CheckpointStore(tmp_path / str(len(list(tmp_path.iterdir())))))
    service.begin_private_pass("rating", 1e-5, None)
    service.recommender.learn_many(data.users, data.items, data.ratings)
    service.checkpoint()
    return service.checkpoints.latest().public(service_mode(service))


def _replaced(data):
    """``data`` with one rating's value replaced (replace-one, same position)."""
    ratings = data.ratings.copy()
    ratings[7] = 1.0 if ratings[7] > 3 else 5.0
    return type(data)(data.users, data.items, ratings, data.timestamps)


def test_the_public_part_of_a_dp_checkpoint_is_released_values_only(tmp_path, monkeypatch):
    """Replace one rating: the checkpoint's public part (metadata, part sizes) is the same; its
    exact counts, offsets and part sizes are not in it, the spent epsilon is."""
    a = _checkpoint_manifest(tmp_path, DATA, monkeypatch)
    b = _checkpoint_manifest(tmp_path, _replaced(DATA), monkeypatch)
    assert a == b and a["epsilon"] > 0 and a["model_class"] == "DPSGDFallback"
    assert not {"ratings_learned", "offsets", "skipped", "part_bytes", "privacy_ledger"} & a.keys()


def test_a_checkpoint_shown_without_the_boundary_leaks_the_rating(tmp_path, monkeypatch):
    """The deliberately broken variant: the header shown as stored (no release) differs with one
    replaced rating (the prequential errors), and shows the exact count."""
    from sketchrec.privacy import release as release_module
    monkeypatch.setattr(release_module, "release", lambda mode, values: dict(values))
    a = _checkpoint_manifest(tmp_path, DATA, monkeypatch)
    b = _checkpoint_manifest(tmp_path, _replaced(DATA), monkeypatch)
    assert a != b and a["ratings_learned"] == len(DATA)
