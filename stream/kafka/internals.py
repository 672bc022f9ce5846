"""kafka-python's internals: the one module that reaches them, and only on versions read for it.

kafka-python has no public API for what four features of the consumer need, so they read or
wrap its private objects:
- the compiled record reader (``kafka.fast_records``) gives a consumer's fetcher a subclass of its
  ``PartitionRecords`` whose batch loop follows the library's, step for step;
- a batch that cannot be decompressed (``kafka.codecs``) is named by the partition the fetcher was
  reading and the batch's own header, found by wrapping ``DefaultRecordBatch._maybe_uncompress``;
- the broker's contact and the lag (``kafka.contact``) are read from the client's connections, the
  subscription's positions and the fetch responses' last stable offsets, without a request;
- a topic deleted and created again (``kafka.identity``) is recognised by its topic id, which only
  the client's cluster metadata holds.

Every such reach is here, and each is taken only when the installed kafka-python is a version
whose source it was read against (``GUARD``, a ``sketchrec.versions.Checked``; the project pins
``>=3.0`` only). On any other
version each feature says so once, in one log line, and takes the public path instead: the
library's own record reader, a poll's decompression error raised as kafka-python raises it, the
broker counted as answering and the lag unknown, a re-created topic recognised by its offsets
alone. Never a wrong result: only speed, or a figure, is lost.

>>> GUARD.checked("3.0.12"), GUARD.checked("3.1.0"), GUARD.checked("not a version")
(True, False, False)
"""

from __future__ import annotations

import functools
from typing import Callable

from sketchrec.versions import Checked


def version() -> str:
    import kafka
    return str(getattr(kafka, "__version__", "unknown"))


# the pin's floor, and the newest kafka-python whose source these reaches were read in
GUARD = Checked("kafka-python", (3, 0), (3, 0), lambda: version())
checked, usable = GUARD.checked, GUARD.usable


# --- the record reader (kafka.fast_records) ----------------------------------------------------------
RECORD_FIELDS = ("topic", "partition", "leader_epoch", "offset", "timestamp", "timestamp_type", "key",
                 "value", "headers", "checksum", "serialized_key_size", "serialized_value_size",
                 "serialized_header_size")   # kafka-python 3.0's ConsumerRecord, as the reader builds it
_NEEDED = ("_unpack_records", "_maybe_skip_record", "_consume_aborted_transactions_up_to",
           "_contains_abort_marker", "_is_batch_aborted", "_deserialize")


def partition_records_class(read_batch: Callable, crc_header: Callable) -> type | None:
    """kafka-python's ``PartitionRecords`` with whole v2 batches read by ``read_batch(batch, tp,
    leader_epoch, consumer_record)`` (records and sizes, or None: the library reads that batch);
    ``crc_header(batch)`` is attached to a CRC failure. None on an unchecked kafka-python or one
    whose fetcher lacks what the subclass builds on."""
    if not usable("compiled record reader", "kafka-python's own record reader"):
        return None
    from kafka.consumer import fetcher as kafka_fetcher
    library = getattr(kafka_fetcher.Fetcher, "PartitionRecords", None)
    if library is None or not all(hasattr(library, name) for name in _NEEDED) \
            or not all(hasattr(kafka_fetcher, name) for name in ("Errors", "IsolationLevel", "ConsumerRecord")) \
            or getattr(kafka_fetcher.ConsumerRecord, "_fields", None) != RECORD_FIELDS:
        return None
    return _fast_class(library, kafka_fetcher, read_batch, crc_header)


def install_partition_records(consumer, cls: type) -> bool:
    """``cls`` as ``consumer``'s fetcher's PartitionRecords (that fetcher only; the library's class
    is untouched). False, the consumer left as it was, if its fetcher is not kafka-python's."""
    from kafka.consumer import fetcher as kafka_fetcher
    fetcher = getattr(consumer, "_fetcher", None)
    if not isinstance(fetcher, kafka_fetcher.Fetcher):
        return False
    fetcher.PartitionRecords = cls
    return True


def batch_bytes(batch) -> bytes:
    """A ``DefaultRecordBatch``'s bytes (decompressed once ``uncompress`` ran)."""
    return bytes(batch._buffer)


