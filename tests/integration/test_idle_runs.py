"""When a consumer run with an idle exit ends, against a real Kafka-protocol broker: not while an
assigned partition still has messages (a stalled fetch, a broker too slow to say where the
partitions end), and at once when it is read to its end. (The rule itself, for members of a group:
tests/stream/kafka/test_idle_exit.py.)"""

import logging
import time
import uuid

from sketchrec.stream.kafka.consumer import KafkaLearner
from test_hardening_runtime import _send, _service, _valid


def test_an_idle_exit_waits_for_a_stalled_fetch_while_partitions_have_messages(kafka_bootstrap,
                                                                              tmp_path, caplog):
    """Before: no message for idle_exit seconds ended the run even with messages left on an
    assigned partition (a fetch stalled on a loaded broker); the rest was learned only by the next
    run, if any. The stall is injected: the real consumer's polls come back empty for 3 s, and for
    the first half of it the broker is too slow to say where the partitions end (which once also
    counted as drained)."""
    from kafka.errors import KafkaTimeoutError
    topic = f"stall-{uuid.uuid4().hex[:8]}"
    _send(kafka_bootstrap, topic, _valid(2000))
    service = _service(tmp_path)
    learner = KafkaLearner(service, kafka_bootstrap, topic, checkpoint_every=10_000)
    real_poll, stalled_until = learner.consumer.poll, time.monotonic() + 3.0
    real_ends = learner.consumer.end_offsets

    def stalled(*args, **kwargs):
        if time.monotonic() < stalled_until:
            learner.consumer.assignment() or real_poll(timeout_ms=0)   # assigned, nothing fetched
            time.sleep(0.2)
            return {}
        return real_poll(*args, **kwargs)

    def slow_ends(*args, **kwargs):
        if time.monotonic() < stalled_until - 1.5:
            raise KafkaTimeoutError("the broker did not answer in time (forced by the test)")
        return real_ends(*args, **kwargs)
    learner.consumer.poll = stalled
    learner.consumer.end_offsets = slow_ends
    with caplog.at_level(logging.INFO, logger="sketchrec"):
        learner.run(idle_exit=1)
    assert service.ratings_learned == 2000
    assert any(r.getMessage().startswith("event=idle_lag ") for r in caplog.records)


def test_an_idle_exit_still_ends_a_run_without_messages(kafka_bootstrap, tmp_path):
    from sketchrec.stream.kafka.idle import LAG_PATIENCE
    topic = f"empty-{uuid.uuid4().hex[:8]}"
    _send(kafka_bootstrap, topic, _valid(10))
    service = _service(tmp_path)
    learner = KafkaLearner(service, kafka_bootstrap, topic, checkpoint_every=10_000)
    started = time.monotonic()
    learner.run(idle_exit=1)
    assert service.ratings_learned == 10
    # drained, so it ended at once, not after the patience a lagging partition gets (a bound far
    # from a loaded machine's group join, not a speed claim; a first fetch that comes late may
    # rightly log a lag before it)
    assert time.monotonic() - started < LAG_PATIENCE


def test_a_group_members_idle_exit_goes_through_its_share(kafka_bootstrap, tmp_path):
    """The rule of tests/stream/kafka/test_idle_exit.py is the one a run obeys: the listener tells
    the share of the group's assignment, and the loop asks it before it ends."""
    import threading
    topic, group = f"share-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    _send(kafka_bootstrap, topic, _valid(100))
    service = _service(tmp_path)
    learner = KafkaLearner(service, kafka_bootstrap, topic, group, checkpoint_every=10_000)
    asked, settled = [], learner.share.settled
    learner.share.settled = lambda: asked.append(True) or settled()
    assert learner.share.joining()
    guard = threading.Timer(240, learner.stop.set)   # a run that never ends idle still ends
    guard.start()
    try:
        learner.run(idle_exit=1)
    finally:
        guard.cancel()
    assert service.ratings_learned == 100 and asked
    assert learner.share.assigned_at is not None   # the listener handed it the assignment
