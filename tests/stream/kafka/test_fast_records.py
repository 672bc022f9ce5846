"""The compiled record reader (stream/kafka/fast_records.py) hands out what kafka-python's does.

Generated record batches (every codec, keys, nulls, headers, long values, timestamps going back,
reads starting mid-batch and taken in pieces) go through kafka-python's ``PartitionRecords`` and
through ours; the records, the fetch position after each piece, and any error must be the same. A
deliberately broken reader is caught by the same comparison. On the bundled broker, a consumer
with the reader installed reads a topic of plain, keyed, null, compressed and transactional
(committed and aborted) messages exactly as one without it.
"""

import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka import TopicPartition
from kafka.consumer.fetcher import Fetcher
from kafka.record import MemoryRecords
from kafka.record.memory_records import MemoryRecordsBuilder

from sketchrec.stream.kafka import fast_records

FAST = fast_records.partition_records_class()
LIBRARY = Fetcher.PartitionRecords
TP = TopicPartition("ratings", 3)

values = st.one_of(st.none(), st.binary(max_size=40), st.binary(min_size=120, max_size=300),
                   st.builds(lambda n: b"9" * n, st.integers(16_000, 17_000)))
headers = st.one_of(st.just([]), st.just([]), st.lists(
    st.tuples(st.text(max_size=5), st.one_of(st.none(), st.binary(max_size=8))), min_size=1, max_size=2))
record = st.tuples(st.one_of(st.none(), st.binary(max_size=12)), values, headers,
                   st.integers(-5_000, 5_000))
batch = st.tuples(st.sampled_from([0, 1, 2, 3, 4]), st.lists(record, min_size=1, max_size=30))


def build(batches, first_offset: int = 100, append_time: bool = False) -> bytes:
    """The batches as a fetch response's record bytes (offsets consecutive from first_offset);
    ``append_time``: marked as broker-stamped (LOG_APPEND_TIME; their CRCs then no longer hold)."""
    out, offset = b"", first_offset
    for codec, records in batches:
        builder = MemoryRecordsBuilder(magic=2, compression_type=codec, batch_size=1 << 24, offset=offset)
        for key, value, hdrs, dt in records:
            builder.append(timestamp=1_700_000_000_000 + dt, key=key, value=value, headers=hdrs)
        builder.close()
        raw = bytearray(builder.buffer())
        if append_time:
            raw[22] |= 0x08   # the attributes' timestamp-type bit (big-endian int16 at byte 21)
        out += bytes(raw)
        offset += len(records)
    return out


def read(cls, data: bytes, fetch_offset: int, pieces: list[int], check_crcs: bool = True):
    """Records and fetch positions taken in ``pieces``, then the rest; or the error raised."""
    part = cls(fetch_offset, TP, MemoryRecords(data), check_crcs=check_crcs)
    out = []
    try:
        for n in pieces + [None]:
            out.append((part.take(n), part.next_fetch_offset))
    except Exception as exc:  # noqa: BLE001 - the comparison is of whatever happens
        out.append((type(exc).__name__, str(exc)))
    return out


def agree(cls, data, fetch_offset, pieces, check_crcs=True) -> bool:
    return read(cls, data, fetch_offset, pieces, check_crcs) == \
        read(LIBRARY, data, fetch_offset, pieces, check_crcs)


def test_the_reader_is_available_for_the_installed_kafka_python(monkeypatch):
    assert FAST is not None and issubclass(FAST, LIBRARY)
    # a kafka-python whose records have other fields keeps its own reader
    from collections import namedtuple
    from kafka.consumer import fetcher
    monkeypatch.setattr(fetcher, "ConsumerRecord", namedtuple("ConsumerRecord", ["topic", "offset"]))
    assert fast_records.partition_records_class() is None


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(batch, min_size=1, max_size=4), st.integers(0, 40), st.lists(st.integers(1, 25), max_size=4),
       st.booleans())
