"""Replicas of a fleet's model: the topics, the newest snapshot plus the model topic as a service
(``open_replica``), a fenced member's replica rebuilt in place (``rebuild``), snapshots written,
and the read-only ``FleetReplica`` behind `sketchrec serve --bootstrap … --topic T`. The learning
member itself is ``fleet.member.FleetLearner``."""

from __future__ import annotations

import functools
import logging
import threading
import time
import uuid

from sketchrec.models.registry import MODELS
from sketchrec.stream.checkpoint import operator_parts, restore_operator_parts
from sketchrec.stream.fleet import snapshots
from sketchrec.stream.fleet.model_feed import ModelFeed
from sketchrec.stream.fleet.model_topic import MAX_MESSAGE_BYTES, FleetState, Truncated, no_origin
from sketchrec.stream.fleet.views import Diverged
from sketchrec.stream.fleet.tracker import DeltaTracker
from sketchrec.stream.fleet.warm import warm
from sketchrec.stream.health import log_event
from sketchrec.stream.kafka.consumer import kafka_config
from sketchrec.stream.kafka.contact import broker_contact
from sketchrec.stream.recommender import Recommender
from sketchrec.stream.service import LearningService
from sketchrec.stream.sink import Written


def ensure_fleet_topics(bootstrap: str, model_topic: str) -> None:
    """The model topic and its snapshots topic, one partition each (one order for every replica)."""
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic
    from kafka.errors import TopicAlreadyExistsError
    admin = KafkaAdminClient(**kafka_config(bootstrap))
    try:
        have = set(admin.list_topics())
        new = [NewTopic(t, num_partitions=1, replication_factor=1,
                        topic_configs={"max.message.bytes": str(MAX_MESSAGE_BYTES)})
               for t in (model_topic, snapshots.snapshot_topic(model_topic)) if t not in have]
        if new:
            try:
                admin.create_topics(new)
            except TopicAlreadyExistsError:
                pass  # another member was first
    finally:
        admin.close()


class NoExactReplica(RuntimeError):
    """The model topic starts after the newest snapshot's position (retention deleted deltas that
    no snapshot holds) or ends before it (the topic was made again): no replica of this fleet
    can be made exact (one line at the CLI)."""


def _check_log_holds(bootstrap: str, model_topic: str, meta: dict | None) -> None:
    """NoExactReplica unless the model topic still holds every delta after the snapshot whose
    ``meta`` is given (None: no snapshot, the empty model at position 0), as ``snapshots._load``
    skips a snapshot whose chunks are gone, and reaches its position."""
    from kafka import KafkaConsumer, TopicPartition
    consumer = KafkaConsumer(**kafka_config(bootstrap), enable_auto_commit=False)
    try:
        tp = TopicPartition(model_topic, 0)
        start, end = consumer.beginning_offsets([tp])[tp], consumer.end_offsets([tp])[tp]
    finally:
        consumer.close(autocommit=False)
    position = meta["fleet"]["position"] if meta is not None else 0
    if position > end:   # a rebuild from it would read nothing and be handed Truncated again
        raise NoExactReplica(
            f"{model_topic} ends at offset {end}, before the newest snapshot's position {position}: "
            "the model topic was deleted and made again since (its snapshot topic kept), so no "
            "replica of this fleet can be made exact; start a new fleet on another --model-topic "
            "(or delete its snapshot topic too)")
    if position < start:
        what = f"the newest snapshot's position {position}" if meta is not None else "offset 0 (no snapshot)"
        raise NoExactReplica(
            f"{model_topic} starts at offset {start}, after {what}: retention deleted deltas that "
            "no snapshot holds, so no replica of this fleet can be made exact; start a new fleet "
            "on another --model-topic (and keep the model topic's retention longer than two "
            "snapshot intervals)")


def model_producer(bootstrap: str):
    """The producer of a fleet's deltas, claims and snapshots: idempotent, so they reach the
    topic in the order they were sent (``kafka.native_producer``: librdkafka)."""
    from sketchrec.stream.kafka.native_producer import NativeProducer
    return NativeProducer(bootstrap, MAX_MESSAGE_BYTES)


