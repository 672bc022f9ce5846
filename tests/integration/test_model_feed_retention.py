"""A model-topic position that retention has deleted is never read past: both readers raise
instead of moving to the topic's end (their clients' default), ``ModelFeed`` names the lost offset
and the log's start and applies nothing, and a replica is opened only from a snapshot whose
position the log still holds (``stream.fleet.feed_reader``, ``model_topic.Truncated``).

Tansu, the tests' broker, cannot delete records (its memory store leaves DeleteRecords
unimplemented) nor applies retention, and answers a fetch outside its log with no records rather
than OFFSET_OUT_OF_RANGE; so these tests run against librdkafka's own mock broker (a Kafka-protocol
server on a loopback port, shipped in confluent-kafka), whose partitions keep only their newest
few megabytes: writing more moves the log's start, as retention does."""

import logging
import re
import time
import uuid

import pytest

from sketchrec.models.metrics import ErrorStats
from sketchrec.stream.fleet.feed_reader import NativeReader, OutOfRange, PythonReader
from sketchrec.stream.fleet.model_feed import ModelFeed
from sketchrec.stream.fleet.model_topic import HEADER, MAX_MESSAGE_BYTES, FleetState, Truncated, encode_meta
from conftest import wait_for

confluent_kafka = pytest.importorskip("confluent_kafka")

DELTA_BYTES = 600 << 10   # under the mock's message limit; a dozen overflow what a partition keeps
DELTAS = 12
READ_S = 60.0   # a bound for a loaded machine; the claims are what is read, not how soon


@pytest.fixture(scope="module")
def mock_broker():
    """(bootstrap, producer) of a librdkafka mock cluster, alive while the producer is."""
    lines, log = [], logging.getLogger(f"mock-broker-{uuid.uuid4().hex[:6]}")
    log.propagate = False
    log.addHandler(type("Keep", (logging.Handler,), {"emit": lambda self, r: lines.append(r.getMessage())})())
    log.setLevel(logging.DEBUG)
    producer = confluent_kafka.Producer({"test.mock.num.brokers": 1, "debug": "mock", "logger": log})

    def announced():
        producer.poll(0.1)
        return next((m.group(1) for m in map(re.compile(r"bootstrap\.servers=(\S+)").search, lines) if m), None)
    bootstrap = wait_for(announced, "the mock cluster's address", timeout=30, every=0)
    yield bootstrap, producer
    producer.flush(10)


@pytest.fixture()
def python_clients(monkeypatch):
    """kafka-python against the mock broker: its ApiVersions request pinned to a version the mock
    answers (it answers kafka-python's newest with a reply kafka-python cannot decode)."""
    from sketchrec.stream.fleet import replicas   # imported first: it binds kafka_config at import
    from sketchrec.stream.kafka import consumer
    plain = consumer.kafka_config

    def pinned(bootstrap: str) -> dict:
        return {**plain(bootstrap), "api_version": (2, 3)}
    monkeypatch.setattr(consumer, "kafka_config", pinned)
    monkeypatch.setattr(replicas, "kafka_config", pinned)


def _trimmed_topic(mock_broker) -> tuple[str, int, int]:
    """A model topic of DELTAS deltas of one member, the oldest deleted: (topic, start, end)."""
    bootstrap, producer = mock_broker
    topic = f"kept-{uuid.uuid4().hex[:6]}.model"
    for n in range(DELTAS):
        meta = encode_meta("m1", n, {0: (10 * n, 10 * n + 10)}, ErrorStats(), {})
        producer.produce(topic, value=bytes([n]) * DELTA_BYTES, key=b"m1", partition=0, headers=[(HEADER, meta)])
        producer.flush(30)
    reader = NativeReader(bootstrap, topic, 0, MAX_MESSAGE_BYTES)
    try:
        start, end = reader.consumer.get_watermark_offsets(reader.tp, timeout=30, cached=False)
    finally:
        reader.close()
    assert 0 < start < end == DELTAS, "the mock broker kept every delta: no position to lose"
    return topic, start, end


def _poll_until_raised(poll, error):
    """What ``poll`` raised (an ``error``), failing if it ever returns a record or never raises."""
    deadline = time.monotonic() + READ_S
    while time.monotonic() < deadline:
        try:
            got = poll()
        except error as exc:
            return exc
        assert not got, f"read {got!r} from a position the topic no longer holds"
    pytest.fail(f"no {error.__name__} in {READ_S:g} s: the reader went on from the topic's end")


@pytest.mark.parametrize("reader", [NativeReader, PythonReader])
def test_a_reader_refuses_a_position_retention_deleted(mock_broker, python_clients, reader):
    topic, start, end = _trimmed_topic(mock_broker)
    reader = reader(mock_broker[0], topic, 0, MAX_MESSAGE_BYTES)
    try:
        _poll_until_raised(lambda: reader.poll(200), OutOfRange)
        reader.seek(start)   # a position the log holds is read as ever
        got, deadline = [], time.monotonic() + READ_S
        while len(got) < end - start and time.monotonic() < deadline:
            got += [r.offset for r in reader.poll(200)]
        assert got == list(range(start, end))
    finally:
        reader.close()


@pytest.mark.parametrize("native", [True, False])
def test_a_feed_names_the_deleted_offset_and_applies_nothing(mock_broker, python_clients, native):
    topic, start, _ = _trimmed_topic(mock_broker)
    applied, state = [], FleetState(member="m2", position=1)
    feed = ModelFeed(mock_broker[0], topic, state, applied.append, native=native)
    try:
        lost = _poll_until_raised(lambda: feed.poll(200), Truncated)
        assert (lost.topic, lost.position, lost.start) == (topic, 1, start)
        assert f"{topic} no longer holds offset 1 (its log starts at {start}: retention" in str(lost)
        assert applied == [] and state.position == 1 and state.covered == {}
        with pytest.raises(Truncated):   # and again: never read past
            feed.catch_up(timeout=READ_S)
    finally:
        feed.close()