def batch_size(batch) -> int:
    return len(batch._buffer)


def batch_records(batch) -> tuple[int, int]:
    """(where its first record starts, how many records the header says it holds)."""
    return batch._pos, batch._num_records


def uncompress(batch) -> None:
    batch._maybe_uncompress()


@functools.cache   # one class per kafka-python PartitionRecords and reader
def _fast_class(library, kafka_fetcher, read_batch, crc_header):
    errors = kafka_fetcher.Errors
    read_committed = kafka_fetcher.IsolationLevel.READ_COMMITTED
    consumer_record = kafka_fetcher.ConsumerRecord

    class FastPartitionRecords(library):
        """kafka-python's PartitionRecords with whole batches read by the compiled pass.

        ``_unpack_records`` follows kafka-python 3.0's, step for step, except where marked."""

        def _unpack_records(self, tp, records, key_deserializer, value_deserializer):
            plain = key_deserializer is None and value_deserializer is None  # ours: bytes out
            try:
                batch = records.next_batch()
                last_batch = None
                while batch is not None:
                    last_batch = batch
                    if self.check_crcs and not batch.validate_crc():
                        exc = errors.CorruptRecordError(
                            "Record batch for partition %s at offset %s failed crc check" % (
                                self.topic_partition, batch.base_offset))
                        if batch.magic == 2:   # ours: the consumer can set the batch aside
                            exc.sketchrec_batch = crc_header(batch)
                        raise exc
                    if batch.magic == 2:
                        self.leader_epoch = batch.leader_epoch
                        if self.isolation_level == read_committed and batch.has_producer_id():
                            self._consume_aborted_transactions_up_to(batch.last_offset)
                            producer_id = batch.producer_id
                            if self._contains_abort_marker(batch):
                                self.aborted_producer_ids.discard(producer_id)
                            elif self._is_batch_aborted(batch):
                                self.next_fetch_offset = batch.next_offset
                                batch = records.next_batch()
                                continue
                        if batch.is_control_batch:
                            self.next_fetch_offset = batch.next_offset
                            batch = records.next_batch()
                            continue
                        # ours: the whole batch in one compiled pass, when it can be
                        fast = read_batch(batch, tp, self.leader_epoch, consumer_record) if plain else None
                        if fast is not None:
                            got, sizes = fast
                            self.records_read += len(got)
                            self.bytes_read += int(sizes.sum())
                            for record in got:
                                self.next_fetch_offset = record.offset + 1
                                yield record
                            batch = records.next_batch()
                            continue
                    for record in batch:   # the library's reader (headers, v0/v1, malformed)
                        if self.check_crcs and not record.validate_crc():
                            raise errors.CorruptRecordError(
                                "Record for partition %s at offset %s failed crc check" % (
                                    self.topic_partition, record.offset))
                        key_size = len(record.key) if record.key is not None else -1
                        value_size = len(record.value) if record.value is not None else -1
                        key = self._deserialize(key_deserializer, tp.topic, record.headers, record.key)
                        value = self._deserialize(value_deserializer, tp.topic, record.headers,
                                                  record.value)
                        headers = record.headers
                        header_size = sum(
                            len(h_key.encode("utf-8")) + (len(h_val) if h_val is not None else 0)
                            for h_key, h_val in headers) if headers else -1
                        self.records_read += 1
                        self.bytes_read += record.size_in_bytes
                        self.next_fetch_offset = record.offset + 1
                        yield consumer_record(
                            tp.topic, tp.partition, self.leader_epoch, record.offset,
                            record.timestamp, record.timestamp_type, key, value, record.headers,
                            record.checksum, key_size, value_size, header_size)
                    batch = records.next_batch()
                else:
                    if last_batch and last_batch.magic == 2:
                        self.next_fetch_offset = last_batch.next_offset
                    self.drain()
            except StopIteration:   # as kafka-python: a StopIteration must not end the generator
                raise RuntimeError('StopIteration raised unpacking messageset')

    return FastPartitionRecords


