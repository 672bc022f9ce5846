"""The model topic read through librdkafka (a learning member's reader) gives what kafka-python
gives (the read-only replica's): the same records from a position, in order, with their headers
and empty values; the same end and beginning offsets; and a feed built on it applies and settles
the deltas a member published (``stream.fleet.feed_reader``)."""

import time
import uuid

from kafka import KafkaProducer

from sketchrec.models.metrics import ErrorStats
from sketchrec.stream.fleet.feed_reader import NativeReader, PythonReader
from sketchrec.stream.fleet.model_feed import ModelFeed
from sketchrec.stream.fleet.model_topic import HEADER, MAX_MESSAGE_BYTES, FleetState, encode_meta
from sketchrec.stream.fleet.replicas import ensure_fleet_topics, model_producer
from sketchrec.stream.kafka.producer import ensure_topic
from conftest import wait_for


def _publish(bootstrap: str, topic: str) -> list[bytes]:
    """Five messages on the model topic: four deltas of two members (one with an empty value, a
    member that only stepped over dead letters) and a claim; the values."""
    values = [b"a" * 70_000, b"", b"b" * 10, b"", b"c" * 300_000]
    producer = model_producer(bootstrap)
    covers = [{0: (0, 10)}, {1: (0, 5)}, {0: (10, 20)}, {}, {1: (5, 9)}]
    for n, (value, cover) in enumerate(zip(values, covers)):
        member = "m1" if n % 2 == 0 else "m2"
        meta = encode_meta(member, n, cover, ErrorStats(), {}, claims=[2] if n == 3 else ())
        producer.send(topic, value=value, key=member.encode(), partition=0, headers=[(HEADER, meta)])
    producer.flush(timeout=30)
    producer.close(timeout=10)
    return values


# a bound on reading what is on the topic, for a loaded machine (a new client's first fetch waits
# for its connection and metadata); the callers assert what was read
READ_S = 120.0


def _read(reader, n: int) -> list[tuple]:
    got, deadline = [], time.monotonic() + READ_S
    while len(got) < n and time.monotonic() < deadline:
        got += [(r.offset, bytes(r.value or b""), [(k, bytes(v)) for k, v in r.headers]) for r in reader.poll(100)]
    reader.close()
    return got


def test_native_reader_reads_what_kafka_python_reads(kafka_bootstrap):
    topic = f"feed-{uuid.uuid4().hex[:6]}.model"
    ensure_fleet_topics(kafka_bootstrap, topic)
    values = _publish(kafka_bootstrap, topic)
    native = NativeReader(kafka_bootstrap, topic, 1, MAX_MESSAGE_BYTES)
    plain = PythonReader(kafka_bootstrap, topic, 1, MAX_MESSAGE_BYTES)
    assert native.end_offset() == plain.end_offset() == len(values)
    got, expected = _read(native, 4), _read(plain, 4)
    assert [r[0] for r in got] == [1, 2, 3, 4]
    assert got == expected
    assert [r[1] for r in got] == values[1:]
    assert all(k == HEADER for r in got for k, _ in r[2])


def test_both_readers_read_again_from_where_they_are_sought(kafka_bootstrap):
    """After a poll has moved a reader past records (``ModelFeed.poll`` after an error), ``seek``
    makes the next polls read them again, and only from there."""
    topic = f"feed-seek-{uuid.uuid4().hex[:6]}.model"
    ensure_fleet_topics(kafka_bootstrap, topic)
    values = _publish(kafka_bootstrap, topic)
    for reader in (NativeReader, PythonReader):
        reader = reader(kafka_bootstrap, topic, 0, MAX_MESSAGE_BYTES)
        got, deadline = [], time.monotonic() + READ_S
        while len(got) < len(values) and time.monotonic() < deadline:
            got += [r.offset for r in reader.poll(100)]
        assert got == list(range(len(values)))
        reader.seek(2)
        assert [r[0] for r in _read(reader, 3)] == [2, 3, 4]


def test_native_reader_asks_an_input_partitions_beginning(kafka_bootstrap):
    topic, model = f"feed-in-{uuid.uuid4().hex[:6]}", f"feed-{uuid.uuid4().hex[:6]}.model"
    ensure_topic(kafka_bootstrap, topic, 2)
    ensure_fleet_topics(kafka_bootstrap, model)
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap)
    for n in range(3):
        producer.send(topic, b"1,2,3,0", partition=1).get(timeout=30)
    producer.close(timeout=10)
    native = NativeReader(kafka_bootstrap, model, 0, MAX_MESSAGE_BYTES)
    plain = PythonReader(kafka_bootstrap, model, 0, MAX_MESSAGE_BYTES)
    try:
        assert native.beginning(topic, 1) == plain.beginning(topic, 1) == 0
    finally:
        native.close()
        plain.close()


def test_a_native_feed_applies_and_settles_what_members_published(kafka_bootstrap):
    """Another member's deltas are applied, this member's own only settled, and the coverage and
    position are what the topic says, as with kafka-python."""
    topic = f"feed-{uuid.uuid4().hex[:6]}.model"
    ensure_fleet_topics(kafka_bootstrap, topic)
    values = _publish(kafka_bootstrap, topic)
    states = {}
    for native in (True, False):
        applied, state = [], FleetState(member="m2")
        feed = ModelFeed(kafka_bootstrap, topic, state, applied.append, native=native)
        try:
            feed.catch_up(timeout=READ_S)
        finally:
            feed.close()
        assert applied == [values[0], values[2], values[4]]   # m1's; m2's own are settled only
        assert state.position == len(values) and feed.bytes_read == sum(map(len, values))
        states[native] = state.to_dict()
    assert states[True] == states[False]
    assert states[True]["covered"] == {"0": 20, "1": 9} and states[True]["owners"] == {"2": "m2"}


def test_an_idle_replica_reader_waits_at_the_broker_instead_of_asking_again(kafka_bootstrap):
    """The read-only replica's reader, at the end of a quiet model topic, lets each fetch wait at
    the broker (an idle replica then asks a few times a second, not hundreds: its network thread's
    CPU), and that wait stays below what the health probe counts as a silent broker."""
    from sketchrec.stream.fleet import feed_reader
    from sketchrec.stream.kafka.contact import SILENT_AFTER
    topic = f"feed-idle-{uuid.uuid4().hex[:6]}.model"
    ensure_fleet_topics(kafka_bootstrap, topic)
    reader = PythonReader(kafka_bootstrap, topic, 0, MAX_MESSAGE_BYTES)

    def held_fetch():   # the replica's polls of 200 ms, until fetches the broker held have ended
        assert reader.poll(200) == []
        fetches = reader.consumer.metrics()["consumer-fetch-manager-metrics"]
        # ms: the broker held fetches for the wait (a topic's first fetch may be answered at once;
        # a loaded broker's first answers may come late, before any fetch has ended). The mean as
        # well as the longest: a loaded broker can answer one fetch late with the wait broken, but
        # then most of its hundreds of fetches a second are answered at once
        return (fetches["fetch-latency-max"] >= 0.9 * feed_reader.FETCH_WAIT_MS
                and fetches["fetch-latency-avg"] >= 0.5 * feed_reader.FETCH_WAIT_MS)
    try:
        wait_for(held_fetch, "a fetch held at the broker for the reader's wait", timeout=120, every=0)
    finally:
        reader.close()
    assert feed_reader.FETCH_WAIT_MS < 1000 * SILENT_AFTER / 2