class FleetService(LearningService):
    """A fleet replica's service: its privacy ledger is the model topic's (``FleetState.ledger``:
    every replica that read as far reports the same epsilon, and no restore lowers it), and
    /privacy says how the members compose."""

    COMPOSITION = ("parallel over the input partitions: the consumer group gives each rating to "
                   "one member and the model topic's claims make that exact, so the members' "
                   "DP-SGD steps are over disjoint data and the fleet's epsilon is that of its "
                   "most-passed partition (its passes composed), not a sum over members; a "
                   "refused delta (a zombie's) is one more pass over its partitions")

    def __init__(self, *args, **kw):
        self.pending_origin = no_origin()   # this member's counts, until its next delta carries them
        self._debiased_for = None           # the mechanism the recommender's debias map is for
        super().__init__(*args, **kw)

    # local DP: where the fleet's ratings came from is what its accepted deltas say, and whether
    # to debias is the fleet's (its first snapshot's), so every member and replica reports and
    # answers alike; what the base class would set per process is ignored
    origin = property(lambda self: self.fleet.origin if getattr(self, "fleet", None) else no_origin(),
                      lambda self, value: None)
    debias_ldp = property(lambda self: bool(getattr(self, "fleet", None) and self.fleet.ldp_debias),
                          lambda self, value: None)

    def record_origin(self, headers, n_ratings: int) -> None:
        """Count a message's ratings for this member's next delta. Never draws an id key (as one
        learner does on its first perturbed rating): a member's own key would orphan what the
        others learn; a local-DP fleet's key comes with its first snapshot."""
        from sketchrec.privacy.ldp import HEADER, combine, parse_header
        named = dict(headers or []).get(HEADER)
        mechanism = parse_header(named) if named is not None else None
        self.pending_origin["raw" if mechanism is None else "perturbed_on_device"] += n_ratings
        self.pending_origin["mechanism"] = combine(self.pending_origin["mechanism"], mechanism)

    def take_origin(self) -> dict:
        """The counts of ``record_origin`` since the last take (for a delta's header)."""
        taken, self.pending_origin = self.pending_origin, no_origin()
        return taken

    def follow_origin(self) -> None:
        """Map predictions back through the mechanism the model topic has named, once it is named
        (and again if it changes)."""
        if self.origin["mechanism"] != self._debiased_for:
            self._debiased_for = self.origin["mechanism"]
            self.apply_ldp_debias()

    @property
    def ledger(self):
        state = getattr(self, "fleet", None)
        return state.ledger() if state is not None else None

    @ledger.setter
    def ledger(self, value) -> None:
        # the base class sets None at construction; a fleet's passes are charged on its model
        # topic only (FleetState), never by a process
        if value is not None:
            raise ValueError("a fleet's privacy ledger is its model topic's")

    def privacy(self) -> dict:
        figures = super().privacy()
        state = getattr(self, "fleet", None)
        if state is not None and state.dp is not None:
            figures["composition"] = self.COMPOSITION
            figures["passes_by_partition"] = dict(sorted(state.passes.items()))
        return figures


