"""Record batches the consumer cannot read: counted, logged, dead-lettered and stepped over.

A Kafka producer compresses whole record batches (gzip, snappy, lz4, zstd). kafka-python reads a
batch only when the library for its codec is importable, and it raises from ``poll`` otherwise
(``UnsupportedCodecError``), or when the compressed bytes do not decompress. Left alone, that
exception kills the consumer on the first such batch, and again at every restart. Here a poll that
raises it is turned into an :class:`UnreadableBatch`: the partition, its offset range and the
codec. The caller counts it under the reason ``unreadable <codec> batch``, dead-letters it, and
the consumer is sought past it, so learning goes on with the next batch and the other partitions.
A batch whose CRC does not hold (a broker that stores what it is sent, as the bundled one does)
is set aside the same way, under ``batch failing its CRC check``: our record reader
(``fast_records``) attaches its header to kafka-python's ``CorruptRecordError``.

kafka-python's exception names neither the partition nor the batch. The partition is the one its
fetcher was reading (``Fetcher._next_partition_records``); the batch's offsets come from its
header, which is never compressed: :func:`install` wraps the v2 batch's decompression so that any
failure there carries the batch's header. Without that information (a legacy v0/v1 message set,
or a future kafka-python), the consumer steps over a single offset instead.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Callable

from sketchrec.stream.kafka import internals

log = logging.getLogger(__name__)

CODECS = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
MAX_DEAD_BATCH_BYTES = 256 << 10  # larger raw batches are dead-lettered without their bytes


@dataclass(frozen=True)
class BatchHeader:
    """What a v2 record batch's (uncompressed) header says about it, and what is wrong with it:
    ``problem`` "codec" (cannot be decompressed) or "crc" (its CRC does not hold)."""

    base_offset: int
    next_offset: int
    records: int
    codec: str
    raw: bytes | None  # the batch as fetched, if small enough to dead-letter
    problem: str = "codec"


def header_of(batch, problem: str = "codec") -> BatchHeader:
    """The header of a kafka-python ``DefaultRecordBatch`` (parsed from its first bytes, before
    any decompression)."""
    raw = internals.batch_bytes(batch) if internals.batch_size(batch) <= MAX_DEAD_BATCH_BYTES else None
    return BatchHeader(batch.base_offset, batch.next_offset, internals.batch_records(batch)[1],
                       CODECS.get(batch.compression_type, f"codec-{batch.compression_type}"), raw,
                       problem)


@dataclass(frozen=True)
class UnreadableBatch:
    """One batch set aside: where it was, how many messages it held and why it was unreadable."""

    topic: str
    partition: int
    first_offset: int
    next_offset: int
    messages: int
    codec: str
    error: str
    raw: bytes | None = None
    problem: str = "codec"

    @property
    def reason(self) -> str:
        return "batch failing its CRC check" if self.problem == "crc" else f"unreadable {self.codec} batch"

    def dead_letter(self) -> bytes:
        """The dead-letter record, in the form of ``messages.dead_letter`` plus the batch's range."""
        return json.dumps({"topic": self.topic, "partition": self.partition,
                           "offset": self.first_offset, "last_offset": self.next_offset - 1,
                           "index": None, "messages": self.messages, "reason": self.reason,
                           "text": self.error, "codec": self.codec,
                           "batch_hex": self.raw.hex() if self.raw is not None else None}).encode()


_installed = False


def install() -> None:
    """Make a failure to decompress a v2 record batch carry the batch's header (idempotent).

    The exception keeps its type; it gains an attribute ``sketchrec_batch`` (a BatchHeader). On a
    kafka-python this was not checked against, nothing is wrapped (``kafka.internals``).
    """
    global _installed
    if not _installed:
        _installed = internals.wrap_uncompress(_mark)


def _mark(batch, exc: BaseException) -> None:
    exc.sketchrec_batch = header_of(batch)


def unreadable(consumer, exc: BaseException) -> UnreadableBatch | None:
    """The batch a ``poll`` failed on, if ``exc`` is a batch that cannot be decompressed; else None."""
    from kafka.errors import UnsupportedCodecError
    header = getattr(exc, "sketchrec_batch", None)
    if header is None and not isinstance(exc, UnsupportedCodecError):
        return None
    tp = internals.fetching_partition(consumer)
    if tp is None:
        return None  # cannot say where it is: better to fail loudly than to skip blindly
    position = consumer.position(tp)
    if header is None:  # no header: step over one offset
        return UnreadableBatch(tp.topic, tp.partition, position, position + 1, 1, "unknown", str(exc))
    first = max(position, header.base_offset)
    messages = header.records if first == header.base_offset else header.next_offset - first
    return UnreadableBatch(tp.topic, tp.partition, first, header.next_offset, messages, header.codec,
                           str(exc), header.raw, header.problem)


def poll_past_unreadable(consumer, set_aside: Callable[[UnreadableBatch], None],
                         timeout_ms: int) -> dict | None:
    """``consumer.poll``, except that a batch that cannot be decompressed is handed to
    ``set_aside``, logged, and sought past; then the result is None (not idle: there was data)."""
    from kafka import TopicPartition
    try:
        return consumer.poll(timeout_ms=timeout_ms)
    except Exception as exc:
        batch = unreadable(consumer, exc)
        if batch is None:
            raise
        log.error("set aside %s on %s[%d], offsets %d..%d (%d messages): %s", batch.reason,
                  batch.topic, batch.partition, batch.first_offset, batch.next_offset - 1,
                  batch.messages, batch.error)
        set_aside(batch)
        consumer.seek(TopicPartition(batch.topic, batch.partition), batch.next_offset)
        return None
