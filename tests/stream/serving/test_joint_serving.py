"""The joint-DP model served (stream.serving.joint): a real server over a fitted PrivateALS, per-user
access control always on, read-only; and `replay --dp-unit user --serve` end to end."""

import os
import signal
import subprocess
import sys

import httpx
import numpy as np
import pytest

from sketchrec.data import SyntheticStream
from sketchrec.models.private.joint_als import JointDPConfig, PrivateALS
from sketchrec.privacy.access import KEY_ENV, UserTokens
from sketchrec.stream.serving.http import create_app
from sketchrec.stream.service import LearningService
from sketchrec.stream.serving.joint import JointRecommender, JointService
from sketchrec.stream.serving.server import ServerThread
from conftest import http, served_url, stop_processes, wait_healthy

ADMIN = "backend-token"
TOKENS = UserTokens(b"joint-serving-test-key")


@pytest.fixture(scope="module")
def served():
    data = SyntheticStream(8000, n_users=150, n_items=80, seed=3).all()
    model = PrivateALS(JointDPConfig(epsilon=8.0, rank=2, cap=40), np.unique(data.items)).fit(
        data.users, data.items, data.ratings)
    service = JointService(JointRecommender(model, data))
    server = ServerThread(create_app(service, ADMIN, TOKENS), "127.0.0.1", 0).start()
    with httpx.Client(base_url=f"http://127.0.0.1:{server.port}", timeout=10) as client:
        yield client, model, data
    server.stop()


def _bearer(token):
    return {"Authorization": f"Bearer {token}"}


def test_recommend_needs_the_users_own_token_and_never_shows_their_training_items(served):
    client, model, data = served
    user = int(data.users[0])
    rated = set(data.items[data.users == user].tolist())
    params = {"user": str(user), "k": 80}
    assert client.get("/recommend", params=params).status_code == 401
    assert client.get("/recommend", params=params,
                      headers=_bearer(TOKENS.mint(user + 1))).status_code == 403
    assert client.get("/recommend", params={**params, "token": TOKENS.mint(user + 1)}).status_code == 403
    r = client.get("/recommend", params=params, headers=_bearer(TOKENS.mint(user)))
    assert r.status_code == 200
    items = [x["item"] for x in r.json()["items"]]
    assert items and not rated & set(items)
    assert set(items) == set(np.unique(data.items).tolist()) - rated   # k = the whole catalogue
    scores = [x["score"] for x in r.json()["items"]]
    assert scores == sorted(scores, reverse=True)
    assert client.get("/recommend", params={**params, "token": TOKENS.mint(user)}).status_code == 200


def test_predict_is_the_models_answer_for_that_pair(served):
    client, model, data = served
    user, item = data.users[5], data.items[9]
    params = {"user": str(user), "item": str(item)}
    assert client.get("/predict", params=params).status_code == 401
    assert client.get("/predict", params=params, headers=_bearer(TOKENS.mint(int(user) + 1))).status_code == 403
    for headers in (_bearer(ADMIN), _bearer(TOKENS.mint(int(user)))):
        r = client.get("/predict", params=params, headers=headers)
        assert r.status_code == 200
        assert r.json()["rating"] == float(model.predict_many(np.array([user]), np.array([item]))[0])
    # an id outside the data: the released baseline, not an error
    r = client.get("/predict", params={"user": "no-such-user", "item": "no-such-item"}, headers=_bearer(ADMIN))
    assert r.status_code == 200 and 1.0 <= r.json()["rating"] <= 5.0


def test_privacy_shows_the_joint_guarantee_and_no_exact_statistic(served):
    client, model, data = served
    figures = client.get("/privacy").json()
    assert figures["mode"] == "joint-dp" and figures["proven_bound"] is True and figures["joint"]
    assert figures["privacy_unit"] == "add/remove user" and figures["epsilon"] <= 8.0 + 1e-2
    assert figures["fallback"] == (not model.chose_factors) and figures["serving"] == model.serving()
    assert "access_control" in figures and figures["kld"] is None
    stats = client.get("/stats").json()
    assert "ratings_learned" not in stats and "catalogue_items" not in stats and "skipped" not in stats
    assert str(len(data)) not in client.get("/metrics").text.split("sketchrec_request")[0]


