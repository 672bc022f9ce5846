"""A fleet: many `consume --fleet` processes of one consumer group share one model.

Each member learns from the partitions the group gives it and, every ``sync_ms`` or
``sync_ratings`` (whichever first), publishes what it learned since its last publish
(``DeltaTracker.take()``) to the model topic with the input offsets that delta covers
(``model_topic``); it adds every other member's accepted delta to its own replica (``model_feed``).
A read-only ``FleetReplica`` (`sketchrec serve --bootstrap … --topic T`) only adds.

Pace. A member polls large batches and learns each in chunks of about ``sync_ratings`` ratings,
publishing and reading the model topic between chunks (each chunk's offsets stored as it is
learned: what a delta covers stays exact). A member holding every partition is the only learner:
nothing drifts, so it publishes every ``ALONE`` x ``sync_ratings`` ratings (or ``sync_ms``); among
M members, by default, every drift budget / (M - 1) ratings (``pace.sync_interval``).

Exactly once across the fleet: the model topic is the record of what has been learned. Before a
member gives partitions up (a rebalance, a stop) it publishes and waits for the broker's
acknowledgement; a member given partitions first publishes a claim of them, reads the model topic
through its claim and then seeks each partition to the offset after the last accepted delta
covering it (``kafka.model_topic``: after the claim, only the owner's deltas count). A member that
dies (``kill -9``) loses only what it had not published, and its successor consumes that again. A
member whose own delta was refused (it was evicted from the group and published late) is
*fenced*: its replica holds learning the fleet does not, so `consume --fleet` rebuilds it from the
newest snapshot and the model topic and rejoins the group as a new member (``rebuild``); so is a
member that read the model topic otherwise than the others (``views``).

Snapshots (``snapshots``): the holder of partition 0 writes one every ``snapshot_seconds``, right
after publishing and reading the model topic to its end (its replica is then exactly the accepted
deltas up to there). A member starts from the newest (the first member writes the empty model as
the first: every replica starts from the same bytes) and reads the model topic from its position.
"""

from __future__ import annotations

import logging
import time
from collections import Counter

from sketchrec.models.metrics import ErrorStats
from sketchrec.stream.fleet import snapshots
from sketchrec.stream.fleet.pace import (ALONE, BUDGET, SYNC_RATINGS, Budget, HotItems, budget,
                                         full_refresh_ratings, noisy_batch, sync_interval)
from sketchrec.stream.fleet.outage import Outages
from sketchrec.stream.fleet.replicas import (FleetReplica, TopicSnapshots, ensure_fleet_topics,  # noqa: F401
                                             model_producer, new_member_id, open_replica, rebuild,
                                             write_snapshot)
from sketchrec.stream.kafka.consumer import KafkaLearner
from sketchrec.stream.fleet.model_feed import ModelFeed
from sketchrec.stream.fleet.model_topic import HEADER, FleetState, Fenced, encode_meta
from sketchrec.stream.kafka.intake import finite_errors
from sketchrec.stream.kafka.offsets import OffsetBook
from sketchrec.stream.health import log_event
from sketchrec.stream.fleet.tracker import DeltaTracker
from sketchrec.stream.service import LearningService

POLL_CHUNKS = 8    # sync-sized chunks per input poll, at most
FEED_WAIT_MS = 1   # among others: after a publish, wait this long for their deltas in flight


