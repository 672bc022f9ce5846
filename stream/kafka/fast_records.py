"""A consumer's records read out of each record batch in one compiled pass.

kafka-python reads a fetched v2 record batch one record at a time in Python (``DefaultRecordBatch.
_read_msg``: six varints, two slices, a record object, then a ``ConsumerRecord`` with its sizes),
about 5 us a record: with one rating per message, two thirds of a learner's time (py-spy on
``bench.kafka``). The library gives no batch-level access, so :func:`install` gives one consumer's
fetcher a ``PartitionRecords`` (built in ``kafka.internals``, the one module that reaches
kafka-python's internals, on the versions it was checked against) whose batch loop is
kafka-python's own (CRC check, aborted transactions skipped under read_committed, control batches
stepped over, the fetch position kept) but whose records come from :func:`scan_records`, a numba
pass over the batch's (decompressed) bytes that returns every record's offset delta, timestamp
delta and key / value spans at once. The records handed out are the same ``ConsumerRecord``
tuples, field for field.

A batch the pass does not take as a whole — a record with headers, a control batch, anything
malformed — goes through kafka-python's own reader, so headers are read and corrupt records raise
the library's ``CorruptRecordError`` exactly as before. ``tests/test_fast_records.py`` holds the
two readers to the same records on generated batches and on a real broker (transactions,
compression, tombstones, keys, headers).

>>> import numpy as np
>>> from kafka.record.default_records import DefaultRecordBatchBuilder
>>> b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=0, producer_id=-1,
...                               producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
>>> for i, v in enumerate([b"1,2,4.5", None, b"x" * 200]):
...     _ = b.append(i, timestamp=1000 + i, key=None if i else b"k", value=v, headers=[])
>>> buf = np.frombuffer(bytes(b.build()), np.uint8)
>>> out = scan_records(buf, RECORDS_START, 3)
>>> out[0], out[1].tolist(), out[4].tolist(), out[6].tolist()   # read, offsets, key and value lengths
(3, [0, 1, 2], [1, -1, -1], [7, -1, 200])
"""

from __future__ import annotations

from itertools import repeat

import numpy as np
from numba import njit

from sketchrec.stream.kafka import codecs as codec_errors
from sketchrec.stream.kafka import internals
from sketchrec.stream.kafka.internals import RECORD_FIELDS  # noqa: F401 (the records' fields)

# the v2 batch header's size: records start here in an uncompressed batch
RECORDS_START = 61


@njit(cache=True, nogil=True)
def _varint(buf, pos, end):
    """Kafka's zig-zag varint at ``pos``: (value, next position), position -1 if malformed or if
    ``pos`` already is -1."""
    raw = np.int64(0)
    shift = 0
    while True:
        if pos < 0 or pos >= end or shift > 63:
            return np.int64(0), -1
        b = np.int64(buf[pos])
        pos += 1
        raw |= (b & 0x7F) << shift
        if b < 0x80:
            break
        shift += 7
    # zig-zag: the sign is the lowest bit (a logical shift of the 64-bit pattern)
    return np.int64(np.uint64(raw) >> np.uint64(1)) ^ -(raw & 1), pos


@njit(cache=True, nogil=True)
def scan_records(buf, pos, n):
    """Spans of the ``n`` records in ``buf`` from ``pos``: (records read without headers,
    offset deltas, timestamp deltas, key starts, key lengths, value starts, value lengths, sizes).

    Stops short (fewer than ``n`` read) at a record with headers, at a malformed record, or when
    bytes are left after the last record: the caller then reads the batch the library's way."""
    off = np.empty(n, np.int64)
    ts = np.empty(n, np.int64)
    ks = np.empty(n, np.int64)
    kl = np.empty(n, np.int64)
    vs = np.empty(n, np.int64)
    vl = np.empty(n, np.int64)
    size = np.empty(n, np.int64)
    end = buf.shape[0]
    for j in range(n):
        # a malformed varint leaves pos at -1 for the rest of the record (checked once, below)
        length, pos = _varint(buf, pos, end)
        start = pos
        _, pos = _varint(buf, pos, end)            # attributes (unused by Kafka so far)
        ts[j], pos = _varint(buf, pos, end)
        off[j], pos = _varint(buf, pos, end)
        kl[j], pos = _varint(buf, pos, end)
        ks[j] = pos
        if pos >= 0 and kl[j] > 0:
            pos += kl[j]
        vl[j], pos = _varint(buf, pos, end)
        vs[j] = pos
        if pos >= 0 and vl[j] > 0:
            pos += vl[j]
        headers, pos = _varint(buf, pos, end)
        if pos < 0 or length < 0 or headers != 0 or pos - start != length or pos > end:
            return j, off, ts, ks, kl, vs, vl, size
        size[j] = length
    if pos != end:
        return -1, off, ts, ks, kl, vs, vl, size
    return n, off, ts, ks, kl, vs, vl, size


def _slices(data: bytes, starts: np.ndarray, lengths: np.ndarray) -> list:
    """data[start:start + length] for each span, None where the length is negative (null)."""
    if (lengths < 0).all():
        return [None] * len(lengths)
    ends = (starts + lengths).tolist()
    if (lengths >= 0).all():
        return [data[a:b] for a, b in zip(starts.tolist(), ends)]
    return [data[a:b] if b >= a else None for a, b in zip(starts.tolist(), ends)]


def _records_of(batch, tp, leader_epoch, consumer_record):
    """The batch's records as ConsumerRecords if the compiled pass reads all of them, else None.

    Only the batch's decompression happens here (the library's reader would do it first, and
    does not again): on None the library reads the batch from its first record."""
    internals.uncompress(batch)   # kafka-python's (with codec_errors' header on failure)
    data = internals.batch_bytes(batch)
    n = batch.records_count
    start, _ = internals.batch_records(batch)
    read, off, ts, ks, kl, vs, vl, size = scan_records(np.frombuffer(data, np.uint8), start, n)
    if read != n:
        return None
    base, ts_type = batch.base_offset, batch.timestamp_type
    if ts_type == batch.LOG_APPEND_TIME:
        times = repeat(batch.max_timestamp, n)
    else:
        times = (ts + batch.first_timestamp).tolist()
    keys, values = _slices(data, ks, kl), _slices(data, vs, vl)
    # one C-level map: the per-record cost is the ConsumerRecord itself
    out = list(map(consumer_record, repeat(tp.topic, n), repeat(tp.partition), repeat(leader_epoch),
                   (off + base).tolist(), times, repeat(ts_type), keys, values,
                   [[] for _ in range(n)], repeat(None), np.maximum(kl, -1).tolist(),
                   np.maximum(vl, -1).tolist(), repeat(-1)))
    return out, size


def _read_batch(batch, tp, leader_epoch, consumer_record):
    return _records_of(batch, tp, leader_epoch, consumer_record)   # looked up at each call


def install(consumer) -> bool:
    """Give ``consumer`` (a kafka-python ``KafkaConsumer``) the compiled record reader.

    False, and the consumer left as it was, on a kafka-python whose internals this was not
    checked against (``kafka.internals``): correctness never depends on it, only speed."""
    fast = partition_records_class()
    return fast is not None and internals.install_partition_records(consumer, fast)


def partition_records_class() -> type | None:
    """The fast ``PartitionRecords`` for the installed kafka-python, or None (``kafka.internals``:
    an unchecked version, or a fetcher that lacks what ours builds on)."""
    return internals.partition_records_class(_read_batch, _crc_header)


def _crc_header(batch):
    return codec_errors.header_of(batch, "crc")
