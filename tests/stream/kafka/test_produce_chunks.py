"""`produce` writes a file's lines a chunk of messages at a time (never the whole file's text at
once), and the messages are still byte for byte those of the per-rating path, in its order."""

from __future__ import annotations

import numpy as np
import pytest

from sketchrec.stream.kafka import producer
from tests.stream.kafka.test_producer_messages import ratings


@pytest.mark.parametrize("text_ids", [False, True])
@pytest.mark.parametrize("batch", [1, 7, 250])
def test_lines_are_written_a_chunk_at_a_time(monkeypatch, text_ids, batch):
    monkeypatch.setattr(producer, "CHUNK_RATINGS", 100)
    written: list[int] = []
    real = producer.csv_lines

    def spy(order, *columns):
        written.append(len(order))
        return real(order, *columns)
    monkeypatch.setattr(producer, "csv_lines", spy)
    data = ratings(text_ids)
    chunked = list(producer._messages(data, data.ratings, batch))
    assert chunked == list(producer._paced(producer._rows(data, data.ratings), batch, None, 0.0))
    # every rating's line written once, in chunks of at most 100 ratings (a longer message alone)
    assert sum(written) == len(data) and len(written) >= len(data) // max(100, batch)
    assert max(written) <= max(100, batch)


def test_chunks_cover_the_runs_in_sending_order(monkeypatch):
    monkeypatch.setattr(producer, "CHUNK_RATINGS", 100)
    lengths = np.array([3, 50, 120, 1, 1, 60, 40])
    sending = np.array([6, 0, 2, 1, 5, 3, 4])   # 40, 3 | 120 (alone: longer) | 50 | 60, 1, 1
    chunks = [c.tolist() for c in producer._chunks(sending, lengths)]
    assert chunks == [[6, 0], [2], [1], [5, 3, 4]]


def test_the_send_queue_is_bounded(monkeypatch):
    """librdkafka's own default queue (1 GB) would hold the messages the chunks no longer do."""
    import confluent_kafka
    seen: dict = {}
    monkeypatch.setattr(confluent_kafka, "Producer", lambda config: seen.update(config))
    producer._client("127.0.0.1:9", "none", None)
    assert seen["queue.buffering.max.kbytes"] * 1024 <= 64 << 20
    assert seen["queue.buffering.max.messages"] <= 200_000
