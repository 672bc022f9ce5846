"""The hot paths of /predict and /recommend (``serving.fastpath``) answer exactly as the FastAPI
routes behind them: every request is sent twice, once as is and once with a repeated extra
parameter (which the routes ignore and the fast path never answers), and both answers agree."""


import httpx
import numpy as np
import pytest

from sketchrec.models import SketchMF
from sketchrec.privacy.access import UserTokens
from sketchrec.stream.serving.http import create_app
from sketchrec.stream.recommender import Recommender
from sketchrec.stream.serving.server import ServerThread
from sketchrec.stream.service import LearningService
from sketchrec.data import SyntheticStream
from sketchrec.sketches.hashing import as_keys
from conftest import wait_for

ADMIN = "admin-token"
TOKENS = UserTokens(b"k" * 32)


@pytest.fixture(scope="module", params=[False, True], ids=["open", "access-control"])
def served(request):
    data = SyntheticStream(n_ratings=3000, n_users=60, n_items=80, seed=2).all()
    rec = Recommender(SketchMF(capacity=200, dim=8), pair_capacity=10_000)
    rec.learn_many(data.users, data.items, data.ratings)
    rec.catalogue.add(np.array(["a-str-id"], dtype=object), as_keys(["a-str-id"]))  # among the ints
    service = LearningService(rec)
    server = ServerThread(create_app(service, ADMIN, TOKENS if request.param else False),
                          "127.0.0.1", 0).start()
    with httpx.Client(base_url=server.url, timeout=10) as client:
        yield client, service, request.param
    server.stop()


def both(client, path, params, headers=None):
    """The fast path's answer and the route's (a repeated extra parameter sends it to the app)."""
    fast = client.get(path, params=params, headers=headers)
    slow = client.get(path, params=list(params.items()) + [("x", "1"), ("x", "2")], headers=headers)
    return fast, slow


REQUESTS = [
    ("/predict", {"user": "5", "item": "7"}),
    ("/predict", {"user": "never-seen", "item": "7"}),
    ("/recommend", {"user": "5"}),
    ("/recommend", {"user": "5", "k": "3"}),
    ("/recommend", {"user": "5", "k": "1000"}),
    ("/recommend", {"user": "a stranger", "k": "4"}),      # popular items
    # refused: the fast path leaves them to the app, which answers as before
    ("/recommend", {"user": "5", "k": "0"}),
    ("/recommend", {"user": "5", "k": "1001"}),
    ("/recommend", {"user": "5", "k": "007"}),
    ("/recommend", {"user": "   "}),
    ("/predict", {"user": "5"}),
    ("/predict", {"user": "x" * 257, "item": "1"}),
    ("/predict", {"user": "é", "item": "1"}),
]


@pytest.mark.parametrize("path,params", REQUESTS)
def test_the_fast_path_answers_as_the_route(served, path, params):
    client, _, access = served
    for headers in ([None, {"Authorization": f"Bearer {ADMIN}"},
                     {"Authorization": f"Bearer {TOKENS.mint(params.get('user', ''))}"},
                     {"Authorization": "Bearer wrong"}] if access else [None]):
        fast, slow = both(client, path, params, headers)
        assert fast.status_code == slow.status_code
        assert fast.headers["content-type"] == slow.headers["content-type"] == "application/json"
        assert fast.json() == slow.json()


def test_answers_hold_what_the_model_says_and_are_timed(served):
    client, service, access = served
    headers = {"Authorization": f"Bearer {ADMIN}"}
    body = client.get("/recommend", params={"user": "5", "k": "80"}, headers=headers).json()
    scores = [row["score"] for row in body["items"]]
    assert scores == sorted(scores, reverse=True) and len(scores) == len({r["item"] for r in body["items"]})
    assert body["source"] == ("ranked" if access else "model")
    rating = client.get("/predict", params={"user": "5", "item": "7"}, headers=headers).json()["rating"]
    assert rating == service.recommender.predict("5", "7")
    metrics = client.get("/metrics").text
    assert 'sketchrec_request_seconds_count{endpoint="/recommend"}' in metrics


def test_not_ready_is_a_503_from_the_app(served):
    client, service, _ = served
    service.health.ready = False
    try:
        r = client.get("/predict", params={"user": "5", "item": "7"},
                       headers={"Authorization": f"Bearer {ADMIN}"})
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
    finally:
        service.health.ready = True


def test_a_stale_snapshot_is_rebuilt_off_the_callers_thread():
    """The HTTP path (``wait=False``) goes on with the current snapshot while a thread rebuilds."""
    data = SyntheticStream(n_ratings=2000, n_users=50, n_items=60, seed=4).all()
    rec = Recommender(SketchMF(capacity=150, dim=8), pair_capacity=10_000, refresh_s=0.0)
    rec.learn_many(data.users[:1000], data.items[:1000], data.ratings[:1000])
    first = rec.item_snapshot()
    first.cost = 0.0               # due now (a first build's cost includes loading the kernels)
    rec.learn_many(data.users[1000:], data.items[1000:], data.ratings[1000:])
    with rec._snapshot_lock:       # a rebuild under way: the caller neither waits nor starts one
        assert rec.item_snapshot(wait=False) is first
    assert rec.item_snapshot(wait=False) is first   # the rebuild starts in a thread of its own
    wait_for(lambda: rec._snapshot is not first, "the rebuild in its own thread", timeout=60, every=0.01)
    assert rec._snapshot.learned == 2000 and not rec._snapshot_lock.locked()


def test_a_started_server_leaves_start_up_out_of_the_collectors_reach(served):
    """Before: a full collection over start-up's ~200k objects paused every answer for ~90 ms."""
    import gc
    import sys
    assert gc.get_freeze_count() > 10_000 and sys.getswitchinterval() <= 0.0005


def test_the_popular_list_is_ranked_once_per_refresh_not_per_request():
    data = SyntheticStream(n_ratings=2000, n_users=50, n_items=60, seed=5).all()
    rec = Recommender(SketchMF(capacity=150, dim=8), pair_capacity=10_000, refresh_s=3600)
    rec.learn_many(data.users[:1000], data.items[:1000], data.ratings[:1000])
    first = rec.recommend("a stranger", 5)
    assert first[1] == "popular" and first[0] == [(i, float(c)) for i, c in rec.popularity.most_common(5)]
    rec.learn_many(data.users[1000:], data.items[1000:], data.ratings[1000:])
    assert [(i, float(c)) for i, c in rec.popularity.most_common(5)] != first[0]   # counts grew
    assert rec.recommend("a stranger", 5) == first                  # not due for an hour
    rec.refresh_s = 0.0
    assert rec.recommend("a stranger", 5)[0] == [(i, float(c)) for i, c in rec.popularity.most_common(5)]
