"""The live endpoint: a real uvicorn server on a free loopback port, hit by a real HTTP client."""

import os
import signal
import subprocess
import sys
import threading
from collections import Counter

import httpx
import numpy as np
import pytest
import schemathesis
from schemathesis.checks import not_a_server_error

from sketchrec.models import SketchMF
from sketchrec.stream.checkpoint import CheckpointStore
from sketchrec.stream.serving.http import create_app
from sketchrec.stream.recommender import Recommender
from sketchrec.stream.serving.server import ServerThread
from sketchrec.stream.service import LearningService
from sketchrec.data import SyntheticStream
from conftest import http, served_url, stop_processes, wait_for, wait_healthy

TOKEN = "s3cret-token"


def learned_service(n=20_000, checkpoint_dir=None, seed=0):
    data = SyntheticStream(n_ratings=n, n_users=300, n_items=200, seed=seed).all()
    rec = Recommender(SketchMF(capacity=500, dim=16), pair_capacity=50_000, seed=seed)
    for batch in data.batches(5000):
        rec.learn_many(batch.users, batch.items, batch.ratings)
    store = CheckpointStore(checkpoint_dir) if checkpoint_dir else None
    return LearningService(rec, store), data


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    service, data = learned_service(checkpoint_dir=tmp_path_factory.mktemp("ckpt"))
    service.record_skipped({"missing fields": 2})
    server = ServerThread(create_app(service, TOKEN), "127.0.0.1", 0).start()
    with httpx.Client(base_url=f"http://127.0.0.1:{server.port}", timeout=10) as client:
        yield client, service, data
    server.stop()


def test_predict_matches_the_model(served):
    client, service, _ = served
    r = client.get("/predict", params={"user": "5", "item": "7"})
    assert r.status_code == 200
    body = r.json()
    assert body["user"] == 5 and body["item"] == 7   # integer ids as JSON numbers (serving.ids)
    assert body["rating"] == pytest.approx(service.recommender.model.predict_one(5, 7))
    assert 1.0 <= body["rating"] <= 5.0


def test_recommend_excludes_rated_items_and_is_best_first(served):
    client, service, data = served
    user = int(data.users[0])
    rated = set(data.items[data.users == user].tolist())
    r = client.get("/recommend", params={"user": str(user), "k": 50})
    assert r.status_code == 200
    body = r.json()
    items = [x["item"] for x in body["items"]]
    scores = [x["score"] for x in body["items"]]
    assert body["source"] == "model" and len(items) == 50
    assert not rated & set(items)
    assert scores == sorted(scores, reverse=True)
    # the same top-k as the served ranking of exact scores of every unseen catalogue item (the
    # snapshot is float32)
    rec = service.recommender
    snap = rec.item_snapshot()
    served = rec.ranking.served(rec.model.score_items(user, snap.ids), snap.popular, snap.share)
    catalogue = sorted(set(data.items.tolist()) - rated)
    exact = {i: s for i, s in zip(snap.ids, served) if i in set(catalogue)}
    assert set(items) <= set(catalogue)
    np.testing.assert_allclose(scores, [exact[i] for i in items], atol=1e-4)
    left_out = [exact[i] for i in catalogue if i not in set(items)]
    assert min(scores) >= max(left_out) - 1e-4


def test_unknown_user_gets_popular_items(served):
    client, _, data = served
    r = client.get("/recommend", params={"user": "nobody-ever", "k": 5})
    body = r.json()
    assert r.status_code == 200 and body["source"] == "popular"
    counts = Counter(data.items.tolist())
    assert [x["item"] for x in body["items"]] == [i for i, _ in counts.most_common(5)]


