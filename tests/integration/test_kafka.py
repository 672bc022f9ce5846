"""Integration tests against a real Kafka-protocol broker: crash recovery and dead letters."""

import json
import logging
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from collections import Counter

import httpx
import numpy as np

from sketchrec.stream.checkpoint import CheckpointStore
from sketchrec.stream.kafka.producer import ensure_topic, order_for_topic, produce
from sketchrec.stream.kafka.messages import parse_message
from sketchrec.data import SyntheticStream, read_ratings
from conftest import free_port, http, served_port


def consume_cmd(bootstrap, topic, ckpt, *extra):
    return [sys.executable, "-m", "sketchrec", "consume", "--bootstrap", bootstrap, "--topic", topic,
            "--checkpoint", str(ckpt), "--capacity", "3000", "--expected-ratings", "200000",
            "--exit-when-idle", "3", *extra]


def run_to_end(cmd, timeout: float = 300, log: Path | None = None) -> dict:
    """Run ``cmd`` to its end: its summary (the last line it printed). Its log goes to ``log`` when
    given (kept when it overruns ``timeout``), else it is read from a pipe."""
    if log is None:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        assert out.returncode == 0, out.stderr[-3000:]
        return json.loads(out.stdout.strip().splitlines()[-1])
    with log.open("w") as err:
        out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=err, text=True, timeout=timeout)
    assert out.returncode == 0, log.read_text()[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def read_whole_topic(bootstrap: str, topic: str) -> list[bytes]:
    """Every message value on ``topic`` (all partitions), read up to the end offsets it has now:
    no idle timeout to wait out, and nothing past what was there is missed or added."""
    from kafka import KafkaConsumer, TopicPartition
    reader = KafkaConsumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest", enable_auto_commit=False)
    try:
        tps = [TopicPartition(topic, p) for p in reader.partitions_for_topic(topic) or ()]
        reader.assign(tps)
        reader.seek_to_beginning(*tps)
        ends, values = reader.end_offsets(tps), []
        deadline = time.monotonic() + 60
        while any(reader.position(tp) < ends[tp] for tp in tps):
            assert time.monotonic() < deadline, f"{topic} not read to its end offsets {ends}"
            values += [m.value for batch in reader.poll(timeout_ms=200).values() for m in batch]
        return values
    finally:
        reader.close()


def test_message_forms_and_reasons():
    assert parse_message(b"1,2,4.5,99").ratings == [(1, 2, 4.5, 99)]
    assert parse_message(b'{"user": "a", "item": 7, "rating": 3}').ratings == [("a", 7, 3.0, 0)]
    batched = parse_message(b"1,2,4,1\n1,3,x,2\n1,4,5,3", rating_range=(1, 5))
    assert [r[1] for r in batched.ratings] == [2, 4] and batched.rejected[0][:2] == (1, "non-numeric rating")
    arr = parse_message(b'[{"user": 1, "item": 2, "rating": 9}, {"user": 1, "item": 3, "rating": 2}]', (1, 5))
    assert len(arr.ratings) == 1 and arr.rejected[0][1] == "rating out of range"
    for raw, reason in [(b"\xff\xfe", "not UTF-8"), (b"{oops", "bad JSON"), (b"1,2", "missing fields"),
                        (b"1,2,nan,3", "non-finite rating"), (b'{"user": 1, "rating": 2}', "missing fields"),
                        (b"", "empty message"), (b"1,2,3,tomorrow", "bad timestamp"),
                        (("x" * 300 + ",2,3,4").encode(), "oversized id")]:
        assert parse_message(raw).rejected[0][1] == reason, raw


KILL_N = 100_000   # one rating per message; a poll may learn ~20,000 at once, so three kills land mid-stream


def test_kill_9_three_times_learns_every_rating_exactly_once(kafka_bootstrap, tmp_path, ml100k):
    topic = f"ml100k-{uuid.uuid4().hex[:8]}"
    data, _ = read_ratings(ml100k)   # the first ratings of MovieLens in time order
    sent = produce(order_for_topic(data).take(slice(0, KILL_N)), kafka_bootstrap, topic, batch=1)
    assert sent["ratings"] == KILL_N

    # the uninterrupted run goes on beside the crashing ones (which wait on group joins too)
    with open(tmp_path / "uninterrupted.out", "w") as out, open(tmp_path / "uninterrupted.err", "w") as err:
        uninterrupted = subprocess.Popen(consume_cmd(kafka_bootstrap, topic, tmp_path / "uninterrupted"),
                                         stdout=out, stderr=err)
    try:
        final = crash_three_times_then_finish(kafka_bootstrap, topic, tmp_path / "crashing")
        uninterrupted.wait(timeout=300)
    finally:
        if uninterrupted.poll() is None:
            uninterrupted.kill()
    assert uninterrupted.returncode == 0, (tmp_path / "uninterrupted.err").read_text()[-3000:]
    reference = json.loads((tmp_path / "uninterrupted.out").read_text().strip().splitlines()[-1])
    assert reference["ratings_learned"] == KILL_N
    assert abs(final["prequential_rmse"] - reference["prequential_rmse"]) < 0.01


def crash_three_times_then_finish(kafka_bootstrap: str, topic: str, ckpt) -> dict:
    """SIGKILL a grouped consumer of ``topic`` three times mid-stream, then let one run to the end:
    every rating learned exactly once. Returns the last run's summary."""
    # kills from 10 % to 60 % of the stream: a consumer learning between two reads of its /stats
    # (several polls of up to 20,000 when an answer is slow on a loaded machine) still stops short
    # of the end, so each kill lands mid-stream
    kills = sorted(np.random.default_rng(7).uniform(0.1 * KILL_N, 0.6 * KILL_N, 3).astype(int))
    killed_at = []
    for threshold in kills:
        # its log goes to a file: a pipe nobody reads while it runs would fill and block the consumer
        log = Path(str(ckpt) + f"-{threshold}.err")
        with log.open("w") as err:
            proc = subprocess.Popen(consume_cmd(kafka_bootstrap, topic, ckpt, "--group", f"g-{topic}",
                                                "--checkpoint-every", "1500", "--serve", "127.0.0.1:0",
                                                "--workers", "1"),  # /stats from the learner: no readers
                                    stdout=subprocess.DEVNULL, stderr=err, text=True)
        try:
            port = served_port(log, proc)   # the port it bound and announced
            # killed once it learned past the threshold AND past where it resumed (its first answer
            # counts the checkpoint's ratings): a run resumed beyond its threshold would otherwise
            # be killed at once, while it joined the group, and no kill would land mid-learning
            learned, resumed = 0, None
            deadline = time.monotonic() + 300
            while resumed is None or learned < max(threshold, resumed + 2_000):
                assert proc.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < deadline, "consumer made no progress: " + log.read_text()[-3000:]
                try:
                    learned = http.get(f"http://127.0.0.1:{port}/stats", timeout=2).json()["ratings_learned"]
                    resumed = learned if resumed is None else resumed
                except httpx.TransportError:
                    pass
                time.sleep(0.02)   # ~50 polls a second: each one is a request the consumer answers
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            killed_at.append((resumed, learned))
        finally:
            if proc.poll() is None:
                proc.kill()
    assert all(resumed < n < KILL_N for resumed, n in killed_at), killed_at  # each one mid-stream, mid-learning
    # the last crash left part of the stream to the runs below, which resume from its checkpoint
    # (not "at most what /stats said before the kill": the consumer may learn, and write a
    # checkpoint every 1,500, between that answer and the signal)
    assert CheckpointStore(ckpt).latest().meta["ratings_learned"] < KILL_N

    # a finishing run exits once idle with its settled share of the topic read to its end: a
    # killed member holds its partitions until the group evicts it, and the finishing run waits for
    # that, so it learns the whole rest. A finishing run that has not exited after 150 s is killed
    # (one more crash, which the claim covers) and the next one resumes. Each run's log is kept.
    final, logs, deadline = None, [], time.monotonic() + 480
    while final is None and time.monotonic() < deadline:
        logs.append(Path(str(ckpt) + f"-finish-{len(logs)}.err"))
        try:
            final = run_to_end(consume_cmd(kafka_bootstrap, topic, ckpt, "--group", f"g-{topic}"), timeout=150,
                               log=logs[-1])
        except subprocess.TimeoutExpired:
            continue
    assert final is not None and final["ratings_learned"] == KILL_N, \
        "\n".join(f"{p.name}: {p.read_text()[-2000:]}" for p in logs)
    assert final["skipped"] == {}
    assert sum(final["offsets"].values()) == KILL_N
    return final


def _malformed_stream(n_valid: int, seed: int = 3):
    """Valid single, JSON and batched messages with 1,000 malformed ones of every kind mixed in."""
    rng = np.random.default_rng(seed)
    data = SyntheticStream(n_ratings=n_valid, n_users=400, n_items=300, seed=seed).all()
    rows = list(zip(data.users.tolist(), data.items.tolist(), data.ratings.tolist(), data.timestamps.tolist()))
    messages, n = [], 0
    while n < len(rows):
        form = rng.integers(3)
        if form == 0:
            u, i, r, t = rows[n]
            messages.append(f"{u},{i},{r},{t}".encode())
            n += 1
        elif form == 1:
            u, i, r, t = rows[n]
            messages.append(json.dumps({"user": u, "item": i, "rating": r, "timestamp": t}).encode())
            n += 1
        else:
            chunk = rows[n:n + 10]
            messages.append("\n".join(f"{u},{i},{r},{t}" for u, i, r, t in chunk).encode())
            n += len(chunk)
    bad_kinds = {
        "not UTF-8": b"\xff\xfe\xfa",
        "missing fields": b"12,7",
        "non-numeric rating": b"12,7,five,100",
        "non-finite rating": b"12,7,nan,100",
        "rating out of range": b"12,7,9.5,100",
        "oversized id": ("u" * 400 + ",7,4,100").encode(),
        "empty id": b",7,4,100",
        "bad JSON": b'{"user": 12, "item"',
        "bad timestamp": b"12,7,4,next-week",
        "empty message": b"   ",
    }
    bad = [(reason, raw) for reason, raw in bad_kinds.items() for _ in range(100)]
    positions = sorted(rng.choice(len(messages) + len(bad), len(bad), replace=False))
    mixed, b, m = [], 0, 0
    for pos in range(len(messages) + len(bad)):
        if b < len(bad) and pos == positions[b]:
            mixed.append(bad[b][1])
            b += 1
        else:
            mixed.append(messages[m])
            m += 1
    return mixed, Counter(reason for reason, _ in bad), len(rows)


def test_malformed_messages_are_counted_dead_lettered_and_the_rest_learned(kafka_bootstrap, tmp_path):
    from kafka import KafkaProducer
    topic = f"mixed-{uuid.uuid4().hex[:8]}"
    messages, expected, n_valid = _malformed_stream(20_000)
    ensure_topic(kafka_bootstrap, topic, partitions=2)
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, linger_ms=20)
    for n, value in enumerate(messages):
        producer.send(topic, key=str(n % 17).encode(), value=value)
    producer.flush()
    producer.close()

    result = run_to_end(consume_cmd(kafka_bootstrap, topic, tmp_path, "--group", f"g-{topic}",
                                    "--rating-range", "1,5"))
    assert result["ratings_learned"] == n_valid
    assert result["skipped"] == dict(expected)

    letters = [json.loads(value) for value in read_whole_topic(kafka_bootstrap, f"{topic}.dead")]
    assert len(letters) == 1000
    assert Counter(x["reason"] for x in letters) == expected
    assert all(x["topic"] == topic and x["offset"] >= 0 for x in letters)
    oversized = next(x for x in letters if x["reason"] == "oversized id")
    assert bytes.fromhex(oversized["value_hex"]).startswith(b"uuuu")


