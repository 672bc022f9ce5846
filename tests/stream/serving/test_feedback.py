"""POST /ratings, GET /similar and --items titles: a real uvicorn server on a free loopback port,
hit by a real HTTP client. The Kafka-backed route: tests/integration/test_feedback_kafka.py."""

from __future__ import annotations

import contextlib

import httpx
import numpy as np
import pytest

from sketchrec.data import SyntheticStream
from sketchrec.models import SketchMF
from sketchrec.models.capabilities import FEEDBACK
from sketchrec.models.private.dp_sgd import DPConfig
from sketchrec.models.private.fallback import with_fallback
from sketchrec.privacy.access import UserTokens
from sketchrec.stream.feedback import DirectFeedback, Refusal
from sketchrec.stream.recommender import Recommender
from sketchrec.stream.serving.http import create_app
from sketchrec.stream.serving.server import ServerThread
from sketchrec.stream.service import LearningService
from sketchrec.stream.titles import BadItemsFile, Titles

ADMIN = "backend-token"
TOKENS = UserTokens(b"k" * 32)
DATA = SyntheticStream(n_ratings=8000, n_users=200, n_items=120, seed=3).all()


def learned_service(model=None, **kwargs) -> LearningService:
    rec = Recommender(model or SketchMF(dim=8, capacity=400, seed=0), pair_capacity=50_000, seed=0)
    service = LearningService(rec, **kwargs)
    if not service.read_only:
        rec.learn_many(DATA.users, DATA.items, DATA.ratings)
    return service


@contextlib.contextmanager
def serving(service, access="auto"):
    server = ServerThread(create_app(service, ADMIN, access), "127.0.0.1", 0).start()
    service.warm_up()
    try:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            yield client
    finally:
        server.stop()


def test_posted_ratings_are_learned_directly():
    service = learned_service()
    service.feedback = DirectFeedback(service, (0.5, 5.0))
    before, learned = service.recommender.predict("newcomer", 7), service.ratings_learned
    with serving(service) as client:
        one = client.post("/ratings", json={"user": "newcomer", "item": 7, "rating": 5})
        many = client.post("/ratings", json=[{"user": "newcomer", "item": 7, "rating": 5.0,
                                              "timestamp": 1}] * 40)
    assert one.status_code == 200 and one.json() == {"accepted": 1, "learned": 1, "rejected": []}
    assert many.status_code == 200 and many.json()["learned"] == 40
    assert service.ratings_learned == learned + 41
    # learned through the model's own steps: its prediction of the posted pair moved up to it
    assert service.recommender.predict("newcomer", 7) > before + 0.5
    assert service.errors.n == 41   # the prequential error of each, as for a consumed rating


def test_a_batch_with_bad_records_is_a_422_naming_each_and_keeps_the_good_ones():
    service = learned_service()
    service.feedback = DirectFeedback(service, (0.5, 5.0))
    learned = service.ratings_learned
    batch = [{"user": 1, "item": 2, "rating": 4}, {"user": 1, "item": 3, "rating": 9},
             {"user": 1, "rating": 3}, {"user": [1], "item": 2, "rating": 3},
             {"user": 2, "item": 3, "rating": 2}]
    with serving(service) as client:
        r = client.post("/ratings", json=batch)
        not_json = client.post("/ratings", content=b"1,2,4")
        stats = client.get("/stats").json()
    assert r.status_code == 422
    body = r.json()
    assert body["accepted"] == 2 and body["learned"] == 2
    assert [(x["index"], x["reason"]) for x in body["rejected"]] == [
        (1, "rating out of range"), (2, "missing fields"), (3, "bad user id type")]
    assert "\n" not in body["detail"] and "#1: rating out of range" in body["detail"]
    assert service.ratings_learned == learned + 2
    assert not_json.status_code == 422 and not_json.json()["accepted"] == 0
    assert stats["skipped"] == {"rating out of range": 1, "missing fields": 1, "bad user id type": 1,
                                "not JSON (send a rating object or a list of them)": 1}