def test_privacy_stats_metrics_health(served):
    client, service, _ = served
    privacy = client.get("/privacy").json()
    assert set(privacy) >= {"epsilon", "delta", "privacy_unit", "mode", "proven_bound", "kld"}
    assert privacy["mode"] == "non-private" and privacy["epsilon"] is None
    assert privacy["kld"] is None  # this service runs without a monitor
    stats = client.get("/stats").json()
    assert stats["ratings_learned"] == 20_000 and stats["skipped"] == {"missing fields": 2}
    assert stats["model_bytes"] == service.recommender.model.nbytes and stats["uptime_s"] > 0
    client.get("/predict", params={"user": "1", "item": "2"})
    metrics = client.get("/metrics")
    assert metrics.status_code == 200 and metrics.headers["content-type"].startswith("text/plain")
    text = metrics.text
    assert "sketchrec_ratings_learned_total 20000.0" in text
    assert 'sketchrec_ratings_skipped_total{reason="missing fields"} 2.0' in text
    assert 'sketchrec_request_seconds_count{endpoint="/predict"}' in text
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/openapi.json").json()["paths"].keys() >= {"/predict", "/recommend", "/stats"}


@pytest.mark.parametrize("path,params", [
    ("/predict", {"user": "1"}),                      # missing item
    ("/predict", {"item": "1"}),                      # missing user
    ("/predict", {"user": "", "item": "1"}),          # empty id
    ("/predict", {"user": "u" * 300, "item": "1"}),   # oversized id
    ("/recommend", {"user": "1", "k": "0"}),
    ("/recommend", {"user": "1", "k": "1001"}),
    ("/recommend", {"user": "1", "k": "ten"}),
    ("/recommend", {}),
])
def test_bad_parameters_get_422_with_a_message(served, path, params):
    client = served[0]
    r = client.get(path, params=params)
    assert r.status_code == 422
    assert r.json()["detail"][0]["msg"]


def test_admin_endpoints_need_the_token(served, tmp_path):
    client, service, _ = served
    for path in ("/pause", "/resume", "/checkpoint"):
        assert client.post(path).status_code == 401
        assert client.post(path, headers={"Authorization": "Bearer wrong"}).status_code == 401
    auth = {"Authorization": f"Bearer {TOKEN}"}
    assert client.post("/pause", headers=auth).json() == {"paused": True}
    assert client.get("/stats").json()["paused"] is True
    assert client.post("/resume", headers=auth).json() == {"paused": False}
    written = client.post("/checkpoint", headers=auth).json()
    assert written["ratings_learned"] == 20_000 and os.path.exists(written["path"])
    assert client.get("/stats").json()["checkpoint"]["seq"] == written["seq"]