def open_replica(bootstrap: str, model_topic: str, make_recommender=None, member: str | None = None,
                 wait: float = 60.0, dp: dict | None = None, ldp_debias: bool = False) -> LearningService:
    """A service whose recommender is the newest snapshot's, with ``service.fleet`` (its
    FleetState) and ``service.tracker`` (its DeltaTracker) set. With ``make_recommender`` and no
    snapshot yet, that recommender's empty state is written as the first one (all members then
    start from the same bytes, whichever wrote first) with ``dp`` (a DP fleet's unit, delta and
    per-pass multiplier: ``FleetState.dp``) and ``ldp_debias`` (a local-DP fleet maps predictions
    back); without, wait up to ``wait`` seconds."""
    ensure_fleet_topics(bootstrap, model_topic)
    topic = snapshots.snapshot_topic(model_topic)
    holds = functools.partial(_check_log_holds, bootstrap, model_topic)   # before a snapshot is read
    snap, deadline = snapshots.newest(bootstrap, topic, check=holds), time.monotonic() + wait
    while snap is None:
        if make_recommender is not None:
            _check_log_holds(bootstrap, model_topic, None)   # (not a first snapshot of a used topic)
            first = make_recommender()
            producer = model_producer(bootstrap)
            write_snapshot(producer, topic, first, FleetState(dp=dp, ldp_debias=ldp_debias),
                           type(first.model).__name__)
            producer.close(timeout=10)
        elif time.monotonic() > deadline:
            raise TimeoutError(f"no snapshot in {topic} after {wait:g} s: start a learner first")
        else:
            time.sleep(0.5)
        snap = snapshots.newest(bootstrap, topic, check=holds)
    model_cls = MODELS[snap.meta["model_class"]]
    if make_recommender is not None:   # a learning member: its kernels loaded before its first batch
        warm(snap.parts, model_cls)
    recommender = Recommender.from_parts(snap.parts, model_cls)
    restore_operator_parts(recommender.model, snap.parts)
    service = FleetService(recommender, None, read_only=make_recommender is None,
                           model_cls=model_cls)
    state = FleetState.from_dict(snap.meta["fleet"], member)
    # the service's figures are the fleet's: what the accepted deltas say
    service.errors, service.skipped, service.offsets = state.errors, state.skipped, state.covered
    service.fleet, service.tracker = state, DeltaTracker(recommender, member)
    service.follow_origin()
    service.last_checkpoint = {"name": f"snapshot@{snap.offset}", "seq": snap.offset,
                               "ratings_learned": snap.meta.get("ratings_learned"),
                               "at": snap.meta.get("written_at")}
    return service


def rebuild(service: LearningService, bootstrap: str, model_topic: str, member: str,
            bound=None) -> None:
    """Replace ``service``'s replica in place (an endpoint serving it keeps serving) by the
    newest snapshot plus the model topic, as ``member``: after its member was fenced, or its
    position was deleted (``Truncated``); ``NoExactReplica`` when the newest snapshot is gone too.
    ``bound``: what the serving options do to a replica (``--max-items``), done to the new one
    before it is swapped in, as to the first."""
    fresh = open_replica(bootstrap, model_topic, member=member)
    feed = ModelFeed(bootstrap, model_topic, fresh.fleet, fresh.tracker.apply, native=True)
    try:
        feed.catch_up()
        fresh.tracker.settle()
    finally:
        feed.close()
    if bound is not None:
        bound(fresh)
    for name in ("errors", "skipped", "offsets", "fleet", "tracker", "last_checkpoint", "model_cls"):
        setattr(service, name, getattr(fresh, name))
    service.recommender = fresh.recommender   # last: one reference swap for the endpoint
    service._debiased_for = None   # the new recommender is debiased afresh
    service.pending_origin = no_origin()   # the successor of the fenced member counts those again
    service.follow_origin()


def write_snapshot(producer, topic: str, recommender: Recommender, state: FleetState,
                   model_class: str) -> int:
    parts = {**recommender.state_parts(), **operator_parts(recommender.model)}
    return snapshots.write(producer, topic, parts, {"fleet": state.to_dict(), "model_class": model_class,
                                                    "ratings_learned": int(recommender.model.n_learned)})


