"""A fleet member's steps while the broker is stalled: each failure is caught, logged once,
retried; only a delta that definitely failed fences the member. Before, a snapshot that met a
stalled broker raised kafka-python's timeout out of the member (exit 1), and a flush that timed
out before a rebalance fenced it although its deltas were still in flight."""

import logging
import math
import threading
import time
import types
from collections import Counter

import pytest
from kafka import TopicPartition
from kafka.errors import KafkaTimeoutError

from sketchrec.models import SketchMF
from sketchrec.models.metrics import ErrorStats
from sketchrec.stream.fleet import outage
from sketchrec.stream.fleet.member import FleetLearner
from sketchrec.stream.fleet.model_topic import FleetState
from sketchrec.stream.fleet.outage import Outages
from sketchrec.stream.fleet.replicas import TopicSnapshots
from sketchrec.stream.fleet.tracker import DeltaTracker
from sketchrec.stream.kafka.offsets import OffsetBook
from sketchrec.stream.recommender import Recommender
from sketchrec.stream.service import LearningService


def _timeout(*args, **kw):
    raise KafkaTimeoutError("Failed to get offsets by timestamps in 30000.0 ms")


class _Producer:
    def __init__(self, flush=None):
        self.sent, self._flush = [], flush

    def send(self, topic, value=None, **kw):
        self.sent.append(topic)
        return types.SimpleNamespace(is_done=True, failed=lambda: False, exception=None)

    def flush(self, timeout=None):
        if self._flush:
            self._flush()


@pytest.fixture()
def member(monkeypatch):
    """A member over fakes of its broker clients, the model topic unreachable."""
    monkeypatch.setattr(outage, "BACKOFF", 0.0)
    recommender = Recommender(SketchMF(capacity=200, dim=4), pair_capacity=1000)
    service = LearningService(recommender, None, read_only=False)
    learner = FleetLearner.__new__(FleetLearner)
    learner.service, learner.health, learner.stop = service, service.health, threading.Event()
    learner.state, learner.tracker = FleetState(member="m"), DeltaTracker(recommender, "m")
    learner.outages = Outages(service.health)
    learner.producer, learner.model_producer = _Producer(), _Producer()
    learner.model_topic, learner.snapshot_topic, learner.topic = "t.model", "t.model.snapshots", "t"
    learner.feed = types.SimpleNamespace(poll=_timeout, catch_up=_timeout)
    learner.consumer = types.SimpleNamespace(assignment=lambda: {TopicPartition("t", 0)})
    learner.published, learner.errors, learner.skipped_since = {}, ErrorStats(), Counter()
    learner.seq, learner.bytes_published, learner.inflight = 0, 0, []
    learner.snapshot_seconds, learner.last_snapshot, learner.last_at = 0.0, -math.inf, None
    learner.fenced, learner.book = None, OffsetBook({}, 10, 60.0)
    service.fleet, service.tracker = learner.state, learner.tracker
    learner.sink = TopicSnapshots(service, learner.feed, learner.model_producer, learner.snapshot_topic)
    return learner


def test_a_snapshot_meeting_a_stalled_broker_is_tried_again_later(member, caplog):
    with caplog.at_level(logging.INFO):
        for _ in range(3):
            assert member.snapshot() is None      # before: KafkaTimeoutError escaped
    assert member.fenced is None and not member.stop.is_set()
    lines = [r.getMessage() for r in caplog.records if "event=outage" in r.getMessage()]
    assert len(lines) == 1 and "step=snapshot" in lines[0]   # logged once per outage
    assert member.health.connected is False
    member.feed.catch_up = lambda: None                      # the broker is back
    member.model_producer.send = lambda topic, **kw: types.SimpleNamespace(
        get=lambda timeout: types.SimpleNamespace(offset=4))
    with caplog.at_level(logging.INFO):
        assert member.snapshot() == 4
    assert any("event=recovered step=snapshot" in r.getMessage() for r in caplog.records)


def test_the_model_topic_read_and_the_tick_survive_a_stalled_broker(member):
    assert member._read_feed(0) == 0      # before: the poll's error escaped
    member.last_snapshot = time.monotonic()   # no snapshot due
    member.after_poll()
    assert member.fenced is None and "model topic read" in member.outages.failing


def test_an_unacknowledged_flush_is_not_a_fence_but_a_failed_delta_is(member):
    member.model_producer = _Producer(flush=_timeout)
    assert member.checkpoint("rebalance") is False
    assert member.fenced is None          # before: fenced (the deltas were still in flight)
    failed = types.SimpleNamespace(is_done=True, failed=lambda: True, exception=KafkaTimeoutError("expired"))
    member.model_producer = _Producer()
    member.inflight.append(failed)
    assert member.checkpoint("interval") is False
    assert member.fenced is not None      # a delta that never arrived: the replica diverged