def test_a_replica_opens_only_from_a_snapshot_the_log_follows(mock_broker, python_clients):
    from sketchrec.stream.fleet.replicas import NoExactReplica, _check_log_holds
    topic, start, end = _trimmed_topic(mock_broker)

    def snapshot(position):   # a snapshot's meta
        return {"fleet": {"position": position}}
    _check_log_holds(mock_broker[0], topic, snapshot(start))
    _check_log_holds(mock_broker[0], topic, snapshot(end))   # nothing after it yet
    # past the end: the topic was made again since the snapshot (a rebuild from it would read
    # nothing, be handed Truncated at its first poll, and rebuild again, forever)
    with pytest.raises(NoExactReplica, match=f"ends at offset {end}, before the newest snapshot's "
                                             f"position {end + 5}"):
        _check_log_holds(mock_broker[0], topic, snapshot(end + 5))
    with pytest.raises(NoExactReplica, match=f"starts at offset {start}, after the newest snapshot's "
                                             f"position {start - 1}: retention deleted"):
        _check_log_holds(mock_broker[0], topic, snapshot(start - 1))
    with pytest.raises(NoExactReplica, match=r"after offset 0 \(no snapshot\)"):
        _check_log_holds(mock_broker[0], topic, None)


def test_a_serve_replica_rebuilds_itself_in_place_and_is_healthy_again(kafka_bootstrap):
    """On Tansu: what a read-only replica does with ``Truncated`` (the rebuild from the newest
    snapshot, a feed of the new state, /health clear again), the loss itself handed to it."""
    from sketchrec.models import SketchMF
    from sketchrec.stream.fleet.replicas import FleetReplica, open_replica
    from sketchrec.stream.recommender import Recommender
    topic = f"rebuilt-{uuid.uuid4().hex[:6]}.model"
    open_replica(kafka_bootstrap, topic, lambda: Recommender(SketchMF(capacity=64, seed=0), pair_capacity=256),
                 member="m1")   # the first member: writes the first snapshot
    service = open_replica(kafka_bootstrap, topic)
    replica = FleetReplica(service, kafka_bootstrap, topic)
    old_feed, old_model = replica.feed, service.recommender
    try:
        replica._rebuild(Truncated(topic, 0, 0))
        assert service.health.problems() == [] and service.recommender is not old_model
        assert replica.feed is not old_feed and replica.feed.state is service.fleet
    finally:
        replica.feed.close()


def test_a_serve_replica_rebuilt_in_place_keeps_its_serving_options(kafka_bootstrap):
    """`serve --max-items N` holds a rebuilt replica's catalogue as it held the first one's (the
    broken variant, a replica made without the options' bound, serves the snapshot's whole catalogue)."""
    from sketchrec.cli.config import ServingSettings
    from sketchrec.models import SketchMF
    from sketchrec.stream.fleet.replicas import FleetReplica, open_replica
    from sketchrec.stream.recommender import Recommender

    def first():   # the first member's state: 20 items learned
        rec = Recommender(SketchMF(capacity=64, seed=0), pair_capacity=256)
        rec.learn_many(list(range(20)), list(range(100, 120)), [4.0] * 20)
        return rec
    topic = f"bounded-{uuid.uuid4().hex[:6]}.model"
    open_replica(kafka_bootstrap, topic, first, member="m1")
    serving = ServingSettings(max_items=4)
    held = {}
    for bound in (serving.bound, None):
        service = serving.bound(open_replica(kafka_bootstrap, topic))   # as `serve` opens it
        replica = FleetReplica(service, kafka_bootstrap, topic, bound=bound)
        try:
            replica._rebuild(Truncated(topic, 0, 0))
        finally:
            replica.feed.close()
        held[bound is None] = (service.recommender.catalogue.max_items, len(service.recommender.catalogue))
    assert held[False][0] == 4 and 0 < held[False][1] <= 4 and held[True][1] == 20, held


def test_a_replica_refused_by_the_log_never_reads_the_snapshot(kafka_bootstrap, monkeypatch):
    """A replica that cannot be made exact learns so from the newest snapshot's manifest: the
    snapshot itself (the whole model) is not read, so a serve replica retrying its rebuild does not
    read it again every time. The snapshot is read once the log holds what follows it."""
    from sketchrec.models import SketchMF
    from sketchrec.stream.fleet import replicas, snapshots
    from sketchrec.stream.recommender import Recommender
    topic = f"refused-{uuid.uuid4().hex[:6]}.model"
    replicas.open_replica(kafka_bootstrap, topic, lambda: Recommender(SketchMF(capacity=64, seed=0), pair_capacity=256),
                          member="m1")   # the first member: writes the first snapshot
    loaded, load = [], snapshots._load
    monkeypatch.setattr(snapshots, "_load", lambda *a: loaded.append(a[2]) or load(*a))
    holds = replicas._check_log_holds

    def gone(bootstrap, model_topic, meta):   # as if retention had deleted the deltas after it
        raise replicas.NoExactReplica(f"{model_topic} starts after the newest snapshot's position")
    monkeypatch.setattr(replicas, "_check_log_holds", gone)
    with pytest.raises(replicas.NoExactReplica):
        replicas.open_replica(kafka_bootstrap, topic)
    assert loaded == []
    monkeypatch.setattr(replicas, "_check_log_holds", holds)
    assert replicas.open_replica(kafka_bootstrap, topic).fleet.position == 0 and len(loaded) == 1
