"""Every privacy guarantee true against an adversary who knows everything released.

Fresh noise, the release vs operator-state line, access control, public model shape, the named
neighbouring relation, the ledger under the checkpoint's checksum, and LDP's declared range.
The replay tests go through the CLI, which wires the library functions in."""

from __future__ import annotations

import json

import numpy as np
import pytest
from fastapi.testclient import TestClient

from sketchrec.models import SketchMF
from sketchrec.models.private.dp_sgd import DPConfig
from sketchrec.privacy.access import UserTokens, mint_user_token
from sketchrec.privacy.accounting import PrivacyLedger, describe
from sketchrec.privacy.ldp import LDPSettings, declared_range
from sketchrec.privacy.monitor import PrivacyMonitor
from sketchrec.privacy.release import DEFAULT_DP_CAPACITY, check_public_shape, public_capacity
from sketchrec.privacy.report import privacy_figures
from sketchrec.stream.checkpoint import CheckpointStore, LedgerIntegrityError, continue_ledger
from sketchrec.stream.serving.http import create_app
from sketchrec.stream.recommender import Recommender
from sketchrec.stream.service import LearningService
from sketchrec.data import SyntheticStream

ADMIN = "backend-token"
KEY = b"k" * 32
SYNTH = ["--synthetic-ratings", "6000", "--synthetic-users", "200", "--synthetic-items", "120",
         "--quiet", "--json"]


def _replay(capsys, *argv) -> dict:
    from sketchrec.cli import replay_main  # late: the CLI module is being reorganised
    assert replay_main(list(argv)) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def dp_model(**kw) -> SketchMF:
    return SketchMF(dim=8, width=1024, seed=3, dp=DPConfig(noise_multiplier=4.0, batch_size=500, **kw))


def dp_service(tmp_path=None, unit="rating"):
    extra = {"unit": "user", "user_cap": 5} if unit == "user" else {}
    rec = Recommender(dp_model(**extra), pair_capacity=10_000, seed=1,
                      monitor=PrivacyMonitor(window=500, probe_every=500, reservoir=50))
    service = LearningService(rec, CheckpointStore(tmp_path) if tmp_path else None)
    service.begin_private_pass(unit, 1e-5, None)
    data = SyntheticStream(n_ratings=3000, n_users=100, n_items=80, seed=2).all()
    rec.learn_many(data.users, data.items, data.ratings)
    return service, data


# --- D1/D2: fresh noise ---------------------------------------------------------------------------

def test_two_private_runs_differ_and_two_non_private_runs_are_identical(capsys):
    dp = ["--holdout", "0.2", "--epochs", "2", "--seed", "3", "--dp-epsilon", "1", *SYNTH]
    assert _replay(capsys, *dp)["rmse"] != _replay(capsys, *dp)["rmse"]
    plain = ["--holdout", "0.2", "--epochs", "2", "--seed", "3", *SYNTH]
    assert _replay(capsys, *plain)["rmse"] == _replay(capsys, *plain)["rmse"]


def test_debug_seeded_noise_voids_the_guarantee():
    model = dp_model(debug_noise_seed=3)
    ledger = PrivacyLedger("rating", 1e-5)
    ledger.begin_pass(model.dp.stream_multiplier())
    figures = privacy_figures(model, ledger=ledger)
    assert figures["proven_bound"] is False and figures["epsilon"] == float("inf")
    assert figures["guarantee"].startswith("none: reproducible noise")


# --- D5: the neighbouring relation ---------------------------------------------------------------

def test_the_guarantee_names_its_neighbouring_relation():
    stream = PrivacyLedger("rating", 1e-5)
    stream.begin_pass(4.0)
    s = describe(stream)
    assert s["privacy_unit"] == "replace-one rating (stream length public)"
    assert "one rating replaced by another (the stream's length is public)" in s["guarantee"]
    epoch = PrivacyLedger("user", 1e-5)
    epoch.record(1.0, 0.1, 10)
    e = describe(epoch)
    assert e["privacy_unit"] == "add/remove user" and "one user added or removed" in e["guarantee"]
    with pytest.raises(ValueError, match="cannot be composed"):
        epoch.begin_pass(4.0)
    assert PrivacyLedger.from_dict(stream.to_dict()).relation == "replace-one"


# --- D6/D8/D9: checkpoints and the ledger --------------------------------------------------------

def test_a_one_byte_edit_of_the_ledger_is_refused(tmp_path):
    service, _ = dp_service(tmp_path)
    service.checkpoint()
    service.ledger.begin_pass(service.recommender.model.dp.stream_multiplier())
    newest = service.checkpoint()["path"]
    blob = bytearray(open(newest, "rb").read())
    at = blob.index(b'"count": 2')
    blob[at + len(b'"count": ')] = ord("0")  # two passes -> none: epsilon would read 0
    open(newest, "wb").write(bytes(blob))
    with pytest.raises(LedgerIntegrityError, match="privacy ledger"):
        CheckpointStore(tmp_path).latest()
    with pytest.raises(LedgerIntegrityError):
        LearningService.from_checkpoint(tmp_path, {"SketchMF": SketchMF})


def test_a_dp_directory_never_starts_a_fresh_ledger(tmp_path):
    service, _ = dp_service(tmp_path)
    service.checkpoint()
    fresh = PrivacyLedger("rating", 1e-5)
    fresh.begin_pass(service.recommender.model.dp.stream_multiplier())
    with pytest.raises(LedgerIntegrityError, match="fresh ledger"):
        CheckpointStore(tmp_path).save({"model": b""}, {"privacy_ledger": fresh.to_dict()})
    carried = continue_ledger(tmp_path, "rating", 1e-5)
    assert carried.n_releases == 1
    carried.begin_pass(service.recommender.model.dp.stream_multiplier())
    CheckpointStore(tmp_path).save({"model": b""}, {"privacy_ledger": carried.to_dict()})
    assert CheckpointStore(tmp_path).ledger().n_releases == 2
    with pytest.raises(ValueError, match="another directory"):
        continue_ledger(tmp_path, "user", 1e-5)


