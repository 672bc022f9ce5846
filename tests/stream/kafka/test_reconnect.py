"""The reconnect line says how long the broker was gone (it said ``after_s=-0``: the loss's start
was read after the poll that reconnected had cleared it)."""

import logging
import time
import types

from sketchrec.stream.health import Health
from sketchrec.stream.kafka.consumer import KafkaLearner


def _learner(connected: bool) -> KafkaLearner:
    learner = KafkaLearner.__new__(KafkaLearner)
    learner.health, learner.taken = Health(), 0
    conns = {0: types.SimpleNamespace(connected=connected)}
    learner.consumer = types.SimpleNamespace(_client=types.SimpleNamespace(
        _manager=types.SimpleNamespace(_conns=conns)))
    return learner


def test_the_reconnect_line_says_how_long_the_broker_was_gone(caplog):
    learner = _learner(connected=True)
    learner.health.broker_lost("KafkaConnectionError: gone", since=time.monotonic() - 5.0)
    with caplog.at_level(logging.INFO):
        learner._watch()
    line = next(r.getMessage() for r in caplog.records if "event=connect" in r.getMessage())
    after = float(line.split("after_s=")[1].split()[0])
    assert 5.0 <= after < 60.0
    assert learner.health.lost_since is None   # and the loss is over