def test_dead_broker_is_a_clear_error_and_touches_nothing(tmp_path, monkeypatch, capsys):
    # in-process, so the client can be told to give up bootstrapping after 2 s instead of its 30 s
    # (the wait is kafka-python's; the clear error and the untouched checkpoint are ours)
    from sketchrec.cli import sketchrec_main
    from sketchrec.stream.kafka import consumer
    config = consumer.kafka_config
    monkeypatch.setattr(consumer, "kafka_config", lambda b: {**config(b), "bootstrap_timeout_ms": 2000})
    log = logging.getLogger("sketchrec")  # consume adds a stderr handler: not beyond this test
    monkeypatch.setattr(log, "handlers", list(log.handlers))
    monkeypatch.setattr(log, "level", log.level)
    dead = f"127.0.0.1:{free_port()}"  # nothing listens there
    assert sketchrec_main(["consume", "--bootstrap", dead, "--topic", "t", "--checkpoint", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "cannot consume 't'" in err and "Traceback" not in err
    assert CheckpointStore(tmp_path).latest() is None


def test_a_held_produce_shows_nothing_to_our_consumers_until_it_commits(kafka_bootstrap):
    """produce(held_until=...) (what bench.fleet starts its members under): a read_committed
    reader sees none of the ratings while ``held_until`` runs, then every one of them."""
    from kafka import KafkaConsumer, TopicPartition
    topic = f"held-{uuid.uuid4().hex[:8]}"
    data = SyntheticStream(n_ratings=3_000, n_users=200, n_items=100, seed=4).all()
    reader = KafkaConsumer(bootstrap_servers=kafka_bootstrap, isolation_level="read_committed",
                           enable_auto_commit=False, auto_offset_reset="earliest")

    def read_for(seconds: float) -> int:
        if not reader.assignment():
            tps = [TopicPartition(topic, p) for p in reader.partitions_for_topic(topic)]
            reader.assign(tps)
            reader.seek_to_beginning(*tps)
        got, deadline = 0, time.monotonic() + seconds
        while time.monotonic() < deadline:
            got += sum(len(v) for v in reader.poll(timeout_ms=200).values())
        return got

    seen_while_held = []
    sent = produce(data, kafka_bootstrap, topic, batch=10, partitions=2,
                   held_until=lambda: seen_while_held.append(read_for(2.0)))
    try:
        assert seen_while_held == [0]
        assert read_for(3.0) == sent["messages"] > 0
    finally:
        reader.close()


def test_a_batch_failing_its_crc_is_set_aside_and_the_rest_learned(kafka_bootstrap, tmp_path, monkeypatch):
    """A record batch whose CRC does not hold (the bundled broker stores what it is sent) is
    counted, dead-lettered whole and stepped over; the ratings before and after it are learned.
    Before, every poll raised on it again and the consumer reported the broker lost, for ever."""
    import kafka.record.default_records as records
    from kafka import KafkaProducer
    topic = f"crc-{uuid.uuid4().hex[:8]}"
    ensure_topic(kafka_bootstrap, topic, partitions=1)
    # a long linger: each flush() sends its five messages as ONE record batch (with linger 0 the
    # first send could leave alone, and the damaged five became two dead letters: seen once)
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, linger_ms=60_000)
    real = records.calc_crc32c
    for n in range(3):   # three batches: good, with a wrong CRC, good
        if n == 1:
            monkeypatch.setattr(records, "calc_crc32c", lambda data: (real(data) + 1) & 0xFFFFFFFF)
        for k in range(5):
            producer.send(topic, f"{10 * n + k},{k},4".encode())
        producer.flush()
        monkeypatch.setattr(records, "calc_crc32c", real)
    producer.close()
    result = run_to_end(consume_cmd(kafka_bootstrap, topic, tmp_path, "--group", f"g-{topic}"))
    assert result["ratings_learned"] == 10
    assert result["skipped"] == {"batch failing its CRC check": 5}
    letters = [json.loads(value) for value in read_whole_topic(kafka_bootstrap, f"{topic}.dead")]
    assert [(x["reason"], x["offset"], x["last_offset"], x["messages"]) for x in letters] == \
        [("batch failing its CRC check", 5, 9, 5)]


LONE_SURROGATE = '{"user": "\\ud800", "item": 1, "rating": 3}'.encode()


def test_the_lone_surrogate_message_is_dead_lettered_and_learning_goes_on(kafka_bootstrap, tmp_path):
    """The fault probe's message: a JSON id that is a lone surrogate. Before, hashing it raised
    in the learner's batch and `consume` died on it, again on every restart; now it is set aside
    with its reason, and the ratings around it (and a restart) are learned."""
    topic = f"lone-{uuid.uuid4().hex[:8]}"
    ensure_topic(kafka_bootstrap, topic, partitions=1)
    from kafka import KafkaProducer
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap)
    for value in (b"1,2,4", LONE_SURROGATE, b'[{"user": "a\\ud800b", "item": 3, "rating": 4}, '
                  b'{"user": "b", "item": 3, "rating": 4}]', b"5,6,3"):
        producer.send(topic, value)
    producer.flush()
    first = run_to_end(consume_cmd(kafka_bootstrap, topic, tmp_path))
    assert first["ratings_learned"] == 3
    assert first["skipped"] == {"id not valid Unicode (lone surrogate)": 2}
    producer.send(topic, b"7,8,5")
    producer.flush()
    producer.close()
    again = run_to_end(consume_cmd(kafka_bootstrap, topic, tmp_path))   # a restart goes on
    assert again["ratings_learned"] == 4 and again["skipped"] == first["skipped"]
    letters = [json.loads(v) for v in read_whole_topic(kafka_bootstrap, f"{topic}.dead")]
    # the two poison messages (offsets as the broker gave them), the batch's first rating only
    assert sorted((x["index"], x["reason"]) for x in letters) == [(0, "id not valid Unicode (lone surrogate)")] * 2
    assert len({x["offset"] for x in letters}) == 2


