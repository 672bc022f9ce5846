"""A broker holding a follower's SyncGroup because the group's leader died with its JoinGroup
answer in hand (it never sends the assignment) is waiting by design, up to the leader's session:
the broker-health reader (``kafka.contact``) says it answers all along, on a real broker and a
real kafka-python group."""

import threading
import time
import uuid

from kafka import KafkaConsumer

from sketchrec.stream.kafka import internals
from sketchrec.stream.kafka.contact import SILENT_AFTER, broker_contact
from sketchrec.stream.kafka.producer import ensure_topic
from conftest import wait_for

SESSION_MS = 6000    # the leader's session: how long the broker holds the follower's SyncGroup
SYNC_GROUP = 14


def _member(bootstrap: str, group: str, topic: str) -> KafkaConsumer:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False,
                             session_timeout_ms=SESSION_MS, heartbeat_interval_ms=1000)
    consumer.subscribe([topic])
    return consumer


def _polling(consumer: KafkaConsumer, until: threading.Event) -> threading.Thread:
    def run():
        try:
            while not until.is_set():
                consumer.poll(200)
        except Exception:   # noqa: BLE001 - the dead leader's poll fails once it is let go
            pass
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _held_sync_group_s(consumer: KafkaConsumer) -> float:
    """How long the consumer's oldest unanswered SyncGroup has waited (0: none)."""
    now = time.monotonic()
    return max([now - sent for conn in internals.connections(consumer) if conn.connected
                for key, sent, _ in internals.unanswered(conn) if key == SYNC_GROUP], default=0.0)


def test_a_sync_group_held_for_a_dead_leader_is_no_silence(kafka_bootstrap):
    topic, group = f"hold-{uuid.uuid4().hex[:6]}", f"hold-{uuid.uuid4().hex[:6]}"
    ensure_topic(kafka_bootstrap, topic, 2)
    leader, done = _member(kafka_bootstrap, group, topic), threading.Event()
    wait_for(lambda: leader.poll(200) is not None and leader.assignment(), "the leader's assignment",
             timeout=120, every=0)
    # from its next JoinGroup answer on, the leader is dead: it neither assigns nor heartbeats
    leader._coordinator._perform_assignment = lambda *args: done.wait(120) and {}
    threads = [_polling(leader, done)]
    follower = _member(kafka_bootstrap, group, topic)
    threads.append(_polling(follower, done))
    seen = {"held": 0.0, "silent": []}

    def follower_assigned():
        held = _held_sync_group_s(follower)
        contact = broker_contact(follower)
        seen["held"] = max(seen["held"], held)
        if held > SILENT_AFTER and not contact.answering:
            seen["silent"].append(contact.why)
        return follower.assignment() if held == 0 and seen["held"] else None
    try:
        wait_for(follower_assigned, "the follower's assignment after the leader's session", timeout=120,
                 every=0.1)
    finally:
        done.set()
        for thread in threads:
            thread.join(timeout=30)
        follower.close(autocommit=False)
        leader.close(autocommit=False)
    assert seen["held"] > SILENT_AFTER, "the broker never held the SyncGroup: nothing was tested"
    assert seen["silent"] == []
