"""Kafka: message codec, the exactly-once consumer, the producer."""
