"""Production under faults, runtime half: poison messages, checkpoint faults, commit failures, pause and stop,
the producer across an outage. Each test failed before its fix (the docstring says how)."""

import errno
import json
import logging
import re
import struct
import threading
import time
import types
import uuid

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sketchrec.models import SketchMF
from sketchrec.stream.checkpoint import CheckpointStore, LedgerIntegrityError
from sketchrec.stream.kafka import producer as producer_module
from sketchrec.stream.kafka.consumer import KafkaLearner, resume_or_create
from sketchrec.stream.kafka.messages import encode_batch, parse_message
from sketchrec.stream.kafka.offsets import OffsetBook
from sketchrec.stream.kafka.producer import DeliveryError, ensure_topic, produce
from sketchrec.stream.health import Health
from sketchrec.stream.sink import LocalCheckpoints
from sketchrec.data import Ratings

NESTED = b"[" * 1000 + b"]" * 1000
BIG_ID = json.dumps({"user": 2 ** 64, "item": 3, "rating": 4}).encode()


# --- 1. poison messages ------------------------------------------------------------------------
def test_poison_messages_are_rejections_with_a_reason():
    """Before: RecursionError / OverflowError escaped and killed `consume` on every restart."""
    assert parse_message(NESTED).rejected[0][1] == "JSON nested too deep"
    assert parse_message(b'{"a": ' * 1200 + b"1" + b"}" * 1200).rejected[0][1] == "JSON nested too deep"
    big = parse_message(BIG_ID)
    assert big.ratings == [(str(2 ** 64), 3, 4.0, 0)] and not big.rejected


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.binary(max_size=300),
                 st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                              lambda kids: st.lists(kids, max_size=4)
                              | st.dictionaries(st.sampled_from(["user", "item", "rating", "timestamp", "x"]),
                                                kids, max_size=5),
                              max_leaves=20).map(lambda doc: json.dumps(doc).encode())))
def test_parse_message_never_raises(value):
    parsed = parse_message(value, (0.5, 5.0))
    for user, item, rating, stamp in parsed.ratings:
        assert 0.5 <= rating <= 5.0 and isinstance(stamp, int)
        assert str(user).strip() and str(item).strip()
    assert all(isinstance(reason, str) and reason for _, reason, _ in parsed.rejected)


@pytest.fixture(scope="module")
def bare_learner(tmp_path_factory):
    """A KafkaLearner's message handling without a broker (a fake dead-letter producer)."""
    from collections import Counter
    learner = KafkaLearner.__new__(KafkaLearner)
    learner.service = _service(tmp_path_factory.mktemp("bare"))
    learner.rating_range, learner.dead_topic, learner.stop = (0.5, 5.0), "t.dead", threading.Event()
    learner.producer = types.SimpleNamespace(sent=[], send=lambda topic, value: learner.producer.sent.append(value))
    learner.book = OffsetBook(learner.service.offsets)
    learner.dead_letters = Counter()
    return learner


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.binary(max_size=200) | st.sampled_from([NESTED, BIG_ID, b"1,2,3", None]),
                          st.lists(st.tuples(st.text(max_size=20), st.binary(max_size=40)), max_size=2)),
                min_size=1, max_size=6))
def test_the_consumer_never_dies_on_a_message(bare_learner, batch):
    from kafka import TopicPartition
    tp = TopicPartition("t", 0)
    start = bare_learner.book.position(0) or 0
    msgs = [types.SimpleNamespace(value=v, headers=h, offset=start + n) for n, (v, h) in enumerate(batch)]
    bare_learner.learn_poll({tp: msgs})
    assert bare_learner.book.position(0) == start + len(batch)  # every message handled


def test_an_unforeseen_parse_error_is_one_rejected_message(monkeypatch):
    from sketchrec.stream.kafka import messages

    def boom(value, rating_range):
        raise ZeroDivisionError("never seen before")
    monkeypatch.setattr(messages, "_parse", boom)
    assert messages.parse_message(b"1,2,3").rejected[0][1] == "unparseable message (ZeroDivisionError)"


def test_a_csv_id_with_a_line_break_cannot_smuggle_a_second_rating():
    """Before: encode_batch wrote the id raw, so its second line was a rating of user 666."""
    parsed = parse_message(encode_batch([("eve\n666,1,5", 7, 4.0, 0), ("a,b", 8, 3.0, 1)]))
    assert parsed.ratings == [("eve\n666,1,5", 7, 4.0, 0), ("a,b", 8, 3.0, 1)]
    assert encode_batch([(1, 2, 4.0, 5)]) == b"1,2,4,5"   # the usual form is unchanged


