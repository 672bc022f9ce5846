"""The librdkafka model-topic reader hands over every record a fetch brought, even when a broker's
error came among them: the client has moved past them, so a record dropped there would never be
applied on this replica (its member's later deltas then refused, its ledger short)."""

import confluent_kafka
import pytest

from sketchrec.stream.fleet.feed_reader import NativeReader


class _Message:
    def __init__(self, offset=None, error=None):
        self._offset, self._error = offset, error

    def error(self):
        return self._error

    def offset(self):
        return self._offset

    def value(self):
        return b"delta %d" % self._offset

    def headers(self):
        return None


class _Consumer:
    """Hands out the given fetches in turn, then nothing."""

    def __init__(self, *fetches):
        self.fetches = list(fetches)

    def consume(self, n, timeout):
        return self.fetches.pop(0) if self.fetches else []


def _reader(*fetches) -> NativeReader:
    reader = NativeReader.__new__(NativeReader)   # no broker: the consumer is a stub
    reader._errors, reader._error, reader.consumer = confluent_kafka, None, _Consumer(*fetches)
    return reader


def _error():
    return confluent_kafka.KafkaError(confluent_kafka.KafkaError._TRANSPORT)


def test_records_that_came_with_an_error_are_returned_and_the_error_raised_next():
    reader = _reader([_Message(5), _Message(6), _Message(error=_error()), _Message(8)], [_Message(9)])
    assert [r.offset for r in reader.poll(100)] == [5, 6, 8]
    with pytest.raises(confluent_kafka.KafkaException):
        reader.poll(100)
    assert [r.offset for r in reader.poll(100)] == [9]   # the retry reads on, nothing skipped


def test_an_error_alone_raises_at_once():
    reader = _reader([_Message(error=_error())], [_Message(3)])
    with pytest.raises(confluent_kafka.KafkaException):
        reader.poll(100)
    assert [r.offset for r in reader.poll(100)] == [3]