class FleetLearner(KafkaLearner):
    """One member of a fleet (see the module docstring). ``service`` comes from ``open_replica``."""

    dp_batch: int | None = None   # ratings per noisy step of a DP fleet's model (set at start)
    budget: Budget = BUDGET       # the model kind's drift budget (pace.budget, set at start)

    def __init__(self, service: LearningService, bootstrap: str, topic: str, group: str,
                 model_topic: str, sync_ms: float = 200.0, snapshot_seconds: float = 60.0,
                 sync_ratings: int | None = None, max_poll_records: int = 20_000, **kw):
        self.state: FleetState = service.fleet
        self.tracker: DeltaTracker = service.tracker
        self.outages = Outages(service.health)   # steps failing while the broker is stalled or gone
        self.model_topic = model_topic
        self.snapshot_topic = snapshots.snapshot_topic(model_topic)
        self.feed = ModelFeed(bootstrap, model_topic, self.state, self.tracker.apply,
                              service.follow_origin, native=True)
        self.feed.catch_up()
        self.model_producer = model_producer(bootstrap)
        self.published: dict[str, int] = {}   # partition -> offset the model topic covers to
        self.errors, self.skipped_since = ErrorStats(), Counter()
        self.seq, self.bytes_published, self.inflight = 0, 0, []
        self.snapshot_seconds, self.last_snapshot = snapshot_seconds, time.monotonic()
        self.by_size = sync_ratings is None   # the interval follows the fleet's size (_pace)
        sync_ratings = sync_ratings or SYNC_RATINGS
        self.sync_ratings = self.chunk_ratings = sync_ratings
        self.alone, self.hot = False, HotItems(service.recommender, self.tracker, service.fleet.dp is not None)
        self.dp_batch = noisy_batch(service.recommender.model, service.fleet.dp)   # whole noisy steps
        self.budget = budget(type(service.recommender.model).__name__)
        self.per_message: float | None = None   # ratings per input message, as measured
        self.max_poll = max_poll_records
        self.fenced: Exception | None = None
        self.refusal: str | None = None   # why this member stopped learning a topic (one line)
        self.own, self.first_at, self.last_at = 0, None, None   # this member's learning (figures)
        self.progress: list[tuple[float, int]] = []   # (time, own) every 50 ms or so (figures)
        # large polls (a small one waits on a fetch round trip); learn_poll cuts them into sync-sized
        # chunks and publishes between chunks
        super().__init__(service, bootstrap, topic, group, checkpoint_every=sync_ratings,
                         checkpoint_seconds=sync_ms / 1000.0, max_poll_records=max_poll_records,
                         sink=TopicSnapshots(service, self.feed, self.model_producer,
                                             self.snapshot_topic), **kw)
        # local positions, not the fleet's (those are service.offsets)
        self.book = OffsetBook({}, sync_ratings, sync_ms / 1000.0)

    # --- where state goes ------------------------------------------------------------------------
    def tally(self, skipped, predictions=None, truth=None) -> None:
        if predictions is not None:
            self.errors.add(*finite_errors(predictions, truth))
        self.skipped_since.update(skipped)
        self.dead_letters.update(skipped)

    def resume_partitions(self, tps) -> None:
        """Partitions given to this member: claim them on the model topic and read it through
        the claim (from there on, no other member's delta covering them counts), then resume each
        partition after the last accepted delta covering it."""
        if not tps:
            return
        try:
            self.feed.read_through(self._claim(tps))
        except Exception as exc:  # noqa: BLE001 - (a callback's error would only be logged)
            # without the model topic through the claim, where to resume is unknown: learn nothing
            self.consumer.pause(*tps)
            self._fence(f"cannot claim partitions on the model topic ({type(exc).__name__}: {exc})")
            return
        fresh = [tp for tp in tps if str(tp.partition) not in self.state.covered]
        starts = self.feed.beginning_offsets(fresh) if fresh else {}
        for tp in tps:
            p = str(tp.partition)
            at = self.state.covered.get(p, starts.get(tp))
            self.consumer.seek(tp, at)
            self.book.offsets[p] = self.published[p] = at

    def learn_poll(self, records: dict) -> None:
        """Learn a poll's messages in chunks of about ``sync_ratings`` ratings, publishing a delta
        when one is due and adding the other members' deltas between chunks: replicas drift apart
        the more each learns alone between syncs, whatever the poll size. Each chunk's offsets are
        stored as it is learned, so a stop between chunks publishes exactly what was learned."""
        if self.first_at is None:
            self.first_at = time.time()
            self.progress.append((self.first_at, 0))
        self._pace()
        for chunk in self._chunks(records):
            if self.fenced is not None or self.stop.is_set():
                return  # the rest is consumed again by whoever resumes from the published offsets
            if self.refusal is None and not (self._keyed_by_user(chunk) and self._ids_keyed_for(chunk)):
                self.stop.set()   # nothing of the chunk learned: a fleet of this topic is refused
                log_event("refused", logging.ERROR, error=self.refusal)
                return
            before, counted = self.book.pending, self.whole.counted if self.whole else 0
            super().learn_poll(chunk)
            learned = self.book.pending - before
            self.own += learned
            messages = sum(len(batch) for batch in chunk.values())
            read = self.whole.counted - counted if self.whole else learned   # DP: some held back
            if read:   # (held messages learned at a pause were read before)
                self.per_message = max(1.0, read / messages)
            self.last_at = time.time()
            if self.last_at - self.progress[-1][0] >= 0.05:
                self.progress.append((self.last_at, self.own))
            read = None
            if self.book.expired():
                # the take's refresh of the held slots: by an apply now, else in after_poll
                self.checkpoint("interval", refresh=False)
                if not self.alone:  # a slot for the model topic's fetches (big polls never wait)
                    read = self._read_feed(FEED_WAIT_MS)
            self.after_poll(read)
        # a poll of at most POLL_CHUNKS chunks: big enough that most polls find fetched data,
        # small enough to stay far within the group's max poll interval on a loaded machine
        self.consumer.config["max_poll_records"] = min(self.max_poll, POLL_CHUNKS * self._chunk_messages())

    def _keyed_by_user(self, chunk: dict) -> bool:
        """At the user unit, whether every message of ``chunk`` is keyed by the user of each of
        its ratings (as `sketchrec produce` keys them): only then are a user's ratings all in one
        partition, learned by one member at a time, and the passes composed in parallel over
        partitions are over disjoint users. Otherwise ``refusal`` says so in one line."""
        if (self.state.dp or {}).get("unit") != "user":
            return True
        from sketchrec.stream.kafka.messages import parse_message
        for tp, messages in chunk.items():
            for msg in messages:
                key = msg.key.decode("utf-8", "replace") if msg.key is not None else None
                users = {str(r[0]) for r in parse_message(msg.value).ratings}
                if users and users != {key}:
                    self.refusal = (
                        f"user-level DP in a fleet needs a topic keyed by user (every rating of a "
                        f"user in one partition); partition {tp.partition} offset {msg.offset} is "
                        f"keyed {key!r}, its ratings' users differ; produce the topic with "
                        "`sketchrec produce` (keyed by user), or use --dp-unit rating")
                    return False
        return True

    def _ids_keyed_for(self, chunk: dict) -> bool:
        """Whether ``chunk``'s perturbed messages (an LDP header) meet a model keying ids, as one
        learner keys them on its first one: a fleet keys ids in its first snapshot (--ldp-debias),
        never one member alone (its own key would orphan the others' learning). Otherwise
        ``refusal`` says so in one line: nothing is learned under the public hash and an LDP claim."""
        from sketchrec.privacy.keys import id_keys_of
        from sketchrec.privacy.ldp import HEADER as LDP
        if id_keys_of(self.service.recommender.model).keyed:
            return True
        for tp, messages in chunk.items():
            for msg in messages:
                if any(name == LDP for name, _ in msg.headers or ()):
                    self.refusal = (
                        f"partition {tp.partition} offset {msg.offset} came perturbed on the device "
                        "(a sketchrec-ldp header), and this fleet's ids use the public hash; a "
                        "local-DP topic is learned by a fleet started with --ldp-debias (a new "
                        "--model-topic)")
                    return False
        return True

    def _chunks(self, records: dict):
        """Sub-polls of ``records`` (partition -> messages, in order) of about ``sync_ratings``
        ratings each, by the ratings per message measured so far (the first chunk is 1 message)."""
        chunk, room = {}, self._chunk_messages()
        for tp, messages in records.items():
            at = 0
            while at < len(messages):
                part = messages[at:at + room]
                chunk[tp], at, room = part, at + len(part), room - len(part)
                if room == 0:
                    yield chunk
                    chunk, room = {}, self._chunk_messages()
        if chunk:
            yield chunk

    def _chunk_messages(self) -> int:   # whole messages reaching the interval (fewer: a take every other chunk)
        if self.per_message is None:
            return 1
        return max(1, int(-(-self.chunk_ratings // self.per_message)))

    def _pace(self) -> None:
        """``sync_ratings`` bounds how far learners drift apart (each learns from a replica
        lacking the others' latest deltas). A member holding every partition of the topic is
        the group's only learner (a zombie's deltas are refused): nothing drifts, so it publishes
        every ALONE x sync_ratings ratings or ``sync_ms``, whichever comes first, and saves most
        takes. Otherwise, by default, every ``sync_interval(M)`` ratings, M as this member's share
        of the partitions suggests (re-read at every poll), or every ``sync_ratings`` given;
        either shortened where hot items need it (pace: no interval is safe on every stream)."""
        partitions = self.consumer.partitions_for_topic(self.topic) or set()
        held = {tp.partition for tp in self.consumer.assignment()}
        self.alone = bool(partitions) and partitions <= held
        every = base = self.sync_ratings
        members = -(-len(partitions) // len(held)) if held and not self.alone else 1
        if self.alone:
            every = base = every * ALONE
        elif held:
            if self.by_size:
                base = max(every, sync_interval(members, self.dp_batch, self.budget))
            every = self.hot.bound(base, members)
        # the held slots' full refresh follows the interval, not a hot item's shortening of it
        self.tracker.refresh_every(full_refresh_ratings(base, members))
        # composed moves: this member's share of the ratings is about its share of the partitions.
        # Never a DP fleet's: a scale set from raw per-item counts is no post-processing of noised steps
        composed = held and not self.alone and self.dp_batch is None   # dp_batch: a DP fleet's
        self.tracker.fleet_size(len(partitions) / len(held) if composed else 1)
        self.chunk_ratings = self.book.every = every

    def checkpoint(self, why: str, blocking_commit: bool = True, refresh: bool = True) -> bool:
        """Publish what was learned since the last publish. Before giving partitions up (and
        for a snapshot, and at the end) wait until the broker acknowledged every delta. A
        fenced member publishes nothing more (it would be refused). ``refresh=False``: leave the
        held slots as the take left them, to the caller's next apply or ``after_poll``."""
        if self.fenced is not None:
            return False
        try:
            self._publish()
            if refresh:
                self.tracker.ready()   # what this replica serves: refreshed held slots
            self._settle_inflight()
        except Exception as exc:  # noqa: BLE001 - a delta not delivered: this replica diverged
            self._fence(f"a delta could not be published ({type(exc).__name__}: {exc}); this "
                        "replica holds learning the fleet does not: restart it")
            return False
        self.book.checkpointed()   # published: what the book counted is in flight
        if why == "interval":
            return True
        try:   # acknowledged before partitions are given up, a snapshot, or the end
            self.producer.flush(timeout=30)  # dead letters
            self.model_producer.flush(timeout=60)
        except Exception as exc:  # noqa: BLE001 - not acknowledged yet (a stalled broker): still in
            # flight and retried by the producer; a delta it finally fails to deliver fences
            self.outages.failed("publish", exc, wait=False)
            return False
        self.outages.ok("publish")
        return self._settled()

    def _settled(self) -> bool:
        try:
            self._settle_inflight()
        except Exception as exc:  # noqa: BLE001 - see checkpoint()
            self._fence(f"a delta could not be published ({type(exc).__name__}: {exc})")
            return False
        return True

    def _publish(self) -> None:
        covers = {int(p): (self.published[p], at) for p, at in self.book.offsets.items()
                  if at != self.published.get(p)}
        blob = self.tracker.take()
        if not (covers or blob):
            return
        meta = encode_meta(self.state.member, self.seq, covers, self.errors, self.skipped_since,
                           origin=self.service.take_origin(), view=self.state.view())
        # an idempotent producer (model_producer): the topic holds the deltas in this order
        self.inflight.append(self.model_producer.send(
            self.model_topic, value=blob or b"", key=self.state.member.encode(), partition=0,
            headers=[(HEADER, meta)]))
        self.seq += 1
        self.bytes_published += len(blob or b"")
        self.published.update({str(p): end for p, (_, end) in covers.items()})
        self.errors, self.skipped_since = ErrorStats(), Counter()

    def _claim(self, tps) -> int:
        """Publish a claim of ``tps`` (after this member's pending deltas); its model offset."""
        meta = encode_meta(self.state.member, self.seq, {}, ErrorStats(), Counter(),
                           claims=sorted(tp.partition for tp in tps), view=self.state.view())
        future = self.model_producer.send(self.model_topic, value=b"", key=self.state.member.encode(),
                                          partition=0, headers=[(HEADER, meta)])
        self.seq += 1
        return future.get(timeout=60).offset

    def _settle_inflight(self) -> None:
        """Drop acknowledged deltas; raise the error of one that failed (kafka-python retries
        until its delivery timeout first)."""
        while self.inflight and self.inflight[0].is_done:
            future = self.inflight.pop(0)
            if future.failed():
                raise future.exception

    def _read_feed(self, timeout_ms: int) -> int:
        """Add the other members' deltas that have arrived (their number); fenced if this
        member's own delta was refused."""
        try:
            read = self.feed.poll(timeout_ms)
        except Fenced as exc:
            self._fence(str(exc))
            return 0
        except Exception as exc:  # noqa: BLE001 - a stalled broker: read again after the back-off
            self.outages.failed("model topic read", exc)
            return 0
        self.outages.ok("model topic read")
        return read

    def _fence(self, why: str) -> None:
        self.fenced = Fenced(why)
        self.stop.set()
        log_event("fenced", logging.ERROR, error=why)

    def after_poll(self, read: int | None = None) -> None:
        """After each poll (or chunk): add the other members' deltas (unless ``read``, the number
        just read: a second poll right after it would find little and cost a fetch round); the
        holder of partition 0 snapshots."""
        if read is None:
            read = self._read_feed(0)
        if self.fenced is not None:
            return
        self.tracker.ready()   # a take's deferred refresh, unless an apply did it
        try:
            if read == 0 and (self.last_at is None or time.time() - self.last_at > 0.2):
                self.tracker.settle()   # idle: the popular list as every settled replica has it
            self._settle_inflight()
        except Exception as exc:  # noqa: BLE001 - a delta that failed: see checkpoint()
            self._fence(f"a delta could not be published ({type(exc).__name__}: {exc})")
            return
        if (time.monotonic() - self.last_snapshot >= self.snapshot_seconds
                and any(tp.partition == 0 for tp in self.consumer.assignment())):
            self.snapshot()

    def snapshot(self) -> int | None:
        """Publish, read the model topic back to its end (this replica is then exactly the
        accepted deltas up to there), and write a snapshot. Its manifest's offset, or None."""
        self.last_snapshot = time.monotonic()
        if not self.checkpoint("snapshot"):
            return None
        try:
            written = self.write_state("snapshot")   # through the sink: TopicSnapshots
        except Fenced as exc:
            self._fence(str(exc))
            return None
        except Exception as exc:  # noqa: BLE001 - a stalled broker: the next interval tries again
            # (a snapshot half written has no manifest: readers ignore it)
            self.outages.failed("snapshot", exc)
            return None
        self.outages.ok("snapshot")
        return written.extra["offset"]

    def run(self, idle_exit: float | None = None) -> None:
        """As ``KafkaLearner.run``; at the end, the model topic is read to its end, so that this
        replica holds every delta published before it stopped."""
        try:
            super().run(idle_exit)
        finally:
            self.model_producer.close(timeout=10)
        try:
            if self.fenced is None:
                self.feed.catch_up()
                self.tracker.settle()
        except Fenced as exc:
            self.fenced = exc
        except Exception as exc:  # noqa: BLE001 - the broker is gone at the end: what was read stays
            self.outages.failed("final model topic read", exc, wait=False)
        finally:
            self.feed.close()