def _service(directory):
    return resume_or_create(directory, lambda: SketchMF(capacity=500, dim=8), pair_capacity=20_000)


def _send(bootstrap, topic, values, partitions=2):
    from kafka import KafkaProducer
    ensure_topic(bootstrap, topic, partitions)
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    for n, value in enumerate(values):
        producer.send(topic, key=str(n % 5).encode(), value=value)
    producer.flush()
    producer.close()


def _valid(n, start=0):
    return [f"{u % 40},{u % 30},{1 + u % 5},{u}".encode() for u in range(start, start + n)]


def test_consumer_learns_the_valid_messages_around_poison_pills(kafka_bootstrap, tmp_path, caplog):
    """Before: 0 of 200 learned, the consumer died with RecursionError (then OverflowError)."""
    topic = f"poison-{uuid.uuid4().hex[:8]}"
    values = _valid(100) + [NESTED, BIG_ID, b"\xff" * 10] + _valid(100, 100)
    _send(kafka_bootstrap, topic, values)
    service = _service(tmp_path)
    with caplog.at_level(logging.INFO, logger="sketchrec"):
        learner = KafkaLearner(service, kafka_bootstrap, topic, checkpoint_every=10_000)
        learner.run(idle_exit=2)
    assert service.ratings_learned == 201  # 200 valid + the wide id, kept as text
    assert dict(service.skipped) == {"JSON nested too deep": 1, "not UTF-8": 1}
    assert learner.last_checkpoint_ok and service.health.broker()["connected"] is True
    events = [r.getMessage() for r in caplog.records if r.getMessage().startswith("event=")]
    assert any(e.startswith("event=checkpoint ") and "why=shutdown" in e for e in events)
    assert any(e.startswith("event=dead_letters total=2") for e in events)
    assert any(e.startswith("event=connect ") for e in events)


# --- 4. commit failures ------------------------------------------------------------------------
def test_commit_failures_never_kill_the_consumer_and_state_stays_exactly_once(kafka_bootstrap, tmp_path):
    """Before: CommitFailedError propagated out of run() (rc 1, endpoint gone)."""
    from kafka.errors import CommitFailedError
    topic = f"commit-{uuid.uuid4().hex[:8]}"
    _send(kafka_bootstrap, topic, _valid(3000))
    group = f"g-{topic}"
    service = _service(tmp_path)
    learner = KafkaLearner(service, kafka_bootstrap, topic, group, checkpoint_every=500,
                           max_poll_records=400)
    failures = []

    def fail(*args, **kwargs):
        failures.append(1)
        raise CommitFailedError("the group rebalanced (forced by the test)")
    learner.consumer.commit = fail
    learner.consumer.commit_async = fail
    learner.run(idle_exit=2)
    assert len(failures) >= 3 and service.ratings_learned == 3000
    # no offset was ever committed: a restart still continues from the checkpoint, exactly once
    _send(kafka_bootstrap, topic, _valid(1000, 3000))
    again = _service(tmp_path)
    KafkaLearner(again, kafka_bootstrap, topic, group).run(idle_exit=2)
    assert again.ratings_learned == 4000 and sum(again.offsets.values()) == 4000


# --- 7. pause and stop -------------------------------------------------------------------------
def test_a_paused_consumer_obeys_stop(kafka_bootstrap, tmp_path):
    """Before: learn_many waited on the pause forever; SIGTERM (which sets ``stop``) did nothing."""
    topic = f"pause-{uuid.uuid4().hex[:8]}"
    _send(kafka_bootstrap, topic, _valid(300))
    service = _service(tmp_path)
    learner = KafkaLearner(service, kafka_bootstrap, topic)
    service.pause()
    thread = threading.Thread(target=learner.run, daemon=True)
    thread.start()
    time.sleep(3)
    assert service.ratings_learned == 0
    learner.stop.set()
    thread.join(timeout=15)
    assert not thread.is_alive() and learner.last_checkpoint_ok
    assert CheckpointStore(tmp_path).latest() is not None


