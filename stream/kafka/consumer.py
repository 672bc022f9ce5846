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
- A DP-SGD model learns whole noisy steps: the messages past a poll's last whole batch are held
  back, uncovered by the offsets, for the next poll (``kafka.whole_batches``).
- Dead letters are at-least-once: after a crash, a malformed message after the last checkpoint is
  consumed and dead-lettered again (the counters, being in the checkpoint, count it once).
- A message, a failed commit (``CommitFailedError`` after a long pause or a broker restart that
  lost the group) or a failed checkpoint write never ends the loop: a failed commit only means the
  group re-reads from the checkpoint's offsets, and a failed checkpoint is retried at the next
  cadence while the endpoint keeps serving. Each such event is one ``key=value`` log line.
- Not covered: a checkpoint directory that is lost or shared by two consumers of one group.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import Counter

from sketchrec.stream.checkpoint import CheckpointStore, LedgerIntegrityError
from sketchrec.stream.kafka import fast_records
from sketchrec.stream.kafka import codecs as codec_errors
from sketchrec.stream.kafka import identity
from sketchrec.stream.kafka.contact import broker_contact, messages_behind, track_stable_offsets
from sketchrec.stream.kafka.intake import finite_errors, read_poll
from sketchrec.stream.kafka.messages import dead_letter
from sketchrec.stream.kafka.idle import HEARTBEAT_MS, LAG_PATIENCE, SESSION_MS, IdleShare
from sketchrec.stream.kafka.offsets import OffsetBook
from sketchrec.stream.kafka.whole_batches import IDLE_SECONDS, WholeBatches
from sketchrec.stream.health import log_event
from sketchrec.stream.serving.server import freeze_startup
from sketchrec.stream.recommender import Recommender
from sketchrec.stream.service import LearningService, NoCheckpoint
from sketchrec.stream.sink import LocalCheckpoints, StateSink, Written, require_sink

log = logging.getLogger(__name__)


def kafka_config(bootstrap: str) -> dict:
    # Short group timeouts: the first join takes seconds rather than ~20 s on small brokers.
    return {"bootstrap_servers": bootstrap, "request_timeout_ms": 30_000}


