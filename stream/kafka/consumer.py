"""Consume ratings from Kafka into the learner, with exactly-once-in-state checkpoints.

The guarantee, and its limits:
- Everything the model has learned, the serving structures, the per-partition offsets, the
  skip counters and the prequential error sums are written together in ONE atomic checkpoint
  (``stream.checkpoint``). On start the consumer loads the newest valid checkpoint and seeks every
  partition to the offset stored with it. A crash (even ``kill -9``) therefore loses only what
  was learned after the last checkpoint, and those ratings are consumed again: each rating is
  reflected in the checkpointed state exactly once.
- Offsets are committed to the consumer group only after the checkpoint is durable, so the group's
  committed offsets never run ahead of the model. They are used only for partitions the checkpoint
  does not know (e.g. a new partition); the checkpoint's offsets win otherwise.
- On a rebalance, the consumer checkpoints and commits before giving partitions up.
- Dead letters are at-least-once: after a crash, a malformed message after the last checkpoint is
  consumed and dead-lettered again (the counters, being in the checkpoint, count it once).
- Not covered: a checkpoint directory that is lost or shared by two consumers of one group.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter

import numpy as np

from sketchrec.stream.checkpoint import CheckpointStore
from sketchrec.stream.kafka import codec_errors
from sketchrec.stream.kafka.messages import dead_letter, parse_message
from sketchrec.stream.kafka.offsets import OffsetBook
from sketchrec.stream.serving.recommender import Recommender
from sketchrec.stream.serving.service import LearningService, NoCheckpoint

log = logging.getLogger(__name__)


def kafka_config(bootstrap: str) -> dict:
    # Short group timeouts: the first join takes seconds rather than ~20 s on small brokers.
    return {"bootstrap_servers": bootstrap, "request_timeout_ms": 30_000}


class KafkaLearner:
    """The consume-learn-checkpoint loop around a ``LearningService``. Where it stands in each
    partition and when a checkpoint is due are ``self.book``'s (a ``kafka.offsets.OffsetBook``
    over ``service.offsets``)."""

    def __init__(self, service: LearningService, bootstrap: str, topic: str, group: str | None = None,
                 dead_topic: str | None = None, rating_range: tuple[float, float] | None = (0.5, 5.0),
                 checkpoint_every: int = 50_000, checkpoint_seconds: float = 30.0,
                 max_poll_records: int = 20_000):
        if service.checkpoints is None:
            raise ValueError("the Kafka consumer needs a checkpoint directory")
        self.service, self.topic, self.group = service, topic, group
        self.dead_topic = dead_topic or f"{topic}.dead"
        self.rating_range = rating_range
        self.stop = threading.Event()
        from kafka import KafkaConsumer, KafkaProducer
        config = kafka_config(bootstrap)
        codec_errors.install()
        # read_committed: messages of aborted transactions are never learned
        self.consumer = KafkaConsumer(
            **config, group_id=group, enable_auto_commit=False, auto_offset_reset="earliest",
            isolation_level="read_committed",
            max_poll_records=max_poll_records, session_timeout_ms=6000, heartbeat_interval_ms=1000,
            fetch_max_bytes=64 << 20, max_partition_fetch_bytes=16 << 20)
        self.producer = KafkaProducer(**config, linger_ms=20, acks="all")
        self.book = OffsetBook(service.offsets, checkpoint_every, checkpoint_seconds)
        self.closing = False
        self._assign()

    # --- partitions and offsets --------------------------------------------------------------------
    def _assign(self) -> None:
        from kafka import ConsumerRebalanceListener, TopicPartition

        learner = self

        class Listener(ConsumerRebalanceListener):
            def on_partitions_revoked(self, revoked):
                # Runs on kafka-python's IO thread, where blocking consumer calls are refused:
                # the commit after this checkpoint is asynchronous. On our own close the final
                # checkpoint was already written.
                if revoked and not learner.closing:
                    learner.checkpoint("rebalance", blocking_commit=False)

            def on_partitions_assigned(self, assigned):
                learner._seek(assigned)

        if self.group:
            self.consumer.subscribe([self.topic], listener=Listener())
        else:
            partitions = self._partitions()
            tps = [TopicPartition(self.topic, p) for p in sorted(partitions)]
            self.consumer.assign(tps)
            self._seek(tps)

    def _partitions(self, timeout: float = 30.0) -> set[int]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            partitions = self.consumer.partitions_for_topic(self.topic)
            if partitions:
                return partitions
            time.sleep(0.2)
        raise RuntimeError(f"topic {self.topic!r} not found on the broker")

    def _seek(self, tps) -> None:
        for tp in tps:
            known = self.book.position(tp.partition)
            if known is not None:
                self.consumer.seek(tp, known)
            elif not self.group:
                self.consumer.seek_to_beginning(tp)

    # --- the loop -------------------------------------------------------------------------------
    def run(self, idle_exit: float | None = None) -> None:
        """Consume until stopped (or until no message arrived for ``idle_exit`` seconds)."""
        last_data = time.monotonic()
        try:
            while not self.stop.is_set():
                records = codec_errors.poll_past_unreadable(self.consumer, self._set_aside, 200)
                # a set-aside batch (None) is data; joining a group is not idleness
                if records is None or records or not self.consumer.assignment():
                    if records:
                        self._learn(records)
                    last_data = time.monotonic()
                elif idle_exit is not None and time.monotonic() - last_data > idle_exit:
                    break
                if self.book.expired():
                    self.checkpoint("interval")
        finally:
            self.checkpoint("shutdown")
            self.closing = True
            self.consumer.close(autocommit=False)
            self.producer.close(timeout=10)

    def _learn(self, records: dict) -> None:
        users, items, ratings = [], [], []
        skipped: Counter = Counter()
        offsets = {}
        for tp, messages in records.items():
            for msg in messages:
                parsed = parse_message(msg.value, self.rating_range)
                for index, reason, text in parsed.rejected:
                    skipped[reason] += 1
                    self.producer.send(self.dead_topic, value=dead_letter(
                        tp.topic, tp.partition, msg.offset, index, reason, text, msg.value))
                self.service.record_origin(msg.headers, len(parsed.ratings))
                for u, i, r, _ in parsed.ratings:
                    users.append(u)
                    items.append(i)
                    ratings.append(r)
            offsets[tp.partition] = messages[-1].offset + 1
        if ratings and self.service.budget_stopped:
            skipped["privacy budget spent"] += len(ratings)  # serving goes on; learning does not
            ratings = []
        if ratings:
            r = np.asarray(ratings, dtype=np.float64)
            predictions = self.service.recommender.learn_many(_ids(users), _ids(items), r)
            self.service.errors.add(predictions, r)
        self.service.record_skipped(skipped)
        self.book.store(offsets, len(ratings) + sum(skipped.values()))

    def _set_aside(self, batch: codec_errors.UnreadableBatch) -> None:
        self.service.record_skipped({batch.reason: batch.messages})
        self.producer.send(self.dead_topic, value=batch.dead_letter())
        self.book.store({batch.partition: batch.next_offset}, batch.messages)

    def checkpoint(self, why: str, blocking_commit: bool = True) -> None:
        """Dead letters flushed, then state + offsets durable, then offsets committed."""
        self.producer.flush(timeout=30)
        written = self.service.checkpoint()
        log.info("checkpoint %s (%s): %d ratings learned", written["path"], why, written["ratings_learned"])
        if self.group and self.book.offsets:
            from kafka import OffsetAndMetadata, TopicPartition
            assigned = {tp.partition for tp in self.consumer.assignment()}
            commit = {TopicPartition(self.topic, p): OffsetAndMetadata(off, "", -1)
                      for p, off in self.book.to_commit(assigned).items()}
            if commit and blocking_commit:
                self.consumer.commit(commit)
            elif commit:
                self.consumer.commit_async(commit)
        self.book.checkpointed()


def _ids(values: list) -> np.ndarray:
    if all(type(v) is int for v in values):
        return np.asarray(values, dtype=np.int64)
    return np.asarray([str(v) for v in values], dtype=object)


def resume_or_create(checkpoint_dir, make_model, *, pair_capacity: int,
                     model_classes: dict | None = None, seed: int = 0, monitor=None,
                     debias_ldp: bool = False) -> LearningService:
    """The service continuing from the newest valid checkpoint (``LearningService.from_checkpoint``),
    or a fresh one around ``make_model()`` if there is none, whose Bloom filter of seen pairs is
    sized for ``pair_capacity`` ratings. ``monitor`` and ``debias_ldp`` as for ``LearningService``."""
    try:
        return LearningService.from_checkpoint(checkpoint_dir, model_classes, read_only=False,
                                               monitor=monitor, debias_ldp=debias_ldp)
    except NoCheckpoint:
        recommender = Recommender(make_model(), pair_capacity=pair_capacity, seed=seed, monitor=monitor)
        return LearningService(recommender, CheckpointStore(checkpoint_dir), debias_ldp=debias_ldp)