# --- 2, 3, 8. checkpoints ------------------------------------------------------------------------
def _rewrite_header(path, edit):
    blob = path.read_bytes()
    (hlen,) = struct.unpack("<I", blob[4:8])
    header = json.loads(blob[8:8 + hlen])
    edit(header)
    raw = json.dumps(header).encode()
    path.write_bytes(blob[:4] + struct.pack("<I", len(raw)) + raw + blob[8 + hlen:])


def test_a_renamed_header_key_falls_back_with_a_warning(tmp_path, caplog):
    """Before: KeyError: 'meta' at start-up, although an older valid checkpoint existed."""
    store = CheckpointStore(tmp_path)
    for n in (1, 2):
        store.save({"p": b"x" * n}, {"n": n, "offsets": {"0": 100 * n}})
    newest = sorted(tmp_path.glob("ckpt-*.skc"))[-1]
    _rewrite_header(newest, lambda h: h.update(metadata=h.pop("meta")))
    with caplog.at_level(logging.WARNING):
        assert store.latest().meta["n"] == 1
    assert "key is missing or renamed" in caplog.text
    # one changed digit in the stored offsets: refused by the checksum, not learned from
    store.save({"p": b"z"}, {"n": 3, "offsets": {"0": 300}})
    newest = sorted(tmp_path.glob("ckpt-*.skc"))[-1]
    _rewrite_header(newest, lambda h: h["meta"]["offsets"].update({"0": 301}))
    assert store.latest().meta["n"] == 1


def test_a_service_checkpoint_without_a_ledger_falls_back(tmp_path):
    """Before: every service checkpoint names the key ("privacy_ledger": null), so a corrupt
    newest one refused start-up as if a ledger were at stake."""
    service = _service(tmp_path)
    service.checkpoint()
    service.checkpoint()
    newest = sorted(tmp_path.glob("ckpt-*.skc"))[-1]
    newest.write_bytes(newest.read_bytes()[:-7])
    assert CheckpointStore(tmp_path).latest().seq == 1


def test_a_ledger_directory_with_a_renamed_key_still_refuses(tmp_path):
    store = CheckpointStore(tmp_path)
    ledger = {"unit": "rating", "delta": 1e-5, "steps": [{"noise_multiplier": 1.0, "sampling_rate": 0.1,
                                                          "count": 1}]}
    for _ in range(2):
        store.save({"p": b"x"}, {"privacy_ledger": ledger})
    _rewrite_header(sorted(tmp_path.glob("ckpt-*.skc"))[-1], lambda h: h.update(metadata=h.pop("meta")))
    with pytest.raises(LedgerIntegrityError):
        CheckpointStore(tmp_path).latest()


def _consume_config(tmp_path, *extra):
    from sketchrec.cli.consume import ConsumeConfig, build_parser
    ap = build_parser()
    return ConsumeConfig.from_args(ap.parse_args(["--bootstrap", "127.0.0.1:1", "--topic", "t",
                                                  "--group", "g", "--capacity", "500",
                                                  "--expected-ratings", "10000", *extra]), ap)


def test_all_checkpoints_corrupt_is_refused_unless_reset(tmp_path):
    """Before: an empty model from the group's offsets, exit 0, and an empty checkpoint that won."""
    from sketchrec.cli.consume import start
    service = _service(tmp_path)
    service.recommender.learn_many(np.arange(50), np.arange(50), np.full(50, 3.0))
    service.checkpoint()
    service.checkpoint()
    for path in tmp_path.glob("ckpt-*.skc"):
        path.write_bytes(path.read_bytes()[:-7])
    error, _ = start(_consume_config(tmp_path, "--checkpoint", str(tmp_path)))
    assert isinstance(error, str) and "none of the 2 checkpoints" in error and "\n" not in error
    assert len(list(tmp_path.glob("ckpt-*.skc"))) == 2  # untouched
    service, reset = start(_consume_config(tmp_path, "--checkpoint", str(tmp_path), "--reset-checkpoints"))
    assert reset is True and service.ratings_learned == 0
    assert len(list(tmp_path.glob("*.skc.corrupt"))) == 2 and not list(tmp_path.glob("ckpt-*.skc"))


def test_an_unwritable_checkpoint_directory_is_found_at_start_up(tmp_path):
    """Before: found only at the first checkpoint, with a chained traceback."""
    from sketchrec.cli.consume import start
    (tmp_path / "file").write_text("not a directory")
    error, _ = start(_consume_config(tmp_path, "--checkpoint", str(tmp_path / "file" / "ckpt")))
    assert isinstance(error, str) and error.startswith("checkpoint directory") and "not writable" in error