def test_records_and_positions_are_the_librarys(batches, skip, pieces, append_time):
    data = build(batches, append_time=append_time)
    total = sum(len(r) for _, r in batches)
    assert agree(FAST, data, 100 + min(skip, total), pieces, check_crcs=not append_time)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(batch, min_size=1, max_size=2), st.data())
def test_a_damaged_batch_fails_or_reads_as_the_librarys(batches, data):
    raw = bytearray(build(batches))
    at = data.draw(st.integers(fast_records.RECORDS_START, len(raw) - 1))   # past the first header
    raw[at] ^= data.draw(st.integers(1, 255))
    assert agree(FAST, bytes(raw), 100, [], check_crcs=False)
    assert agree(FAST, bytes(raw), 100, [], check_crcs=True)


def test_a_broken_reader_is_caught(monkeypatch):
    data = build([(0, [(None, b"1,2,3.5", [], 0), (b"k", b"3,4,5", [], 7)])])
    assert agree(FAST, data, 100, [])
    # a reader that drops each value's last byte: the comparison above must see it
    real = fast_records._slices
    monkeypatch.setattr(fast_records, "_slices", lambda d, s, n: real(d, s, n - (n > 0)))
    assert not agree(FAST, data, 100, [])


def test_a_consumer_reads_a_real_topic_as_the_library_does(kafka_bootstrap, monkeypatch):
    confluent_kafka = pytest.importorskip("confluent_kafka", reason="confluent-kafka is a test extra")
    from kafka import KafkaConsumer, KafkaProducer
    topic = f"fast-records-{uuid.uuid4().hex[:8]}"
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, linger_ms=5)
    for i in range(3_000):
        tombstone, headed = i % 501 == 0, i % 997 == 0   # a null value needs a key
        if headed:
            producer.flush()   # a message with headers in a batch of its own: only it goes slow
        producer.send(topic, key=str(i).encode() if tombstone or i % 7 == 0 else None, partition=i % 2,
                      value=None if tombstone else f"{i},{i % 50},{1 + i % 5}".encode(),
                      headers=[("origin", b"ldp")] if headed else None)
        if headed:
            producer.flush()
    producer.flush()
    producer.close()
    for codec in ("gzip", "lz4", "zstd"):
        tx = confluent_kafka.Producer({"bootstrap.servers": kafka_bootstrap, "compression.type": codec,
                                       "transactional.id": f"tx-{topic}-{codec}"})
        tx.init_transactions(30)
        for commit in (True, False):
            tx.begin_transaction()
            for i in range(200):
                tx.produce(topic, partition=i % 2, value=f"{i},{codec},{commit}".encode())
            tx.flush(30)
            tx.commit_transaction(30) if commit else tx.abort_transaction(30)

    def everything(install: bool) -> list:
        reader = KafkaConsumer(bootstrap_servers=kafka_bootstrap, enable_auto_commit=False,
                               isolation_level="read_committed", max_poll_records=700)
        if install:
            assert fast_records.install(reader)
        tps = [TopicPartition(topic, p) for p in (0, 1)]
        reader.assign(tps)
        reader.seek_to_beginning(*tps)
        ends, got = reader.end_offsets(tps), []
        while any(reader.position(tp) < ends[tp] for tp in tps):
            got += [r for records in reader.poll(timeout_ms=300).values() for r in records]
        reader.close()
        return sorted(got, key=lambda r: (r.partition, r.offset))

    whole = []   # batches the compiled pass read (the rest went the library's way)
    real = fast_records._records_of
    monkeypatch.setattr(fast_records, "_records_of",
                        lambda *a: whole.append(real(*a)) or whole[-1])
    fast, library = everything(True), everything(False)
    assert len(library) >= 3_000 and fast == library
    # every record without headers was read by the compiled pass (a batch fetched twice counts once)
    assert {(r.partition, r.offset) for got in whole if got for r in got[0]} == \
        {(r.partition, r.offset) for r in library if not r.headers}
