"""What a consuming service answers when the broker does not take every posted rating: 503 only
for ratings never handed to the producer (send them again), 504 for those handed over and not
acknowledged (the broker may have written them: check first), each naming its users."""

import pytest
from kafka.errors import KafkaTimeoutError, NotLeaderForPartitionError

from sketchrec.stream.feedback import FeedbackRefused, KafkaFeedback


class _Future:
    def __init__(self, error=None):
        self.error = error

    def get(self, timeout):
        if self.error is not None:
            raise self.error


class _Producer:
    """Refuses to take some users' batches; of those it takes, some are never acknowledged."""

    def __init__(self, refuse=(), unacknowledged=()):
        self.refuse, self.unacknowledged, self.sent = set(refuse), dict(unacknowledged), []

    def send(self, topic, key, value):
        if key.decode() in self.refuse:
            raise KafkaTimeoutError("no metadata for the topic (forced by the test)")
        self.sent.append(key.decode())
        return _Future(self.unacknowledged.get(key.decode()))


def _take(producer, rows):
    sink = KafkaFeedback("127.0.0.1:9", "t")
    sink._producer = producer
    with pytest.raises(FeedbackRefused) as refused:
        sink.take(rows)
    return refused.value


ROWS = [("ann", "a", 4.0, 0), ("bob", "b", 2.0, 0), ("cy", "c", 3.0, 0)]


def test_a_batch_refused_before_the_producer_took_it_is_to_be_sent_again_and_the_others_are_waited_for():
    producer = _Producer(refuse={"bob"})
    answer = _take(producer, ROWS)
    assert producer.sent == ["ann", "cy"]   # the batches after the refused one are sent all the same
    assert answer.status == 503 and "acknowledged 2 of 3" in answer.line
    assert "users bob were not taken: send them again" in answer.line


def test_a_batch_handed_over_and_not_acknowledged_may_have_been_written():
    for error in (KafkaTimeoutError("no answer in time"), NotLeaderForPartitionError("after the write")):
        answer = _take(_Producer(refuse={"cy"}, unacknowledged={"ann": error}), ROWS)
        assert answer.status == 504 and "acknowledged 1 of 3" in answer.line
        assert "users ann were not acknowledged: they may still be taken, check before sending" in answer.line
        assert "those of users cy were not taken: send them again" in answer.line