# --- unreadable batches (kafka.codecs) ------------------------------------------------------------
def wrap_uncompress(mark: Callable[[object, BaseException], None]) -> bool:
    """Call ``mark(batch, exc)`` on any failure to decompress a v2 batch (the exception keeps its
    type and is raised on). False on an unchecked kafka-python: nothing wrapped."""
    if not usable("unreadable batches named by their header",
                  "a poll's decompression error raised as kafka-python raises it"):
        return False
    from kafka.record.default_records import DefaultRecordBatch
    original = DefaultRecordBatch._maybe_uncompress

    def _maybe_uncompress(self):
        try:
            original(self)
        except Exception as exc:
            mark(self, exc)
            raise

    DefaultRecordBatch._maybe_uncompress = _maybe_uncompress
    return True


def fetching_partition(consumer):
    """The TopicPartition the consumer's fetcher was reading (None: unknown, or unchecked)."""
    if not checked():
        return None
    part = getattr(getattr(consumer, "_fetcher", None), "_next_partition_records", None)
    return getattr(part, "topic_partition", None)


# --- contact and lag (kafka.contact) ----------------------------------------------------------------
def connections(client_owner) -> list | None:
    """The client's broker connections (objects with ``connected``, ``transport.last_read`` and
    ``in_flight_requests``), or None on an unchecked kafka-python. Raises AttributeError (and, as
    the IO thread changes them, RuntimeError) when they are not where 3.0 keeps them."""
    if not usable("broker contact from the client's connections", "the broker counted as answering"):
        return None
    return list(client_owner._client._manager._conns.values())


def unanswered(conn) -> list[tuple[int | None, float, float]]:
    """(API key, when sent, deadline: monotonic seconds) of each request a connection of
    ``connections`` awaits an answer to. 3.0 keeps the times in the connection's in-flight deque
    and the request headers, which name the API, in its protocol parser's, both by correlation id
    (the key None when the parser's is gone: answered meanwhile, or no parser yet)."""
    parser = getattr(conn, "parser", None)
    headers = list(parser.in_flight_requests) if parser is not None else []
    keys = {h.correlation_id: h.request_api_key for h in headers}
    return [(keys.get(cid), sent, deadline) for cid, _, sent, deadline, _ in list(conn.in_flight_requests)]


def track_stable_offsets(consumer) -> bool:
    """Keep, on the consumer's fetcher, each partition's last stable offset from every fetch
    response it parses (kafka-python reads it and drops it; ``stable_offsets`` returns them).
    False, the consumer untouched, if that is not possible here."""
    if not usable("the lag's last stable offsets", "the lag counts open transactions' messages"):
        return False
    fetcher = getattr(consumer, "_fetcher", None)
    parse = getattr(fetcher, "_parse_fetched_data", None)
    if parse is None:
        return False
    stable = fetcher.sketchrec_stable = {}

    def parse_keeping_stable(completed_fetch):
        offset = getattr(completed_fetch.partition_data, "last_stable_offset", -1)
        if isinstance(offset, int) and offset >= 0:   # -1: the broker did not say
            stable[completed_fetch.topic_partition] = offset
        return parse(completed_fetch)

    fetcher._parse_fetched_data = parse_keeping_stable   # this consumer's fetcher only
    return True


def stable_offsets(consumer) -> dict:
    """TopicPartition -> last stable offset, as ``track_stable_offsets`` kept them ({}: none)."""
    return getattr(getattr(consumer, "_fetcher", None), "sketchrec_stable", {})


def assignment(consumer) -> list | None:
    """(TopicPartition, state with ``highwater`` and ``position``) of each assigned partition, or
    None on an unchecked kafka-python."""
    if not usable("the lag from the subscription's positions", "the lag unknown"):
        return None
    return list(consumer._subscription.assignment.items())


# --- topic identity (kafka.identity) ----------------------------------------------------------------
def topic_id(consumer, topic: str) -> str | None:
    """The topic's id from the client's cluster metadata (None: unknown, or unchecked)."""
    if not usable("topic ids", "a re-created topic recognised by its offsets alone"):
        return None
    found = consumer._client.cluster.topic_id(topic)
    return str(found) if found is not None else None
