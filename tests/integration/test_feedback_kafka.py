"""POST /ratings on a service that consumes a topic: the ratings are produced to the topic and
learned when consumed, exactly once (a restart from the checkpoint does not learn them again)."""

from __future__ import annotations

import signal
import uuid

import pytest

from sketchrec.models import SketchMF
from sketchrec.stream.feedback import FeedbackRefused, KafkaFeedback
from sketchrec.stream.kafka.consumer import KafkaLearner, resume_or_create
from sketchrec.stream.kafka.producer import ensure_topic
from sketchrec.stream.serving.http import create_app
from sketchrec.stream.serving.server import ServerThread
from conftest import http, pause


def _service(directory):
    return resume_or_create(directory, lambda: SketchMF(capacity=500, dim=8), pair_capacity=20_000)


def test_posted_ratings_are_produced_and_learned_once_when_consumed(kafka_bootstrap, tmp_path):
    topic = f"posted-{uuid.uuid4().hex[:8]}"
    ensure_topic(kafka_bootstrap, topic, 2)
    service = _service(tmp_path)
    service.feedback = KafkaFeedback(kafka_bootstrap, topic, (0.5, 5.0))
    server = ServerThread(create_app(service), "127.0.0.1", 0).start()
    try:
        batch = [{"user": f"u{n % 7}", "item": n % 11, "rating": 1 + n % 5} for n in range(30)]
        r = http.post(f"{server.url}/ratings", json=batch + [{"user": "u1", "item": 2, "rating": 50}],
                      timeout=30)
        assert r.status_code == 422
        assert r.json()["accepted"] == 30 and r.json()["produced"] == 30
        assert service.ratings_learned == 0   # not learned by the route: by the consumer
        KafkaLearner(service, kafka_bootstrap, topic, checkpoint_every=10_000).run(idle_exit=2)
        assert service.ratings_learned == 30 and dict(service.skipped) == {"rating out of range": 1}
    finally:
        server.stop()
        service.feedback.close()
    again = _service(tmp_path)   # restarted from the final checkpoint: nothing learned twice
    KafkaLearner(again, kafka_bootstrap, topic, checkpoint_every=10_000).run(idle_exit=2)
    assert again.ratings_learned == 30 and sum(again.offsets.values()) == 7   # one message per user


def test_ratings_the_broker_acknowledges_late_are_not_asked_again(own_broker, monkeypatch):
    """Before: a batch not acknowledged in time was answered 503 "send the others again", yet the
    producer still held it and could deliver it when the broker answered: sent again as told, the
    ratings were on the topic (and learned) twice. The answer now says their fate is not known
    yet, and whose they are. The broker is paused past the wait."""
    from sketchrec.stream import feedback
    bootstrap, broker = own_broker
    monkeypatch.setattr(feedback, "ACK_TIMEOUT_S", 2.0)   # the product's wait, shortened
    topic = f"late-{uuid.uuid4().hex[:8]}"
    ensure_topic(bootstrap, topic, 1)
    sink = KafkaFeedback(bootstrap, topic)
    try:
        sink.take([("warm", "x", 3.0, 0)])   # connected, metadata known
        pause(broker)   # stopped before the next request (a loaded machine once let it answer)
        try:
            with pytest.raises(FeedbackRefused) as refused:
                sink.take([("ann", "up", 4.0, 0), ("bob", "down", 2.0, 0)])
        finally:
            broker.send_signal(signal.SIGCONT)
    finally:
        sink.close()
    assert refused.value.status == 504
    line = refused.value.line
    assert "may still be taken, check before sending them again" in line and "ann, bob" in line
    assert "send them again" not in line.replace("before sending them again", "")
