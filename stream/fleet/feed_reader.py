"""Readers of the model topic for ``model_feed.ModelFeed``: what a poll costs a learning member.

A member reads the model topic after every sync-sized chunk it learns, whether or not another
member has published since. With kafka-python every such poll hands work to its network thread
and waits for it twice (send the fetches, collect them), and unpacks each record of a delta in
Python: CPU of both threads at every poll, empty or not, which a fleet member pays once per
chunk (a plain learner polls its input once per tens of thousands of ratings). librdkafka
(confluent-kafka, already the ``kafka`` extra's producer) fetches ahead in its own C threads; a
poll takes what has arrived from its queue in one C call.

- ``NativeReader``: librdkafka, for learning members (``FleetLearner``) and rebuilds;
- ``PythonReader``: kafka-python, for the read-only ``FleetReplica``, whose health probe reads
  the client's connections (``kafka.contact.broker_contact`` needs kafka-python's internals).

Both read partition 0 of the topic from a given offset, read committed, and return ``Record`` objects
in offset order; ``seek`` sets where the next poll reads (``ModelFeed.poll`` after an error: the
clients move past whatever a fetch handed over, taken or not). A position the topic no longer
holds (retention deleted it) raises ``OutOfRange``: both clients would otherwise move to the end
of the topic by default, and a replica would skip the deltas between without a word.

>>> Record(3, b"", [("sketchrec.delta", b"{}")]).offset
3
"""

from __future__ import annotations

import logging
import uuid
from typing import NamedTuple

log = logging.getLogger(__name__)
MAX_RECORDS = 500   # per poll: a poll applies what it returns before the member learns on
# How long a fetch may wait at the broker when nothing has arrived (``fetch.wait.max.ms``): the
# reader's and the broker's CPU while the topic is quiet, against how late a delta is handed over.
# A broker may hold a waiting fetch past a delta's arrival (Tansu, the test broker, does: deltas
# came later the longer the wait; docs/fleet.md). The read-only replica only serves: a delta a
# fraction of a second late costs little, and it waits long (kafka-python's default)
FETCH_WAIT_MS = 500
# a learning member applies the others' deltas between its chunks: each one handed over late is
# learned without for more chunks (the drift its sync interval bounds), so its fetches wait briefly
MEMBER_FETCH_WAIT_MS = 20


class OutOfRange(LookupError):
    """The reader's position is outside the topic's log (below its start, after retention)."""


class Record(NamedTuple):
    """One message of the model topic, as ``ModelFeed._take`` reads it."""

    offset: int
    value: bytes | None
    headers: list