def test_learning_endpoints_answer_409_and_access_control_cannot_be_turned_off(served):
    client, model, data = served
    for path in ("/pause", "/resume", "/checkpoint"):
        assert client.post(path, headers=_bearer(ADMIN)).status_code == 409
    service = JointService(JointRecommender(model, data))
    assert not isinstance(service, LearningService)   # a source that never learns, not a learner
    for step in (service.pause, service.resume):
        with pytest.raises(RuntimeError, match="never learns"):
            step()
    for access in (False, None):
        with pytest.raises(ValueError, match="access control"):
            create_app(service, ADMIN, access)


def test_replay_serves_the_joint_model_until_interrupted(tmp_path):
    key = "ab" * 16
    env = {**os.environ, KEY_ENV: key, "SKETCHREC_ADMIN_TOKEN": ADMIN}
    log = tmp_path / "replay.err"
    with log.open("w") as err:   # a file: a pipe read only at the end could fill and block it
        proc = subprocess.Popen([sys.executable, "-m", "sketchrec", "replay", "--synthetic-ratings", "6000",
                                 "--synthetic-users", "200", "--synthetic-items", "120", "--holdout", "0.2",
                                 "--quiet", "--dp-unit", "user", "--dp-epsilon", "8",
                                 "--serve", "127.0.0.1:0"],
                                stdout=subprocess.DEVNULL, stderr=err, env=env)
    try:
        base = served_url(log, proc)   # the port the replay bound itself
        wait_healthy(base, proc, log=log)   # /recommend answers 503 while the model loads
        assert http.get(f"{base}/recommend", params={"user": "3", "k": 5}).status_code == 401
        token = UserTokens(bytes.fromhex(key)).mint(3)
        r = http.get(f"{base}/recommend", params={"user": "3", "k": 5, "token": token})
        assert r.status_code == 200 and len(r.json()["items"]) == 5
        assert http.get(f"{base}/privacy").json()["mode"] == "joint-dp"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
    finally:
        stop_processes([proc])
    assert "per-user access control on" in log.read_text()


def test_a_checkpoint_serves_the_same_release_and_a_new_fit_extends_its_ledger(tmp_path):
    from sketchrec.replay.joint_holdout import train_user_private
    from sketchrec.stream.checkpoint import CheckpointStore, continue_ledger
    from sketchrec.stream.serving.joint import open_checkpoint
    data = SyntheticStream(3000, n_users=60, n_items=40, seed=4).all()
    train, test = data.take(slice(0, 2400)), data.take(slice(2400, None))
    first = train_user_private(train, test, 2.0, config=JointDPConfig(rank=2, iterations=2))["model"]
    service = JointService(JointRecommender(first, train), CheckpointStore(tmp_path))
    service.checkpoint()
    back = open_checkpoint(tmp_path)       # what `sketchrec serve --checkpoint DIR` opens
    assert isinstance(back, JointService) and back.privacy()["epsilon"] == pytest.approx(2.0, abs=2e-3)
    np.testing.assert_array_equal(back.recommender.predict_many(test.users, test.items),
                                  first.predict_many(test.users, test.items))
    user = str(train.users[0])
    assert back.recommender.recommend(user, 5) == service.recommender.recommend(user, 5)
    stored = continue_ledger(tmp_path, "user", 1e-5)     # a second fit into the same directory
    again = train_user_private(train, test, 2.0, config=JointDPConfig(rank=2, iterations=2),
                               ledger=stored)["model"]
    assert again.ledger is stored and again.figures()["epsilon"] > 2.5   # charged on top, never reset