def test_cap_counts_are_operator_state_outside_the_model_bytes(tmp_path):
    service, _ = dp_service(tmp_path, unit="user")
    model = service.recommender.model
    assert model.user_counts and b"capped_users" not in model.to_bytes()
    service.checkpoint()
    restored = LearningService.from_checkpoint(tmp_path, {"SketchMF": SketchMF})
    assert restored.recommender.model.user_counts == model.user_counts


def test_replay_checkpoint_twice_continues_the_ledger(capsys, tmp_path):
    run = ["--dp-epsilon", "1", "--checkpoint", str(tmp_path), *SYNTH]
    _replay(capsys, *run)
    second = _replay(capsys, *run)
    assert second["privacy"]["noisy_releases"] == 2 and second["privacy"]["epsilon"] > 1.1


# --- D4: model shape from public parameters ------------------------------------------------------

def test_the_released_shape_does_not_depend_on_one_rating():
    counted = 2625  # D: distinct users + items; D' (the only rating of one item replaced): 2624
    shapes = {len(SketchMF(dim=8, capacity=public_capacity(True, None, n),
                           dp=DPConfig(noise_multiplier=1.0)).to_bytes()) for n in (counted, counted - 1)}
    assert len(shapes) == 1
    assert public_capacity(False, None, counted) == counted  # non-private runs are unchanged
    check_public_shape(True, DEFAULT_DP_CAPACITY, None)
    with pytest.raises(ValueError, match="not from the data"):
        check_public_shape(True, counted, None)


def test_replay_sizes_a_dp_model_from_the_public_default(capsys):
    out = _replay(capsys, "--dp-epsilon", "1", *SYNTH)
    assert out["params"]["capacity"] == DEFAULT_DP_CAPACITY


# --- D3/D7 and access control: the endpoint ------------------------------------------------------

@pytest.fixture
def client(monkeypatch):
    monkeypatch.setenv("SKETCHREC_USER_TOKEN_KEY", KEY.hex())
    service, data = dp_service()
    with TestClient(create_app(service, ADMIN)) as c:
        yield c, data


def test_per_user_answers_need_the_users_token(client):
    c, data = client
    user = str(data.users[0])
    assert c.get("/recommend", params={"user": user}).status_code == 401
    assert c.get("/predict", params={"user": user, "item": "1"}).status_code == 401
    other = UserTokens(KEY).mint("someone else")
    assert c.get("/recommend", params={"user": user, "token": other}).status_code == 403
    token = mint_user_token(KEY.hex(), user)
    known = c.get("/recommend", params={"user": user, "k": 5},
                  headers={"Authorization": f"Bearer {token}"})
    assert known.status_code == 200
    assert c.get("/predict", params={"user": user, "item": "1", "token": token}).status_code == 200
    unknown = c.get("/recommend", params={"user": "never-seen", "k": 5},
                    headers={"Authorization": f"Bearer {ADMIN}"})  # the backend may ask for anyone
    assert unknown.status_code == 200
    assert set(known.json()) == set(unknown.json())
    assert known.json()["source"] == unknown.json()["source"] == "ranked"


def test_dp_surfaces_show_no_exact_statistic(client):
    c, _ = client
    privacy = c.get("/privacy").json()
    assert privacy["mode"] == "dp-sgd" and privacy["proven_bound"] is True
    assert privacy["kld"] is None and "unseen_error_mean" not in privacy
    assert "/admin/privacy" in privacy["monitor"]
    stats = c.get("/stats").json()
    assert "ratings_learned" not in stats and "prequential_rmse" not in stats
    assert "sketchrec_ratings_learned" not in c.get("/metrics").text
    assert c.get("/admin/privacy").status_code == 401
    admin = c.get("/admin/privacy", headers={"Authorization": f"Bearer {ADMIN}"}).json()
    assert admin["covered"] is False and admin["stats"]["ratings_learned"] == 3000
    assert admin["monitor"]["unseen_total"] == 3000


def test_access_control_is_off_by_default_only_outside_the_privacy_modes():
    plain = LearningService(Recommender(SketchMF(dim=8, width=1024), pair_capacity=1000))
    with TestClient(create_app(plain)) as c:
        r = c.get("/recommend", params={"user": "x"})
        assert r.status_code == 200 and r.json()["source"] != "ranked"


# --- LDP -----------------------------------------------------------------------------------------

def test_ldp_range_is_declared_and_reported():
    assert declared_range(None, "ml-100k") == (1.0, 5.0)
    assert declared_range(None, "movielens-csv") == (0.5, 5.0)
    assert declared_range("0.5,4", "ml-100k") == (0.5, 4.0)
    with pytest.raises(ValueError, match="declare"):
        declared_range(None, "unknown-format")
    figures = privacy_figures(SketchMF(dim=8, width=1024), ldp=LDPSettings(1.0, 0.5, 4.0))
    assert figures["mode"] == "ldp" and figures["epsilon"] == 1.0 and figures["range"] == [0.5, 4.0]


def test_replay_ldp_reports_mode_ldp(capsys):
    out = _replay(capsys, "--holdout", "0.2", "--ldp-epsilon", "1", "--ldp-range", "1,5", *SYNTH)
    assert out["privacy"]["mode"] == "ldp" and out["privacy"]["range"] == [1.0, 5.0]