def test_admin_is_disabled_without_a_token_and_refused_read_only(tmp_path):
    service, _ = learned_service(n=2000)
    server = ServerThread(create_app(service, None), "127.0.0.1", 0).start()
    try:
        r = http.post(f"http://127.0.0.1:{server.port}/pause", headers={"Authorization": "Bearer x"})
        assert r.status_code == 403 and "disabled" in r.json()["detail"]
    finally:
        server.stop()
    service.read_only = True
    server = ServerThread(create_app(service, TOKEN), "127.0.0.1", 0).start()
    try:
        r = http.post(f"http://127.0.0.1:{server.port}/pause", headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 409
    finally:
        server.stop()


def test_queries_while_learning_never_fail_or_return_nan():
    service, _ = learned_service(n=2000)
    stream = SyntheticStream(n_ratings=200_000, n_users=5000, n_items=2000, seed=9)
    server = ServerThread(create_app(service, None), "127.0.0.1", 0).start()
    done = threading.Event()

    def learn():
        for batch in stream.batches(2000):
            service.recommender.learn_many(batch.users, batch.items, batch.ratings)
        done.set()

    learner = threading.Thread(target=learn)
    learner.start()
    failures, answered, rng = [], 0, np.random.default_rng(0)
    with httpx.Client(base_url=f"http://127.0.0.1:{server.port}") as client:
        while not done.is_set() or answered < 50:
            u = str(rng.integers(1, 5000))
            p = client.get("/predict", params={"user": u, "item": "3"})
            r = client.get("/recommend", params={"user": u, "k": 10})
            answered += 1
            if p.status_code != 200 or not np.isfinite(p.json()["rating"]) or r.status_code != 200:
                failures.append((p.status_code, r.status_code))
            elif not all(np.isfinite(x["score"]) for x in r.json()["items"]):
                failures.append("nan score")
    learner.join()
    server.stop()
    assert not failures and answered >= 50
    assert service.ratings_learned == 202_000


def test_openapi_fuzz_no_server_errors(served):
    """Every operation of the published schema, fuzzed by schemathesis: never a 5xx.

    schemathesis' pytest plugin does not load under pytest 9, so its Hypothesis strategies are
    driven directly."""
    from hypothesis import HealthCheck, given, settings

    client = served[0]
    schema = schemathesis.openapi.from_url(str(client.base_url.join("/openapi.json")))
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.path for op in operations} >= {"/predict", "/recommend", "/checkpoint"}
    calls = Counter()
    for operation in operations:
        @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
        @given(case=operation.as_strategy())
        def fuzz(case):
            response = case.call_and_validate(checks=[not_a_server_error])
            calls[response.status_code // 100] += 1

        fuzz()
    assert calls[5] == 0 and calls[2] > 0 and calls[4] > 0


def test_replay_serve_keeps_serving_after_the_replay_until_interrupted(tmp_path):
    log = tmp_path.with_suffix(".log")
    with open(log, "w") as err:   # a pipe nobody reads could fill
        proc = subprocess.Popen([sys.executable, "-m", "sketchrec", "replay", "--synthetic-ratings", "30000",
                                 "--synthetic-users", "500", "--synthetic-items", "200", "--quiet",
                                 "--serve", "127.0.0.1:0", "--checkpoint", str(tmp_path),
                                 # served from the learning process: the lifecycle claimed here is the
                                 # replay's; reader processes' own is tests/integration/test_workers.py's
                                 "--workers", "1"],
                                stdout=subprocess.DEVNULL, stderr=err)
    try:
        base = served_url(log, proc)   # the port the replay bound itself
        wait_healthy(base, proc, log=log)
        # the replay ended (its summary printed, its checkpoint written) and it serves on
        wait_for(lambda: "still serving" in log.read_text(), "the end of the replay", proc, log)
        assert http.get(f"{base}/stats").json()["ratings_learned"] == 30_000
        assert http.get(f"{base}/predict", params={"user": "1", "item": "2"}).status_code == 200
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
    finally:
        stop_processes([proc])
    assert CheckpointStore(tmp_path).latest().meta["ratings_learned"] == 30_000


def test_serve_a_checkpoint_read_only_and_reload_newer(tmp_path):
    service, _ = learned_service(n=5000, checkpoint_dir=tmp_path)
    service.checkpoint()
    log = tmp_path.with_suffix(".log")
    with open(log, "w") as err:   # a pipe nobody reads could fill
        proc = subprocess.Popen([sys.executable, "-m", "sketchrec", "serve", "--checkpoint", str(tmp_path),
                                 "--listen", "127.0.0.1:0", "--reload-every", "0.2",
                                 # one process: readers moving to a newer checkpoint are test_workers'
                                 "--workers", "1"],
                                stdout=subprocess.DEVNULL, stderr=err)
    try:
        base = served_url(log, proc)   # the port the server bound itself
        wait_healthy(base, proc, log=log)
        served = http.get(f"{base}/predict", params={"user": "3", "item": "4"}).json()["rating"]
        assert served == pytest.approx(service.recommender.predict("3", "4"))
        stats = http.get(f"{base}/stats").json()
        assert stats["read_only"] is True and stats["ratings_learned"] == 5000
        more = SyntheticStream(n_ratings=3000, n_users=300, n_items=200, seed=7).all()
        service.recommender.learn_many(more.users, more.items, more.ratings)
        service.checkpoint()
        wait_for(lambda: http.get(f"{base}/stats").json()["ratings_learned"] == 8000,
                 "the newer checkpoint served", proc, log, timeout=120, every=0.1)
        served = http.get(f"{base}/predict", params={"user": "3", "item": "4"}).json()["rating"]
        assert served == pytest.approx(service.recommender.predict("3", "4"))
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        stop_processes([proc])


def test_serve_without_a_checkpoint_is_a_clear_error(tmp_path):
    out = subprocess.run([sys.executable, "-m", "sketchrec", "serve", "--checkpoint", str(tmp_path)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "no valid checkpoint" in out.stderr