def test_posting_needs_the_users_token_when_access_control_is_on():
    service = learned_service()
    service.feedback = DirectFeedback(service)
    learned = service.ratings_learned
    rating = {"user": "ann", "item": 4, "rating": 4}
    with serving(service, access=TOKENS) as client:
        anonymous = client.post("/ratings", json=rating)
        own = client.post("/ratings", json=rating, headers={"Authorization": f"Bearer {TOKENS.mint('ann')}"})
        forged = client.post("/ratings", json=[rating, {**rating, "user": "bob"}],
                             params={"token": TOKENS.mint("ann")})
        backend = client.post("/ratings", json={**rating, "user": "bob"},
                              headers={"Authorization": f"Bearer {ADMIN}"})
    assert anonymous.status_code == 401 and own.status_code == 200
    assert forged.status_code == 403   # ann's token does not send bob's ratings, nor ann's beside them
    assert backend.status_code == 200
    assert service.ratings_learned == learned + 2


def test_a_broken_variant_without_access_control_lets_anyone_rate_as_anyone():
    """The attack the token stops: with access control off, an anonymous caller's rating is
    learned as bob's (the route is open only where the operator turns access control off)."""
    service = learned_service()
    learned = service.ratings_learned
    with serving(service, access=False) as client:
        r = client.post("/ratings", json={"user": "bob", "item": 4, "rating": 1})
    assert r.status_code == 200 and service.ratings_learned == learned + 1


def dp_service(budget=None) -> LearningService:
    model = with_fallback(SketchMF(dim=4, width=512, seed=1, dp=DPConfig(2.0, batch_size=200)), 64)
    service = LearningService(Recommender(model, pair_capacity=20_000, seed=1))
    service.begin_private_pass("rating", 1e-5, None)   # the stream's own pass, as replay charges it
    service.recommender.learn_many(DATA.users, DATA.items, DATA.ratings)
    service.feedback = DirectFeedback(service, (0.5, 5.0), "rating", 1e-5, budget)
    return service


def test_a_dp_model_takes_posted_ratings_through_its_dp_path_and_ledger():
    service = dp_service()
    spent, steps = service.ledger.epsilon(), int(service.recommender.model.dp_steps[0])
    rating = {"user": "ann", "item": 4, "rating": 4}
    with serving(service, access=TOKENS) as client:
        anonymous = client.post("/ratings", json=rating)
        assert anonymous.status_code == 401 and service.ledger.epsilon() == spent
        r = client.post("/ratings", json=[rating] * 3, params={"token": TOKENS.mint("ann")})
        again = client.post("/ratings", json=rating, params={"token": TOKENS.mint("ann")})
        stats = client.get("/stats").json()
    assert r.status_code == 200 and again.status_code == 200
    # the posted ratings' pass is charged once, before the first is learned, by noisy steps
    assert service.ledger.epsilon() > spent and service.ledger.n_releases == 2
    assert int(service.recommender.model.dp_steps[0]) == steps + 2
    assert "ratings_learned" not in stats   # the release boundary still holds on /stats


def test_a_dp_sink_that_skipped_the_charge_would_learn_for_free():
    """What the ledger assertion above catches: a sink whose pass is never charged learns the
    posted ratings (noisy steps taken) while the ledger's epsilon stays put."""
    service = dp_service()
    spent, steps = service.ledger.epsilon(), int(service.recommender.model.dp_steps[0])
    service.feedback._pass_begun = True   # deliberately broken: the charge is skipped
    service.feedback.take([("ann", 4, 4.0, 0)])
    assert int(service.recommender.model.dp_steps[0]) == steps + 1 and service.ledger.epsilon() == spent


def test_posted_ratings_over_the_budget_are_refused_and_counted():
    service = dp_service(budget=1e-3)
    learned = service.ratings_learned
    with serving(service) as client:
        r = client.post("/ratings", json={"user": "ann", "item": 4, "rating": 4},
                        headers={"Authorization": f"Bearer {ADMIN}"})
        operator = client.get("/admin/privacy", headers={"Authorization": f"Bearer {ADMIN}"}).json()
    assert r.status_code == 409 and "privacy budget is spent" in r.json()["detail"]
    assert service.ratings_learned == learned and service.skipped["privacy budget spent"] == 1
    assert operator is not None


@pytest.mark.parametrize("route", ["read-only", "epoch-dp"])
def test_a_service_that_cannot_learn_them_refuses_with_the_tables_line(route, tmp_path):
    service = learned_service(read_only=route == "read-only")
    service.feedback = None if route == "read-only" else Refusal(route)
    learned = service.ratings_learned
    with serving(service) as client:
        r = client.post("/ratings", json={"user": 1, "item": 2, "rating": 4})
    assert r.status_code == 409 and r.json() == {"detail": FEEDBACK[route].line()}
    assert service.ratings_learned == learned


