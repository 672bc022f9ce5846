"""A service served by `--workers` reader processes answers as one process does.

POST /ratings: a reader relays the request, its credentials with it, to the learner's own loopback
endpoint, which takes it as one process does — learned at once (direct), produced to the consumed
topic (Kafka), through a DP model's path with per-user tokens — and the reader answers what the
learner answered. --items: the readers read the learner's item file, so their answers carry titles.
Real reader processes (``WorkerPool``), a real HTTP client."""

from __future__ import annotations

import contextlib
import uuid

import httpx
import numpy as np

from sketchrec.data import SyntheticStream
from sketchrec.models import SketchMF
from sketchrec.models.private.dp_sgd import DPConfig
from sketchrec.models.private.fallback import with_fallback
from sketchrec.privacy.access import UserTokens
from sketchrec.stream.feedback import DirectFeedback, KafkaFeedback
from sketchrec.stream.recommender import Recommender
from sketchrec.stream.service import LearningService
from sketchrec.stream.serving.workers.pool import WorkerPool
from conftest import wait_for

ADMIN = "workers-feedback-admin"
TOKENS = UserTokens(b"w" * 32)
DATA = SyntheticStream(n_ratings=4000, n_users=150, n_items=100, seed=5).all()


@contextlib.contextmanager
def readers(service, access=False, n=1):
    """``n`` reader processes serving ``service``; the client talks to them only (the learner's
    endpoint is on a loopback port of its own)."""
    pool = WorkerPool(service, ("127.0.0.1", 0), n, admin_token=ADMIN, access=access).start()
    try:
        with httpx.Client(base_url=pool.url, timeout=60) as client:
            yield client, pool
    finally:
        pool.stop()


def test_a_rating_posted_to_a_reader_is_learned_by_the_learner():
    rec = Recommender(SketchMF(dim=8, capacity=400, seed=0), pair_capacity=20_000, seed=0)
    service = LearningService(rec)
    rec.learn_many(DATA.users, DATA.items, DATA.ratings)
    service.feedback = DirectFeedback(service, (1.0, 5.0))
    learned = service.ratings_learned
    with readers(service, n=2) as (client, pool):
        assert client.get("/stats").json()["worker_pid"] in pool.pids()   # a reader answers
        one = client.post("/ratings", json={"user": "newcomer", "item": 7, "rating": 5})
        batch = [{"user": "newcomer", "item": 7, "rating": 5.0}] * 20 + [{"user": 1, "item": 2, "rating": 9}]
        mixed = client.post("/ratings", json=batch)
        assert one.status_code == 200 and one.json() == {"accepted": 1, "learned": 1, "rejected": []}
        assert mixed.status_code == 422 and mixed.json()["learned"] == 20
        assert mixed.json()["rejected"] == [{"index": 20, "reason": "rating out of range"}]
        assert service.ratings_learned == learned + 21
        assert service.skipped["rating out of range"] == 1   # counted where /stats counts it
        # what the learner learned, every reader answers (the model in shared memory)
        expected = float(rec.predict("newcomer", 7))
        answers = {client.get("/predict", params={"user": "newcomer", "item": 7}).json()["rating"]
                   for _ in range(8)}
        assert answers == {expected} and expected > float(DATA.ratings.mean())


