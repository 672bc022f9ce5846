"""The fleet's producer through librdkafka (``kafka.native_producer``) on a real broker: the futures
its callers read as kafka-python's (offsets in the order sent, done once delivered, a delivery the
broker refused is a failed future), its flush, and the end offset a reader sees after it."""

import uuid

import pytest
from kafka.errors import KafkaTimeoutError

from sketchrec.stream.fleet.feed_reader import PythonReader
from sketchrec.stream.fleet.model_topic import MAX_MESSAGE_BYTES
from sketchrec.stream.fleet.replicas import ensure_fleet_topics
from sketchrec.stream.kafka.native_producer import DeliveryFailed, NativeProducer


def test_messages_are_stored_in_the_order_sent_and_their_futures_say_where(kafka_bootstrap):
    topic = f"native-{uuid.uuid4().hex[:6]}.model"
    ensure_fleet_topics(kafka_bootstrap, topic)
    producer = NativeProducer(kafka_bootstrap, MAX_MESSAGE_BYTES)
    values = [b"a" * 70_000, b"", b"b" * 10, b"c" * 300_000]
    sent = [producer.send(topic, value=v, key=b"m1", partition=0, headers=[("h", bytes([n]))])
            for n, v in enumerate(values)]   # queued together
    producer.flush(timeout=60)
    assert all(f.is_done and f.succeeded() and not f.failed() for f in sent)
    assert [f.get(timeout=1).offset for f in sent] == [0, 1, 2, 3]
    assert producer.send(topic, value=b"d", partition=0).get(timeout=60).offset == 4
    producer.close(timeout=10)
    # a reader "to the end" sees every one (one message per record batch: Tansu ends a batch's
    # offsets at its first record)
    reader = PythonReader(kafka_bootstrap, topic, 0, MAX_MESSAGE_BYTES)
    try:
        assert reader.end_offset() == 5
    finally:
        reader.close()


def test_a_delivery_the_broker_refuses_is_a_failed_future(kafka_bootstrap):
    topic = f"native-{uuid.uuid4().hex[:6]}.model"
    ensure_fleet_topics(kafka_bootstrap, topic)   # one partition
    producer = NativeProducer(kafka_bootstrap, MAX_MESSAGE_BYTES)
    lost = producer.send(topic, value=b"x", partition=7)
    with pytest.raises(DeliveryFailed, match="PARTITION"):
        lost.get(timeout=60)
    assert lost.failed() and isinstance(lost.exception, DeliveryFailed)
    with pytest.raises(KafkaTimeoutError):   # nothing answers in no time
        producer.send(topic, value=b"y", partition=0).get(timeout=0)
    producer.close(timeout=30)
