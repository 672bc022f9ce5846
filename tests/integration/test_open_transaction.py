"""A producer holding a transaction open is no stall: a read_committed consumer cannot read its
messages before it ends, so its lag stops at the last stable offset, not the high watermark.

Before: the lag counted the open transaction's messages, so a consumer that had read everything
it could was "no progress for N s while M messages wait" (a 503) as long as the transaction
stayed open."""

import threading
import uuid

from kafka import KafkaProducer

from sketchrec.models import SketchMF
from sketchrec.stream.health import Health
from sketchrec.stream.kafka.consumer import KafkaLearner, resume_or_create
from sketchrec.stream.kafka.producer import ensure_topic
from conftest import wait_for

STALL_AFTER = 1.0   # seconds: the health's stall threshold, shortened for the test
OPEN = 50           # messages in the open transaction


def _ratings(start: int, n: int) -> list[bytes]:
    return [f"{u % 40},{u % 30},{1 + u % 5},{u}".encode() for u in range(start, start + n)]


def test_an_open_transaction_is_no_stall_and_its_messages_are_learned_once_committed(
        kafka_bootstrap, tmp_path):
    topic = f"open-tx-{uuid.uuid4().hex[:8]}"
    ensure_topic(kafka_bootstrap, topic, 1)
    plain = KafkaProducer(bootstrap_servers=kafka_bootstrap)
    for value in _ratings(0, 100):
        plain.send(topic, value)
    plain.flush()
    plain.close()
    held = KafkaProducer(bootstrap_servers=kafka_bootstrap, transactional_id=f"tx-{topic}")
    held.init_transactions()
    held.begin_transaction()
    for value in _ratings(100, OPEN):
        held.send(topic, value)
    held.flush()   # written, not committed

    service = resume_or_create(tmp_path, lambda: SketchMF(capacity=500, dim=8), pair_capacity=20_000)
    service.health.stall_after = STALL_AFTER
    learner = KafkaLearner(service, kafka_bootstrap, topic, checkpoint_every=10_000)
    # the broken variant, fed the same polls: the lag up to the high watermark
    by_highwater = Health(stall_after=STALL_AFTER)
    watch = learner._watch

    def both(records=None):
        watch(records)
        states = learner.consumer._subscription.assignment.values()
        known = [s.highwater - s.position.offset for s in states
                 if s.highwater is not None and s.position is not None]
        by_highwater.progress(learner.taken, sum(known) if known else None)

    learner._watch = both
    thread = threading.Thread(target=learner.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: service.ratings_learned == 100, "the committed messages learned", every=0.05)
        # past the threshold, the transaction still open: the broken variant sees a stall (awaited,
        # not slept: its polls may come late on a loaded machine), the health does not
        wait_for(lambda: any(p.startswith("no progress") for p in by_highwater.problems()),
                 "the lag to the high watermark to read as a stall", every=0.05)
        assert service.health.problems() == [], service.health.problems()
        assert service.health.behind == 0
        assert by_highwater.behind == OPEN
        held.commit_transaction()
        wait_for(lambda: service.ratings_learned == 100 + OPEN, "the transaction's messages learned", every=0.05)
        assert service.health.problems() == []
    finally:
        learner.stop.set()
        thread.join(timeout=30)
        held.close()
    assert not thread.is_alive()