def test_a_dp_model_behind_readers_takes_posted_ratings_with_the_users_token():
    model = with_fallback(SketchMF(dim=4, width=512, seed=1, dp=DPConfig(2.0, batch_size=200)), 64)
    service = LearningService(Recommender(model, pair_capacity=20_000, seed=1))
    service.begin_private_pass("rating", 1e-5, None)
    service.recommender.learn_many(DATA.users, DATA.items, DATA.ratings)
    service.feedback = DirectFeedback(service, (1.0, 5.0), "rating", 1e-5, None)
    spent, steps = service.ledger.epsilon(), int(model.dp_steps[0])
    rating = {"user": "ann", "item": 4, "rating": 4}
    with readers(service, access=TOKENS) as (client, _):
        anonymous = client.post("/ratings", json=rating)
        forged = client.post("/ratings", json=[rating, {**rating, "user": "bob"}],
                             params={"token": TOKENS.mint("ann")})
        assert anonymous.status_code == 401 and forged.status_code == 403
        assert service.ledger.epsilon() == spent and int(model.dp_steps[0]) == steps
        own = client.post("/ratings", json=[rating] * 3,
                          headers={"Authorization": f"Bearer {TOKENS.mint('ann')}"})
        assert own.status_code == 200 and own.json()["learned"] == 3
    # through the DP path: the posted ratings' pass charged, a noisy step taken
    assert service.ledger.epsilon() > spent and int(model.dp_steps[0]) == steps + 1


def test_a_rating_posted_to_a_reader_of_a_consumer_is_produced_to_its_topic(kafka_bootstrap):
    from kafka import KafkaConsumer, TopicPartition

    from sketchrec.stream.kafka.messages import parse_message
    from sketchrec.stream.kafka.producer import ensure_topic
    topic = f"posted-{uuid.uuid4().hex[:8]}"
    ensure_topic(kafka_bootstrap, topic, partitions=1)
    rec = Recommender(SketchMF(dim=8, capacity=400, seed=0), pair_capacity=20_000, seed=0)
    service = LearningService(rec)
    service.feedback = KafkaFeedback(kafka_bootstrap, topic, (1.0, 5.0))
    with readers(service) as (client, _):
        r = client.post("/ratings", json=[{"user": "ann", "item": 3, "rating": 4},
                                          {"user": "bob", "item": 5, "rating": 2}])
    service.feedback.close()
    assert r.status_code == 200 and r.json()["produced"] == 2 and r.json()["topic"] == topic
    assert service.ratings_learned == 0   # learned when consumed, as every rating of the topic
    consumer = KafkaConsumer(bootstrap_servers=kafka_bootstrap, enable_auto_commit=False)
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    consumer.seek_to_beginning(tp)
    rows = []

    def read() -> bool:   # a fresh consumer's first fetch may take seconds on a loaded machine
        for message in consumer.poll(timeout_ms=500).get(tp, []):
            rows.extend(r[:3] for r in parse_message(message.value).ratings)
        return len(rows) >= 2
    wait_for(read, "the posted ratings on the topic", timeout=120, every=0)
    consumer.close()
    assert sorted(rows) == [("ann", 3, 4.0), ("bob", 5, 2.0)]
    assert np.isfinite(rec.predict("ann", 3))


def test_readers_answer_with_the_titles_of_items(tmp_path):
    """--items behind --workers: the readers read the learner's item file, so /recommend and
    /similar answered by a reader carry each item's title as one process's answers do."""
    from sketchrec.stream.titles import Titles
    path = tmp_path / "u.item"
    path.write_bytes("".join(f"{i}|Film {i} (1995)|01-Jan-1995||http://x|0|1\n"
                             for i in range(0, 100, 2)).encode("latin-1"))
    rec = Recommender(SketchMF(dim=8, capacity=400, seed=0), pair_capacity=20_000, seed=0)
    service = LearningService(rec)
    rec.learn_many(DATA.users, DATA.items, DATA.ratings)
    service.titles = Titles.load(path)
    with readers(service) as (client, pool):
        assert client.get("/stats").json()["worker_pid"] in pool.pids()
        ranked = client.get("/recommend", params={"user": 3, "k": 10}).json()["items"]
        similar = client.get("/similar", params={"item": 4, "k": 10}).json()
    for items in (ranked, similar["items"]):
        assert [x.get("title") for x in items] == [service.titles.get(x["item"]) for x in items]
        assert any("title" in x for x in items)
    assert similar["title"] == "Film 4 (1995)"