class NativeReader:
    """The model topic through librdkafka, from ``position`` (see the module docstring).

    Parameters
    ----------
    bootstrap, topic : the broker and the model topic (one partition).
    position : the offset of the first message to read.
    max_bytes : the largest message (the topic's ``max.message.bytes``).

    Examples
    --------
    >>> reader = NativeReader("127.0.0.1:9092", "ratings.model", 0, 64 << 20)  # doctest: +SKIP
    >>> [record.offset for record in reader.poll(200)]                         # doctest: +SKIP
    [0, 1, 2]
    """

    def __init__(self, bootstrap: str, topic: str, position: int, max_bytes: int):
        import confluent_kafka
        self._errors = confluent_kafka   # its error and partition types
        self.consumer = confluent_kafka.Consumer({
            "bootstrap.servers": bootstrap,
            # required by the client; never joined (assign only) and nothing is committed
            "group.id": f"model-reader-{uuid.uuid4().hex[:12]}", "enable.auto.commit": False,
            "enable.auto.offset.store": False, "isolation.level": "read_committed",
            "auto.offset.reset": "error",   # not "latest": a lost position is an error (OutOfRange)
            "enable.partition.eof": False, "check.crcs": False,   # the broker checked them on produce
            "fetch.wait.max.ms": MEMBER_FETCH_WAIT_MS,
            "fetch.message.max.bytes": max_bytes, "fetch.max.bytes": max_bytes,
            "receive.message.max.bytes": max_bytes + (1 << 20),
            "logger": log,   # its connection errors through logging, not raw stderr
        })
        self.tp = confluent_kafka.TopicPartition(topic, 0, position)
        self.consumer.assign([self.tp])
        self._error = None   # a broker's error met after records: raised at the next poll

    def poll(self, timeout_ms: int) -> list[Record]:
        """The records that have arrived (waiting up to ``timeout_ms`` for the first); a broker's
        error on the partition raises (a caller retries as after any failed read). The client has
        moved past every message ``consume`` handed over, so the records that came with an error
        are returned all the same and the error raised at the next poll: none is skipped."""
        self._raise_pending()
        out = []
        for msg in self.consumer.consume(MAX_RECORDS, timeout_ms / 1000.0):
            if msg.error() is not None:
                self._error = self._error or msg.error()
            else:
                out.append(Record(msg.offset(), msg.value(), msg.headers() or []))
        if not out:
            self._raise_pending()
        return out

    def _raise_pending(self) -> None:
        """Raise the error held from a fetch (once), if any."""
        error, self._error = self._error, None
        if error is not None and error.code() == self._errors.KafkaError._AUTO_OFFSET_RESET:
            raise OutOfRange(error.str())
        if error is not None:
            raise self._errors.KafkaException(error)

    def seek(self, position: int) -> None:
        """Read from ``position`` next (what a fetch brought past it is read again). Assigned
        afresh, which works whatever the fetcher's state (a seek needs the partition fetching);
        an error pending from a fetch is dropped with the fetch (a lasting one is met again)."""
        self._error = None
        self.tp = self._errors.TopicPartition(self.tp.topic, 0, position)
        self.consumer.assign([self.tp])

    def end_offset(self, timeout: float = 30.0) -> int:
        """The offset after the topic's last message now (read committed)."""
        return self.consumer.get_watermark_offsets(self.tp, timeout=timeout, cached=False)[1]

    def beginning(self, topic: str, partition: int, timeout: float = 30.0) -> int:
        """The first offset of a partition of another topic (the input's)."""
        tp = self._errors.TopicPartition(topic, partition)
        return self.consumer.get_watermark_offsets(tp, timeout=timeout, cached=False)[0]

    def close(self) -> None:
        self.consumer.close()


class PythonReader:
    """The model topic through kafka-python (``consumer`` is the client ``broker_contact`` reads)."""

    def __init__(self, bootstrap: str, topic: str, position: int, max_bytes: int):
        from kafka import KafkaConsumer, TopicPartition
        from sketchrec.stream.kafka.consumer import kafka_config
        self.tp = TopicPartition(topic, 0)
        # no CRC check in Python (the broker checked it on produce). The replica's thread does
        # nothing but read, so its fetch may wait at the broker (FETCH_WAIT_MS): an idle replica
        # sends a few fetches a second instead of hundreds (its network thread's CPU). The wait
        # stays well under ``kafka.contact.SILENT_AFTER``. "none": a lost position raises.
        self.consumer = KafkaConsumer(**kafka_config(bootstrap), enable_auto_commit=False,
                                      auto_offset_reset="none",
                                      isolation_level="read_committed", max_poll_records=MAX_RECORDS,
                                      check_crcs=False, fetch_max_wait_ms=FETCH_WAIT_MS,
                                      fetch_max_bytes=max_bytes, max_partition_fetch_bytes=max_bytes)
        self.consumer.assign([self.tp])
        self.consumer.seek(self.tp, position)

    def poll(self, timeout_ms: int) -> list:
        from kafka.errors import OffsetOutOfRangeError
        try:
            return self.consumer.poll(timeout_ms=timeout_ms).get(self.tp, [])
        except OffsetOutOfRangeError as exc:
            raise OutOfRange(str(exc)) from None

    def seek(self, position: int) -> None:
        """Read from ``position`` next (kafka-python drops what it fetched for other offsets)."""
        self.consumer.seek(self.tp, position)

    def end_offset(self, timeout: float = 30.0) -> int:
        return self.consumer.end_offsets([self.tp])[self.tp]

    def beginning(self, topic: str, partition: int) -> int:
        from kafka import TopicPartition
        tp = TopicPartition(topic, partition)
        return self.consumer.beginning_offsets([tp])[tp]

    def close(self) -> None:
        self.consumer.close(autocommit=False)