def _recreate(bootstrap: str, topic: str, values: list[bytes]) -> None:
    """``topic`` deleted, created again (one partition) and given ``values``."""
    from kafka import KafkaAdminClient, KafkaProducer
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.delete_topics([topic])
    admin.close()
    deadline = time.monotonic() + 30
    while True:
        try:
            ensure_topic(bootstrap, topic, partitions=1)
            break
        except Exception:  # noqa: BLE001 - the deletion still under way
            assert time.monotonic() < deadline
            time.sleep(0.5)
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    for value in values:
        producer.send(topic, value)
    producer.flush()
    producer.close()


def test_a_recreated_topic_is_consumed_from_its_start_or_refused(kafka_bootstrap, tmp_path):
    """Before: the consumer sought the new topic to the old one's offsets and silently skipped
    its first messages (as many as the old topic had). Both signs are tried: a new topic id with
    more messages than the old offsets, and (its id not in the checkpoint) offsets beyond its end."""
    from kafka import KafkaProducer
    topic = f"again-{uuid.uuid4().hex[:8]}"
    ensure_topic(kafka_bootstrap, topic, partitions=1)
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap)
    for n in range(20):
        producer.send(topic, f"{n},1,4".encode())
    producer.close()
    assert run_to_end(consume_cmd(kafka_bootstrap, topic, tmp_path))["ratings_learned"] == 20
    _recreate(kafka_bootstrap, topic, [f"{n},2,3".encode() for n in range(30)])   # a new topic id
    refused = subprocess.run(consume_cmd(kafka_bootstrap, topic, tmp_path, "--on-new-topic", "refuse"),
                             capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2
    line = refused.stderr.strip().splitlines()[-1]
    assert "deleted and created again" in line and "--on-new-topic restart" in line
    again = run_to_end(consume_cmd(kafka_bootstrap, topic, tmp_path))
    assert again["ratings_learned"] == 50 and again["offsets"] == {"0": 30}
    # a checkpoint that predates topic ids: the offsets beyond the new topic's end tell
    store = CheckpointStore(tmp_path)
    _recreate(kafka_bootstrap, topic, [f"{n},3,3".encode() for n in range(5)])
    newest = store.latest()
    newest.meta.pop("topic_id")
    store.save(newest.parts, newest.meta)
    third = run_to_end(consume_cmd(kafka_bootstrap, topic, tmp_path))
    assert third["ratings_learned"] == 55 and third["offsets"] == {"0": 5}