class KafkaLearner:
    """The consume-learn-checkpoint loop around a ``LearningService``. Where it stands in each
    partition and when a checkpoint is due are ``self.book``'s (a ``kafka.offsets.OffsetBook``
    over ``service.offsets``); what /healthz says about the broker is ``service.health``'s.
    ``from_beginning``: partitions the checkpoint does not know start at their beginning even
    with a group (starting over knowingly), not at the group's committed offsets; so do all of
    a topic deleted and created again since the checkpoint (``on_new_topic`` "restart"; "refuse"
    raises ``identity.NewTopic``: ``kafka.identity``). Where the state is written is ``sink``'s
    (``stream.sink``: local checkpoints by default, a fleet member's snapshots on the model
    topic); ``write_state`` writes through it whichever it is.

    Extension points: a subclass changes the loop only through these public methods (the fleet
    member, ``stream.fleet.member.FleetLearner``, replaces each; no private one is overridden):
    ``resume_partitions(tps)`` where newly assigned partitions resume; ``learn_poll(records)`` how
    one poll is learned; ``tally(skipped, predictions, truth)`` where a batch's counts and errors
    go; ``after_poll()`` what runs after every poll; ``checkpoint(why)`` what making the state
    durable means; ``run`` the loop itself."""

    EXTENSION_POINTS = ("resume_partitions", "learn_poll", "tally", "after_poll", "checkpoint", "run")
    whole: WholeBatches | None = None   # a DP-SGD model's held messages (set in __init__)

    def __init__(self, service: LearningService, bootstrap: str, topic: str, group: str | None = None,
                 dead_topic: str | None = None, rating_range: tuple[float, float] | None = (0.5, 5.0),
                 checkpoint_every: int = 50_000, checkpoint_seconds: float = 30.0,
                 max_poll_records: int = 20_000, from_beginning: bool = False,
                 on_new_topic: str = "restart", sink: StateSink | None = None):
        # refused before any connection: a consumer whose state has nowhere to go
        self.sink = LocalCheckpoints(service) if sink is None else require_sink(sink)
        self.service, self.topic, self.group = service, topic, group
        self.dead_topic = dead_topic or f"{topic}.dead"
        self.rating_range = rating_range
        self.from_beginning = from_beginning
        self.stop = threading.Event()
        from kafka import KafkaConsumer, KafkaProducer
        config = kafka_config(bootstrap)
        codec_errors.install()
        # read_committed: messages of aborted transactions are never learned
        self.consumer = KafkaConsumer(
            **config, group_id=group, enable_auto_commit=False, auto_offset_reset="earliest",
            isolation_level="read_committed",
            max_poll_records=max_poll_records, session_timeout_ms=SESSION_MS, heartbeat_interval_ms=HEARTBEAT_MS,
            fetch_max_bytes=64 << 20, max_partition_fetch_bytes=16 << 20)
        fast_records.install(self.consumer)   # whole record batches read in one compiled pass
        track_stable_offsets(self.consumer)   # the lag stops at an open transaction (kafka.contact)
        self.producer = KafkaProducer(**config, linger_ms=20, acks="all")
        self.book = OffsetBook(service.offsets, checkpoint_every, checkpoint_seconds)
        self.whole = WholeBatches.of(service.recommender.model, rating_range)   # DP-SGD: or None
        self.closing = False
        self.share = IdleShare(self.consumer, topic, group)   # when an idle run may end
        self.last_checkpoint_ok = True
        self.dead_letters: Counter = Counter()  # set aside since the last checkpoint (for the log)
        self.taken = 0   # messages polled (progress, for the health)
        self.health = service.health
        self.health.watch_broker()
        self.health.probe = lambda: broker_contact(self.consumer)
        if self.sink.records_offsets and self.consumer.partitions_for_topic(topic):
            # a deleted and re-created topic: its start, or a one-line refusal (kafka.identity)
            self.from_beginning |= identity.check(self.consumer, service, topic, on_new_topic)
        self._assign()
        log_event("connect", bootstrap=bootstrap, topic=topic, group=group or "-")

    # --- partitions and offsets --------------------------------------------------------------------
    def _assign(self) -> None:
        from kafka import ConsumerRebalanceListener, TopicPartition

        learner = self

        class Listener(ConsumerRebalanceListener):
            def on_partitions_revoked(self, revoked):
                learner.share.revoked()
                learner.forget_held(revoked)
                # Runs on kafka-python's IO thread, where blocking consumer calls are refused:
                # the commit after this checkpoint is asynchronous. On our own close the final
                # checkpoint was already written.
                if revoked and not learner.closing:
                    log_event("rebalance", revoked=sorted(tp.partition for tp in revoked))
                    learner.checkpoint("rebalance", blocking_commit=False)

            def on_partitions_lost(self, lost):
                learner.share.revoked()
                learner.forget_held(lost)
                # evicted from the group (a stalled heartbeat): the partitions may have a new
                # owner already. A fleet member still publishes (its delta counts only if the new
                # owner has not claimed them yet: kafka.model_topic); a checkpointing learner
                # keeps its own checkpoint (the commit fails; the offsets stay in it).
                if lost and not learner.closing:
                    log_event("rebalance", logging.WARNING, lost=sorted(tp.partition for tp in lost))
                    learner.checkpoint("rebalance", blocking_commit=False)

            def on_partitions_assigned(self, assigned):
                learner.share.assigned()
                learner.forget_held(assigned)
                log_event("rebalance", assigned=sorted(tp.partition for tp in assigned))
                learner.resume_partitions(assigned)

        if self.group:
            self.consumer.subscribe([self.topic], listener=Listener())
        else:
            partitions = self._partitions()
            tps = [TopicPartition(self.topic, p) for p in sorted(partitions)]
            self.consumer.assign(tps)
            self.resume_partitions(tps)

    def _partitions(self, timeout: float = 30.0) -> set[int]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            partitions = self.consumer.partitions_for_topic(self.topic)
            if partitions:
                return partitions
            time.sleep(0.2)
        raise RuntimeError(f"topic {self.topic!r} not found on the broker")

    def resume_partitions(self, tps) -> None:
        """Partitions just assigned (on the listener's thread with a group): each resumes at the
        offset its state recorded, else at its beginning without a group or ``from_beginning``,
        else where the group committed."""
        for tp in tps:
            known = self.book.position(tp.partition)
            if known is not None:
                self.consumer.seek(tp, known)
            elif not self.group or self.from_beginning:
                self.consumer.seek_to_beginning(tp)

    # --- the loop -------------------------------------------------------------------------------
    def run(self, idle_exit: float | None = None) -> None:
        """Consume until stopped (or until no message arrived for ``idle_exit`` seconds and every
        assigned partition has been read to its end; past LAG_PATIENCE more, it exits anyway). A
        message, a failed commit or a failed checkpoint never ends it; ``last_checkpoint_ok``
        says whether the final checkpoint was written."""
        from kafka.errors import KafkaError
        # a consumer allocates a record per message: collections over start-up's objects cost
        # a fifth of its time with one rating per message (bench.kafka: 140k -> 178k/s)
        freeze_startup()
        last_data = time.monotonic()
        self.share.lag_logged = False
        try:
            while not self.stop.is_set():
                if not self.service.recommender.learning.is_set():
                    self._hold()  # paused over HTTP: idleness does not count
                    last_data = time.monotonic()
                    continue
                if self.consumer.paused():
                    self.consumer.resume(*self.consumer.paused())
                try:  # an unreadable batch (codec) is set aside and stepped over
                    records = codec_errors.poll_past_unreadable(self.consumer, self._set_aside, 200)
                except KafkaError as exc:  # the group or the broker: poll again, it rejoins
                    self._lost(exc)
                    continue
                self._watch(records)
                self.health.rest_if_silent(records == {}, self.stop)   # kafka-python spins then
                self.after_poll()
                # a set-aside batch (None) is data; joining a group (or rejoining it) is not
                # idleness, nor is holding no partition until that share has settled
                if records is None or records or self.share.joining() or not (
                        self.consumer.assignment() or self.share.settled()):
                    if records:
                        self.learn_poll(records)
                    last_data = time.monotonic()
                elif self.whole is not None and self.whole.held:   # (no idle exit while held)
                    self.learn_held(time.monotonic() - last_data)   # a pause: a partial step
                elif idle_exit is not None and time.monotonic() - last_data > idle_exit:
                    # idle means drained: a fetch that stalls longer than idle_exit (a loaded
                    # broker) while an assigned partition still has messages is not the end
                    if time.monotonic() - last_data > idle_exit + LAG_PATIENCE or (
                            self.share.settled() and self.share.drained()):
                        break
                if self.book.expired():
                    self.checkpoint("interval")
        finally:
            self.last_checkpoint_ok = self.checkpoint("shutdown")
            self.closing = True
            self.consumer.close(autocommit=False)
            self.producer.close(timeout=10)

    def _hold(self) -> None:
        """Learning is paused: poll with every partition paused, so the group membership stays
        and a stop signal is obeyed; a partition assigned during this poll is read again later."""
        self.consumer.pause(*self.consumer.assignment())
        try:
            records = self.consumer.poll(timeout_ms=200)
        except Exception as exc:  # noqa: BLE001 - as in run(): never fatal
            self._lost(exc)
            return
        for tp, messages in records.items():
            self.consumer.seek(tp, messages[0].offset)
        self._watch({})
        self.health.held()

    def _watch(self, records=None) -> None:
        """After each poll: does a broker answer (``kafka.contact``)? Logs when that changes.
        Reports progress to the health: messages taken (a set-aside batch, None, is one) and
        the lag the last fetches showed."""
        self.taken += 1 if records is None else sum(len(batch) for batch in records.values())
        self.health.progress(self.taken, messages_behind(self.consumer))
        was, since = self.health.connected, self.health.lost_since   # polled() clears it
        contact = broker_contact(self.consumer)
        self.health.polled(contact.answering, contact.why, contact.since)
        if contact.answering and was is False:
            log_event("connect", after_s=round(time.monotonic() - since, 1) if since else "-")
        elif not contact.answering and was is not False:
            log_event("lose", logging.WARNING, error=self.health.last_error)

    def after_poll(self) -> None:
        """After each poll: nothing here (a fleet member reads the model topic)."""

    def _lost(self, exc: Exception) -> None:
        """A failed poll: logged once per outage (``_watch`` logs the reconnection), then polled
        again after half a second."""
        if self.health.connected is not False:
            log_event("poll_failed", logging.WARNING, error=f"{type(exc).__name__}: {exc}")
        self.health.broker_lost(f"{type(exc).__name__}: {exc}")
        time.sleep(0.5)

    def learn_poll(self, records: dict) -> None:
        """Learn a poll: its messages read (``kafka.intake``: every rejection named, never a
        raise), the rejected dead-lettered, the rest learned in one batch, the offsets stored."""
        if self.whole is not None:
            records = self.whole.cut(records)   # whole noisy steps; the rest held, not stored
        poll = read_poll(records, self.rating_range, self.service.record_origin)
        for bad in poll.rejected:
            self._dead_letter(dead_letter(bad.tp.topic, bad.tp.partition, bad.message.offset,
                                          bad.index, bad.reason, bad.text, bad.message.value))
        if poll.fast:
            self.service.record_origin(None, poll.fast)
        skipped, ratings = poll.skipped, poll.ratings
        if len(ratings) and self.service.budget_stopped:
            skipped["privacy budget spent"] += len(ratings)  # serving goes on; learning does not
            ratings = ratings[:0]
        while not self.service.recommender.learning.wait(0.2):  # paused since the poll
            if self.stop.is_set():
                return  # nothing stored: these messages are consumed again after the restart
        if len(ratings):
            predictions = self.service.recommender.learn_many(poll.users, poll.items, ratings)
            self.tally(skipped, predictions, ratings)
        else:
            self.tally(skipped)
        self.book.store(poll.offsets, len(ratings) + sum(skipped.values()))

    def forget_held(self, tps) -> None:
        """Partitions rebalanced: held messages of theirs are consumed again from the offsets."""
        if self.whole is not None:
            self.whole.forget(tps)

    def learn_held(self, idle: float = float("inf")) -> None:
        """Learn the held messages (a partial step) once no message came for IDLE_SECONDS."""
        if self.whole is not None and self.whole.held and idle >= IDLE_SECONDS:
            self.whole.learning_all = True
            try:
                self.learn_poll(self.whole.release())
            finally:
                self.whole.learning_all = False

    def _set_aside(self, batch: codec_errors.UnreadableBatch) -> None:
        """A batch whose codec cannot be read: counted, dead-lettered whole, stepped over (the
        held messages learned first: its offset would cover theirs)."""
        self.learn_held()
        self.tally({batch.reason: batch.messages})
        self._dead_letter(batch.dead_letter())
        self.book.store({batch.partition: batch.next_offset}, batch.messages)

    def tally(self, skipped: Counter | dict, predictions=None, truth=None) -> None:
        """Count a batch's skipped ratings and prequential errors into the checkpointed state."""
        if predictions is not None:
            self.service.errors.add(*finite_errors(predictions, truth))
        self.service.record_skipped(skipped)
        self.dead_letters.update(skipped)

    def _dead_letter(self, letter: bytes) -> None:
        try:
            self.producer.send(self.dead_topic, value=letter)
        except Exception as exc:  # noqa: BLE001 - counted all the same; the flush reports it
            log_event("dead_letter_failed", logging.WARNING, error=f"{type(exc).__name__}: {exc}")

    def checkpoint(self, why: str, blocking_commit: bool = True) -> bool:
        """Dead letters flushed, then state + offsets durable, then offsets committed. A failure
        (broker, full disk) is logged on one line and retried at the next cadence; a failed
        commit only means the group re-reads from the checkpoint's offsets. True if written."""
        try:
            self.producer.flush(timeout=30)
            self.write_state(why)
        except Exception as exc:  # noqa: BLE001 - the endpoint stays up; the next one retries
            if isinstance(exc, LedgerIntegrityError):
                raise
            self.health.checkpoint_error = f"{type(exc).__name__}: {exc}"
            log_event("checkpoint_failed", logging.ERROR, why=why, error=self.health.checkpoint_error)
            self.book.retry_later()
            return False
        self.health.checkpoint_error = None
        if self.dead_letters:
            log_event("dead_letters", total=sum(self.dead_letters.values()),
                      reasons=json.dumps(dict(self.dead_letters), separators=(",", ":")))
            self.dead_letters.clear()
        self._commit(blocking_commit)
        self.book.checkpointed()
        return True

    def write_state(self, why: str) -> Written:
        """The consumer's state written through its sink now, and logged in one line (the sink's
        ``kind`` as the event). Raises as the sink does: the caller decides what a failure means."""
        written = self.sink.write()
        log_event(self.sink.kind, why=why, **written.fields())
        return written

    def _commit(self, blocking: bool) -> None:
        if not (self.group and self.book.offsets):
            return
        from kafka import OffsetAndMetadata, TopicPartition
        try:
            assigned = {tp.partition for tp in self.consumer.assignment()}
            commit = {TopicPartition(self.topic, p): OffsetAndMetadata(off, "", -1)
                      for p, off in self.book.to_commit(assigned).items()}
            if commit and blocking:
                self.consumer.commit(commit)
            elif commit:
                self.consumer.commit_async(commit)
        except Exception as exc:  # noqa: BLE001 - CommitFailedError, a lost coordinator, ...
            log_event("commit_failed", logging.WARNING, error=f"{type(exc).__name__}: {exc}",
                      note="state and offsets are in the checkpoint; the group re-reads from there")


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