def cosine_top(model, item, candidates, k):
    """The k candidates of highest cosine with the item's factors, from the model's cells."""
    vectors, _ = model.factors(np.array([item, *candidates], dtype=object), 1)
    v = vectors.astype(np.float64)
    scores = v[1:] @ v[0] / (np.linalg.norm(v[1:], axis=1) * np.linalg.norm(v[0]))
    order = np.argsort(-scores, kind="stable")[:k]
    return [candidates[n] for n in order], scores[order]


def test_similar_ranks_the_catalogue_by_the_cosine_of_item_factors():
    service = learned_service()
    model = service.recommender.model
    with serving(service) as client:
        r = client.get("/similar", params={"item": "7", "k": 5})
        unknown = client.get("/similar", params={"item": "never-rated"})
    assert r.status_code == 200
    body = r.json()
    items = [x["item"] for x in body["items"]]
    catalogue = [i for i in service.recommender.item_snapshot().ids if i != 7]
    expected, scores = cosine_top(model, 7, catalogue, 5)
    assert body["item"] == 7 and items == expected and 7 not in items
    np.testing.assert_allclose([x["score"] for x in body["items"]], scores, atol=1e-6)
    assert unknown.status_code == 404


def test_similar_in_a_dp_mode_answers_from_the_released_cells_whatever_the_item():
    service = dp_service()
    with serving(service) as client:
        known = client.get("/similar", params={"item": "7", "k": 3})
        unknown = client.get("/similar", params={"item": "never-rated", "k": 3})
    # no 404: whether anyone rated an item is not the release's to say
    assert known.status_code == 200 and unknown.status_code == 200
    assert len(known.json()["items"]) == 3 and len(unknown.json()["items"]) == 3


def test_items_titles_on_recommend_and_similar(tmp_path):
    path = tmp_path / "movies.csv"
    path.write_text("movieId,title,genres\n" + "".join(
        f'{i},"Film {i}, The (1999)",Drama\n' for i in range(0, 120, 2)))   # even items only
    service = learned_service()
    service.titles = Titles.load(path)
    with serving(service) as client:
        rec = client.get("/recommend", params={"user": str(DATA.users[0]), "k": 20}).json()
        sim = client.get("/similar", params={"item": "8", "k": 20}).json()
    assert sim["title"] == "Film 8, The (1999)"
    for answer in (rec, sim):
        for entry in answer["items"]:
            assert entry.get("title") == (f"Film {entry['item']}, The (1999)"
                                          if entry["item"] % 2 == 0 else None)
    assert len(service.titles) == 60   # only the file's items are held


def test_titles_read_movielens_u_item(tmp_path, ml100k):
    titles = Titles.load(ml100k.parent / "u.item")
    assert titles.get(1) == "Toy Story (1995)" and titles.get("1682") and len(titles) == 1682
    (tmp_path / "bad.csv").write_text("a,b\n1,2\n")
    with pytest.raises(BadItemsFile, match="neither a MovieLens u.item"):
        Titles.load(tmp_path / "bad.csv")


@pytest.mark.parametrize("extra, route", [([], "direct"), (["--holdout", "0.2", "--epochs", "1"], "holdout"),
                                          (["--model", "sketch", "--dp-noise", "1", "--holdout", "0.2",
                                            "--epochs", "1"], "epoch-dp")])
def test_replay_gives_its_service_the_route_its_protocol_can_account(extra, route, tmp_path):
    from sketchrec.cli.config import ReplayConfig
    from sketchrec.cli.feedback import replay_feedback
    from sketchrec.cli.replay import build_parser, prepare
    argv = ["--synthetic-ratings", "600", "--synthetic-users", "40", "--synthetic-items", "30",
            "--quiet", "--no-monitor", "--checkpoint", str(tmp_path / "ck"), *extra]
    run = prepare(ReplayConfig.from_args(build_parser().parse_args(argv)))
    assert replay_feedback(run).route == route


def test_items_without_serve_is_refused_in_one_line(capsys):
    from sketchrec.cli.options import Refused
    from sketchrec.cli.replay import replay_main
    with pytest.raises(Refused) as refused:
        replay_main(["--items", "movies.csv", "--quiet"])
    assert str(refused.value) == "replay: --items names the titles of the served answers; give --serve with it"
    assert capsys.readouterr().err.strip().splitlines() == [str(refused.value)]