class TopicSnapshots:
    """A fleet member's sink (``stream.sink.StateSink``): a snapshot on the model topic's snapshot
    topic. ``write`` first reads the model topic to its end and settles the replica, which is then
    exactly the accepted deltas up to that position, and writes it with the fleet's state.

    Parameters
    ----------
    service:
        The member's service (``open_replica``): its recommender, ``fleet`` state and ``tracker``
        are read at each write (``rebuild`` replaces them in place).
    feed:
        The member's reader of the model topic.
    producer, topic:
        The producer and the snapshot topic (``snapshots.snapshot_topic``) written to.

    Examples
    --------
    >>> from sketchrec.stream.sink import StateSink
    >>> isinstance(TopicSnapshots.__new__(TopicSnapshots), StateSink)
    True
    """

    kind = "snapshot"
    records_offsets = False   # a member resumes from the model topic's accepted deltas

    def __init__(self, service: LearningService, feed: ModelFeed, producer, topic: str):
        self.service, self.feed, self.producer, self.topic = service, feed, producer, topic

    def write(self) -> Written:
        self.feed.catch_up()
        self.service.tracker.settle()
        state = self.service.fleet
        if state.views.disputed(state.position):   # this replica may be the one that diverged
            return Written("held", self.service.ratings_learned,
                           {"offset": None, "position": state.position, "why": "a member's view differs"})
        offset = write_snapshot(self.producer, self.topic, self.service.recommender, state,
                                self.service.model_cls.__name__)
        return Written(f"snapshot@{offset}", self.service.ratings_learned,
                       {"offset": offset, "position": state.position})


def new_member_id() -> str:
    return uuid.uuid4().hex[:12]


class FleetReplica:
    """A read-only replica: a thread adds every accepted delta of the model topic to the service
    that ``open_replica`` built, until ``stop`` is set. A position the topic no longer holds
    (``Truncated``) makes it unhealthy until it is rebuilt from the newest snapshot (tried again
    every ``REBUILD_AFTER_S`` while that snapshot is older than the log too)."""

    REBUILD_AFTER_S = 30.0

    def __init__(self, service: LearningService, bootstrap: str, model_topic: str, bound=None):
        self.service, self.bootstrap, self.model_topic = service, bootstrap, model_topic
        self.bound = bound   # the serving options' (``rebuild``): a rebuilt replica keeps them
        self.feed = self._feed()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="model-topic")

    def start(self) -> "FleetReplica":
        self.thread.start()
        return self

    def _run(self) -> None:
        """Apply the model topic; the health hears after each poll whether the broker answers
        (a poll of a lost or hung broker returns nothing rather than raising: ``kafka.contact``)."""
        health = self.service.health
        health.watch_broker()
        health.probe = lambda: broker_contact(self.feed.consumer)
        while not self.stop.is_set():
            try:
                if not self.feed.poll(200):
                    self.service.tracker.settle()   # read to the end: the popular list too
                contact = broker_contact(self.feed.consumer)
                health.polled(contact.answering, contact.why, contact.since)
            except (Truncated, Diverged) as exc:
                self._rebuild(exc)
            except Exception as exc:  # noqa: BLE001 - the endpoint keeps serving what it has
                health.broker_lost(f"{type(exc).__name__}: {exc}")
                log_event("poll_failed", logging.WARNING, error=health.last_error)
                time.sleep(0.5)
        self.feed.close()

    def _feed(self) -> ModelFeed:
        service = self.service
        return ModelFeed(self.bootstrap, self.model_topic, service.fleet, service.tracker.apply,
                         service.follow_origin)

    def _rebuild(self, lost: Truncated | Diverged) -> None:
        """Serving on from a replica that skipped deltas, or read the topic otherwise than the
        members (``views``), would be silently stale or wrong: unhealthy (the reason on /health)
        until the newest snapshot plus the model topic replace it."""
        health = self.service.health
        health.inexact = str(lost)
        event = "replica_truncated" if isinstance(lost, Truncated) else "replica_diverged"
        log_event(event, logging.ERROR, error=health.inexact)
        try:
            rebuild(self.service, self.bootstrap, self.model_topic, None, bound=self.bound)
            feed = self._feed()
        except Exception as exc:  # noqa: BLE001 - NoExactReplica, or the broker away: try again later
            health.inexact = f"{lost}; not rebuilt: {exc}"
            log_event("rebuild_failed", logging.ERROR, error=health.inexact)
            self.stop.wait(self.REBUILD_AFTER_S)
            return
        self.feed.close()
        self.feed, health.inexact = feed, None
        log_event("replica_rebuilt", position=self.service.fleet.position)