def test_a_full_disk_leaves_no_temp_file_and_the_old_checkpoint(tmp_path, monkeypatch):
    """Before: the partial ckpt-*.tmp stayed behind."""
    from sketchrec.stream import checkpoint
    store = CheckpointStore(tmp_path)
    store.save({"p": b"old"}, {"n": 1})

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(checkpoint.os, "fsync", full)
    with pytest.raises(OSError):
        store.save({"p": b"new" * 1000}, {"n": 2})
    monkeypatch.undo()
    assert not list(tmp_path.glob("*.tmp")) and store.latest().meta["n"] == 1


def test_a_failed_checkpoint_keeps_the_consumer_up_and_retries_later(tmp_path, caplog):
    """Before: the OSError ended the consume loop (and the endpoint)."""
    service = _service(tmp_path)
    learner = KafkaLearner.__new__(KafkaLearner)
    learner.service, learner.group, learner.health = service, None, service.health
    learner.sink = LocalCheckpoints(service)
    learner.producer = types.SimpleNamespace(flush=lambda timeout: None)
    learner.book = OffsetBook(service.offsets, every=10, seconds=60)
    learner.dead_letters = __import__("collections").Counter()
    learner.book.store({0: 20}, handled=20)

    def full():
        raise OSError(errno.ENOSPC, "No space left on device")
    service.checkpoint = full
    with caplog.at_level(logging.INFO, logger="sketchrec"):
        assert learner.checkpoint("interval") is False
    assert "event=checkpoint_failed" in caplog.text and "No space left" in service.health.checkpoint_error
    assert not learner.book.expired()  # not retried in a tight loop: at the next cadence
    del service.checkpoint
    assert learner.checkpoint("interval") is True and service.health.checkpoint_error is None


# --- 6. producer across an outage ----------------------------------------------------------------
class _FakeProducer:
    """librdkafka's producer as ``produce`` uses it: acknowledges the first ``acked`` messages;
    the broker 'stays down' for the rest (flush returns with them still queued)."""
    acked = 10 ** 9

    def __init__(self, config):
        self.sent, self.reports = 0, []

    def produce(self, topic, value=None, key=None, headers=None, on_delivery=None):
        self.sent += 1
        if self.sent <= self.acked:
            self.reports.append(on_delivery)

    def poll(self, timeout=None):
        for report in self.reports:
            report(None, None)
        self.reports.clear()

    def flush(self, timeout=None):
        self.poll()
        return max(0, self.sent - self.acked)

    def purge(self):
        pass


def _ratings(n):
    return Ratings(np.arange(n) % 7, np.arange(n) % 5, np.full(n, 3.0), np.arange(n))


def test_rate_limiting_never_sleeps_a_negative_time(monkeypatch):
    """Before: two perf_counter() readings; a stall between them gave
    ValueError: sleep length must be non-negative."""
    import confluent_kafka
    clock = iter(np.arange(0, 1e3, 0.00075))
    monkeypatch.setattr(producer_module, "time", types.SimpleNamespace(
        perf_counter=lambda: float(next(clock)), sleep=time.sleep, process_time=time.process_time,
        monotonic=time.monotonic))
    monkeypatch.setattr(producer_module, "ensure_topic", lambda *a: False)
    monkeypatch.setattr(confluent_kafka, "Producer", _FakeProducer)
    assert produce(_ratings(40), "x:1", "t", rate=1000.0)["ratings"] == 40


def test_an_outage_longer_than_the_timeout_names_what_was_delivered(monkeypatch):
    import confluent_kafka
    monkeypatch.setattr(producer_module, "ensure_topic", lambda *a: False)
    monkeypatch.setattr(confluent_kafka, "Producer", type("Down", (_FakeProducer,), {"acked": 30}))
    with pytest.raises(DeliveryError, match="30 of 100 ratings delivered"):
        produce(_ratings(100), "x:1", "t", timeout=0.1)


def test_health_reports_a_lost_broker_after_the_threshold():
    health = Health(broker_lost_after=20)
    health.watch_broker()
    health.polled(connected=False)
    assert health.problems() == [] and health.broker()["connected"] is False
    health.lost_since -= 25   # (the seconds shown: 25, or more if this test was paused)
    assert re.match(r"broker unreachable for 2\d s", health.problems()[0])
    health.polled(connected=True)
    assert health.problems() == [] and health.broker()["unreachable_for_s"] is None
