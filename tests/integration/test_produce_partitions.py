"""`produce` (librdkafka) puts each user's messages on the partition kafka-python's
DefaultPartitioner (the Java client's murmur2) gives the user's key, for many keys, integer and
text: a topic written before and after the change is partitioned the same way, and a user's
ratings stay in order on one partition."""

import time

import numpy as np
import pytest
from kafka import KafkaConsumer, TopicPartition
from kafka.partitioner import DefaultPartitioner

from sketchrec.data import Ratings
from sketchrec.stream.kafka.consumer import kafka_config
from sketchrec.stream.kafka.messages import parse_message
from sketchrec.stream.kafka.producer import produce

confluent_kafka = pytest.importorskip("confluent_kafka")
PARTITIONS = 5


def ratings(n_users: int, text: bool) -> Ratings:
    rng = np.random.default_rng(4)
    n = 3 * n_users
    users = np.concatenate([np.arange(n_users), rng.integers(0, n_users, n - n_users)])
    if text:
        users = np.array([f"user-{u}-é" for u in users], object)
    return Ratings(users, rng.integers(1, 50, n), rng.choice([1.0, 3.5, 5.0], n), np.arange(n))


def read_back(bootstrap: str, topic: str, n_messages: int) -> list:
    consumer = KafkaConsumer(**kafka_config(bootstrap), enable_auto_commit=False)
    tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    consumer.assign(tps)
    consumer.seek_to_beginning(*tps)
    records, deadline = [], time.monotonic() + 120   # a bound for a loaded machine; the caller counts
    while len(records) < n_messages and time.monotonic() < deadline:
        for batch in consumer.poll(timeout_ms=200).values():
            records += batch
    consumer.close()
    return records


class _Cluster:   # the metadata DefaultPartitioner asks: every partition up
    def topics(self):
        return {"t"}

    def partitions_for_topic(self, topic):
        return set(range(PARTITIONS))

    available_partitions_for_topic = partitions_for_topic


def kafka_python_partition(key: bytes) -> int:
    return DefaultPartitioner().partition("t", key, key, None, None, _Cluster())


@pytest.mark.parametrize("text", [False, True])
def test_each_key_on_kafka_pythons_partition(kafka_bootstrap, text):
    data = ratings(1500, text)
    topic = f"partitions-{'text' if text else 'int'}"
    sent = produce(data, kafka_bootstrap, topic, batch=2, partitions=PARTITIONS)
    records = read_back(kafka_bootstrap, topic, sent["messages"])
    assert len(records) == sent["messages"]
    keys = {r.key for r in records}
    assert len(keys) == 1500
    assert all(r.partition == kafka_python_partition(r.key) for r in records)
    assert len({r.partition for r in records}) == PARTITIONS
    # each user's ratings in file order, on its one partition
    by_user: dict = {}
    for r in sorted(records, key=lambda r: (r.partition, r.offset)):
        by_user.setdefault(r.key, []).extend(t for *_, t in parse_message(r.value).ratings)
    assert all(stamps == sorted(stamps) for stamps in by_user.values())
    assert sum(map(len, by_user.values())) == len(data)


def test_librdkafkas_default_partitioner_would_move_keys(kafka_bootstrap):
    """The broken variant: librdkafka's own default (consistent_random, CRC32) puts most keys on
    another partition than kafka-python does; the test above would catch it."""
    topic = "partitions-default"
    producer = confluent_kafka.Producer({"bootstrap.servers": kafka_bootstrap})
    from sketchrec.stream.kafka.producer import ensure_topic
    ensure_topic(kafka_bootstrap, topic, PARTITIONS)
    keys = [str(u).encode() for u in range(300)]
    for key in keys:
        producer.produce(topic, b"1,1,3,0", key)
    assert producer.flush(30) == 0
    records = read_back(kafka_bootstrap, topic, len(keys))
    moved = sum(r.partition != kafka_python_partition(r.key) for r in records)
    assert moved > len(keys) / 2
