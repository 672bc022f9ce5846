"""The model topic of a fleet: the ordered record of what every member has learned.

Format. One partition (``TOPIC.model`` by default), so every replica reads the same sequence.
A message is one member's delta since its previous one: the value is the delta blob of
``stream.serving.replica.DeltaTracker.take()`` (empty when the member only stepped over dead
letters), the key is the member's id, and the header ``sketchrec.delta`` holds JSON::

    {"v": 1, "member": "…", "seq": 7, "covers": {"3": [1200, 1750]}, "errors": {"n": …, "sq": …, "abs": …},
     "skipped": {"reason": count}, "claims": ["3"]}

(``claims`` only in a member's claim, see below; its value is empty.)

The privacy ledger of a DP fleet (``FleetState.dp`` set by the first snapshot: the model's unit,
delta and per-pass noise multiplier) is derived from this topic, so every replica reading it
reports the same epsilon and no restore can lower it (the topic is append-only; a snapshot holds
the state at its position and the topic after it is read again). Each input partition counts the
passes of DP-SGD over it (``passes``). The consumer group gives each rating to one member and the
claims make that exact, so the members' steps compose in parallel over disjoint data: the fleet's
epsilon is that of its most-passed partition, not a sum over members. A partition's first claim
starts its first pass; a delta refused for it (a zombie's learning, on the topic beside its new
owner's) adds one; at the user unit so does every claim by another member (the users' rating caps
are counted by the member that learned them, and a new owner starts them at zero). A kill -9
adds none: a DP member serves no endpoint of its own (the capability table), so what it learned
and did not publish was never released, and its successor's pass continues the same one.

``covers`` maps each input partition to the half-open offset range [from, to) whose ratings the
delta holds. The topic is thus the record of what has been learned, and a ``FleetState`` reading
it knows, per input partition, the offset after the last delta covering it (``covered``).

Acceptance (exactly once). A member given a partition first publishes a *claim* naming it and
reads the topic through its own claim; from the claim on, the partition's deltas count only from
that member (its owner). A delta is applied only if its member owns each partition it covers (or
the partition was never claimed) and each range starts exactly where the partition's coverage
ends (or the partition was never covered). Every replica reads the same order and applies the
same rule, so all agree on which deltas count, and no input offset is ever counted twice: a
member that lost its partitions without knowing it (evicted from the group on a stalled
heartbeat: a "zombie") and publishes late finds its delta refused everywhere once the new owner's
claim is in — including by itself, which then raises ``Fenced`` (its own replica holds the
refused learning; it must be rebuilt). A zombie delta written before the claim counts, and the
new owner, reading through its claim, resumes after it. A message a producer retry wrote twice
(same member, same ``seq``) is read once.

>>> state = FleetState(member="a")
>>> state.accepts({"covers": {"0": [0, 10]}}), state.covered
(True, {})
>>> state.settle({"member": "b", "seq": 0, "covers": {"0": [0, 10]}, "errors": {"n": 10, "sq": 5.0, "abs": 6.0}}, 0)
>>> state.covered, state.position, state.errors.n
({'0': 10}, 1, 10)
>>> state.accepts({"covers": {"0": [5, 12]}})   # overlaps what is covered: refused everywhere
False
>>> state.duplicate({"member": "b", "seq": 0})
True
>>> state.settle({"member": "c", "seq": 0, "covers": {}, "claims": ["0"]}, 1)   # c owns 0 now
>>> state.accepts({"member": "b", "covers": {"0": [10, 20]}}), state.accepts({"member": "c", "covers": {"0": [10, 20]}})
(False, True)
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from dataclasses import dataclass, field

from sketchrec.models.metrics import ErrorStats
from sketchrec.privacy.ldp import combine
from sketchrec.stream.health import log_event

HEADER = "sketchrec.delta"
VERSION = 1
MAX_MESSAGE_BYTES = 64 << 20   # the topic is created allowing messages this large
# a hole in the model topic is read past only once it has lasted GAP_PATIENCE_S and GAP_READS
# reads after that still lacked it (``ModelFeed._skipped``)
GAP_PATIENCE_S, GAP_READS = 10.0, 3
_now = time.monotonic   # (a test's clock)


class Fenced(RuntimeError):
    """This replica can no longer be kept exact and must be rebuilt: its member's own delta was
    refused (it learned offsets another member had covered), or ``Truncated``."""


class Truncated(Fenced):
    """The model topic no longer holds the next delta this replica must apply (retention deleted
    it): reading on from the topic's start would skip deltas, so the replica is rebuilt from a
    snapshot at or after the log's start (``replicas.rebuild``), or cannot be made exact.

    >>> str(Truncated("t.model", 7, 40))[:62]
    't.model no longer holds offset 7 (its log starts at 40: retent'
    """

    def __init__(self, topic: str, position: int, start: int):
        self.topic, self.position, self.start = topic, position, start
        why = ("retention deleted deltas this replica has not applied); rebuild it from a newer "
               "snapshot" if start > position else
               "past its end: the topic was deleted and made again since this replica's "
               "snapshot); rebuild it from a snapshot of the new topic if a member wrote one, "
               "else start a new fleet on another --model-topic")
        super().__init__(f"{topic} no longer holds offset {position} (its log starts at {start}: {why}")


def model_topic(topic: str, given: str | None = None) -> str:
    """The model topic of input ``topic`` (``TOPIC.model`` unless given)."""
    return given or f"{topic}.model"


def encode_meta(member: str, seq: int, covers: dict[int, tuple[int, int]], errors: ErrorStats,
                skipped: Counter, claims: list[int] = (), origin: dict | None = None) -> bytes:
    """The header of one delta message, or of a claim (see the module docstring); ``origin``:
    how many of its ratings came perturbed on the device or raw, and the local-DP mechanism
    their headers named (``LearningService.origin``)."""
    meta = {"v": VERSION, "member": member, "seq": seq,
            "covers": {str(p): [int(a), int(b)] for p, (a, b) in covers.items()},
            "errors": errors.to_dict(), "skipped": dict(skipped)}
    if claims:
        meta["claims"] = [str(p) for p in claims]
    if origin and (origin.get("perturbed_on_device") or origin.get("raw")):
        meta["origin"] = origin
    return json.dumps(meta, separators=(",", ":")).encode()


def decode_meta(headers) -> dict | None:
    """The delta header of a message, or None when it is not a delta message (no such header, or
    another version's); ValueError (one line) for a delta header that is not JSON or lacks what
    a delta's holds (every replica then refuses the message alike).

    >>> decode_meta([(HEADER, b'{"v": 1, "member": "a", "seq": 0, "covers": {"0": [0, 5]}}')])["covers"]
    {'0': [0, 5]}
    >>> decode_meta([(HEADER, b'{"v": 1, "member": "a", "seq": 0, "covers": [0, 5]}')])
    Traceback (most recent call last):
    ValueError: delta header: covers is not {partition: [from, to]}
    """
    for key, value in headers or []:
        if key == HEADER:
            try:
                meta = json.loads(value)
            except ValueError:
                raise ValueError("delta header: not JSON") from None
            if not isinstance(meta, dict) or meta.get("v") != VERSION:
                return None
            _check_meta(meta)
            return meta
    return None


def _check_meta(meta: dict) -> None:
    """ValueError unless ``meta`` holds the fields ``FleetState`` reads, of the types it reads."""
    covers = meta.get("covers")
    if not (isinstance(covers, dict) and all(
            isinstance(r, list) and len(r) == 2 and all(type(x) is int for x in r) for r in covers.values())):
        raise ValueError("delta header: covers is not {partition: [from, to]}")
    if type(meta.get("seq", 0)) is not int or not isinstance(meta.get("claims") or [], list):
        raise ValueError("delta header: seq or claims malformed")
    for name in ("errors", "skipped", "origin"):
        if not isinstance(meta.get(name) or {}, dict):
            raise ValueError(f"delta header: {name} is not an object")


@dataclass
class FleetState:
    """What a replica knows from the model topic: the next offset to read (``position``), the
    offset after the last accepted delta per input partition (``covered``, keys as text like
    checkpoint offsets), the member whose claim owns each partition (``owners``), and the fleet's
    prequential errors and skip counts (accepted deltas)."""

    member: str | None = None   # this process's id (None: a read-only replica)
    position: int = 0
    covered: dict = field(default_factory=dict)
    errors: ErrorStats = field(default_factory=ErrorStats)
    skipped: Counter = field(default_factory=Counter)
    refused: int = 0
    seen: dict = field(default_factory=dict)   # member -> the last seq read (retries are read once)
    owners: dict = field(default_factory=dict)  # partition -> the member of its newest claim
    dp: dict | None = None   # a DP fleet: {"unit", "delta", "multiplier"} of one pass (the ledger)
    passes: dict = field(default_factory=dict)   # partition -> DP-SGD passes over it
    charged: list = field(default_factory=list)  # "member/partition" of refused deltas charged
    # local DP: where the accepted deltas' ratings came from (summed over them, so every replica
    # reports the same counts and mechanism), and whether the fleet maps predictions back through
    # that mechanism (its first member's --ldp-debias, fixed in the first snapshot)
    origin: dict = field(default_factory=lambda: no_origin())
    ldp_debias: bool = False

    def duplicate(self, meta: dict) -> bool:
        return meta.get("seq", 0) <= self.seen.get(meta.get("member"), -1)

    def accepts(self, meta: dict) -> bool:
        member = meta.get("member")
        return all(self.covered.get(p, start) == start and self.owners.get(p, member) == member
                   for p, (start, _) in meta["covers"].items())

    def settle(self, meta: dict, offset: int) -> None:
        """Record an accepted delta read at ``offset``."""
        for p, (_, end) in meta["covers"].items():
            self.covered[p] = end
        for p in meta.get("claims") or ():
            self._charge_claim(p, meta.get("member"))
            self.owners[p] = meta.get("member")
        e = meta.get("errors") or {}
        self.errors.n += e.get("n", 0)
        self.errors.sq += e.get("sq", 0.0)
        self.errors.abs += e.get("abs", 0.0)
        self.skipped.update(meta.get("skipped") or {})
        origin = meta.get("origin") or {}
        for key in ("perturbed_on_device", "raw"):
            self.origin[key] += int(origin.get(key, 0))
        self.origin["mechanism"] = combine(self.origin["mechanism"], origin.get("mechanism"))
        self.seen[meta.get("member")] = meta.get("seq", 0)
        self.position = offset + 1

    def _charge_claim(self, p: str, member: str | None) -> None:
        """A DP fleet's claim of partition ``p``: its first starts a pass; at the user unit a
        claim by another member than its owner starts another (see the module docstring)."""
        if self.dp is None:
            return
        owner = self.owners.get(p)
        if p not in self.passes:
            self.passes[p] = 1
        elif self.dp["unit"] == "user" and owner not in (None, member):
            self.passes[p] += 1

    def refuse(self, meta: dict) -> None:
        """A refused delta: counted, and in a DP fleet one more pass over each partition it
        covers (once per member and partition: a zombie's refused deltas are one extra pass)."""
        self.refused += 1
        if self.dp is None:
            return
        for p in meta.get("covers") or {}:   # (none readable in a malformed header)
            tag = f"{meta.get('member')}/{p}"
            if tag not in self.charged:
                self.charged.append(tag)
                self.passes[p] = self.passes.get(p, 0) + 1

    def ledger(self):
        """The fleet's ``PrivacyLedger`` (None: not a DP fleet): one pass of the model's
        multiplier per pass over the most-passed partition (parallel composition)."""
        if self.dp is None:
            return None
        from sketchrec.privacy.accounting import GaussianSteps, PrivacyLedger
        worst = max(self.passes.values(), default=0)
        steps = [GaussianSteps(self.dp["multiplier"], 1.0, worst)] if worst else []
        return PrivacyLedger(self.dp["unit"], self.dp["delta"], steps=steps, relation="replace-one",
                             ledger_id="fleet")

    def to_dict(self) -> dict:
        return {"position": self.position, "covered": self.covered, "errors": self.errors.to_dict(),
                "skipped": dict(self.skipped), "seen": self.seen, "owners": self.owners,
                "dp": self.dp, "passes": self.passes, "charged": self.charged,
                "origin": self.origin, "ldp_debias": self.ldp_debias}

    @classmethod
    def from_dict(cls, d: dict, member: str | None = None) -> "FleetState":
        return cls(member, d["position"], dict(d["covered"]), ErrorStats.from_dict(d["errors"]),
                   Counter(d.get("skipped", {})), seen=dict(d.get("seen", {})),
                   owners=dict(d.get("owners", {})), dp=d.get("dp"),
                   passes=dict(d.get("passes", {})), charged=list(d.get("charged", [])),
                   origin={**no_origin(), **(d.get("origin") or {})},
                   ldp_debias=bool(d.get("ldp_debias", False)))


def no_origin() -> dict:
    """A ``LearningService.origin`` that has counted nothing."""
    return {"perturbed_on_device": 0, "raw": 0, "mechanism": None}


class ModelFeed:
    """Reads the model topic from ``state.position`` and applies accepted deltas through
    ``apply(blob)`` (``DeltaTracker.apply``); this member's own deltas are already in its replica
    and are only settled. ``poll()`` takes what has arrived; ``catch_up()`` reads to the end.
    ``native``: through librdkafka (``feed_reader.NativeReader``, a learning member: a poll is one
    C call), else kafka-python (``consumer`` is then the client a health probe reads)."""

    def __init__(self, bootstrap: str, topic: str, state: FleetState, apply, on_origin=None,
                 native: bool = False):
        from sketchrec.stream.fleet.feed_reader import NativeReader, PythonReader
        self.state, self.apply = state, apply
        self.on_origin = on_origin   # called after settling a delta that names its ratings' origin
        reader = NativeReader if native else PythonReader
        self.topic = topic
        self.reader = reader(bootstrap, topic, state.position, MAX_MESSAGE_BYTES)
        self.consumer = self.reader.consumer
        self.bytes_read = 0
        # a hole met at ``gap_at`` (the position a record past it was handed over at): since when,
        # and how many reads after GAP_PATIENCE_S still lacked it (_skipped)
        self.gap_at: int | None = None
        self.gap_since, self.gap_reads = 0.0, 0

    def poll(self, timeout_ms: int = 0) -> int:
        """Apply what has arrived; the number of messages read. Each record's outcome depends on
        the records before it only, never on where a fetch ended: a message that is not a good
        delta of this model is refused (``_take``), and whatever else a poll raises (the broker's
        errors, or an error not of the record's making while taking one) leaves the reader at
        ``state.position``, the message after the last one taken, so a retry skips nothing. A
        position the topic no longer holds raises ``Truncated`` (never read past: the readers
        refuse to move to the end). A record handed over past one not yet read sends the reader
        back for it (``_skipped``: at once the first time in a poll, then at the next polls,
        taking nothing past it meanwhile); one handed over again is passed over."""
        from sketchrec.stream.fleet.feed_reader import OutOfRange
        n, again, retried = 0, True, False
        try:
            while again:   # again at once from a record the reader skipped (_skipped)
                again = False
                for msg in self.reader.poll(timeout_ms):
                    if msg.offset < self.state.position:   # handed over again: taken already
                        continue
                    if msg.offset > self.state.position and self._skipped(msg.offset):
                        again, retried = not retried, True
                        break
                    self._take(msg)
                    n += 1
        except OutOfRange:
            self.reader.seek(self.state.position)
            raise Truncated(self.topic, self.state.position,
                            self.reader.beginning(self.topic, 0)) from None
        except Exception:
            # the reader has moved past every record the fetch handed over, taken or not
            self.reader.seek(self.state.position)
            raise
        return n

    def _skipped(self, offset: int) -> bool:
        """Whether the reader handed over a record past ``state.position`` with the ones between
        missing, and is sent back to read them. The model topic holds no gap of its own (one
        partition, idempotent producers, no transactions), but a broker may hand over the records
        after one whose write it has not finished (Tansu moves a partition's end before it stores
        the batch, so members publishing at once can see the later batch first). A replica that
        took the record after the missing one would judge every later delta on another coverage
        than the others, for good, and hand that on in its snapshots. So a hole is read past only
        once it has lasted ``GAP_PATIENCE_S`` and ``GAP_READS`` reads since (a write the broker
        lost after moving the end)."""
        position, now = self.state.position, _now()
        if self.gap_at != position:
            self.gap_at, self.gap_since, self.gap_reads = position, now, 0
        elif now - self.gap_since >= GAP_PATIENCE_S:
            self.gap_reads += 1
            if self.gap_reads >= GAP_READS:
                log_event("model_topic_gap", logging.WARNING, position=position, offset=offset,
                          waited_s=round(now - self.gap_since, 1),
                          note="no record between them for that long: read past")
                return False
        self.reader.seek(position)
        return True

    def catch_up(self, timeout: float = 60.0) -> None:
        """Read until the end of the topic as it is now."""
        self.read_through(self.reader.end_offset() - 1, timeout)

    def beginning_offsets(self, tps) -> dict:
        """The first offset of each of ``tps`` (kafka-python ``TopicPartition`` objects of the input
        topic), asked through this reader's own client (not the input consumer, whose rebalance
        callback asks)."""
        return {tp: self.reader.beginning(tp.topic, tp.partition) for tp in tps}

    def read_through(self, offset: int, timeout: float = 60.0) -> None:
        """Read until the message at ``offset`` is read (e.g. one this member has just written)."""
        deadline = time.monotonic() + timeout
        while self.state.position <= offset:
            if time.monotonic() > deadline:
                raise TimeoutError(f"model topic: at {self.state.position}, waiting for {offset}")
            self.poll(200)

    def _take(self, msg) -> None:
        try:
            meta = decode_meta(msg.headers)
        except ValueError as exc:
            self._refuse(msg, {}, str(exc))
            return
        if meta is None or self.state.duplicate(meta):  # not a delta, or a retry's copy
            self.state.position = msg.offset + 1
            return
        mine = meta.get("member") == self.state.member
        if not self.state.accepts(meta):
            self._refuse(msg, meta, "its offsets do not continue its partitions' coverage by their owner")
            if mine:
                raise Fenced(f"this member's delta at model offset {msg.offset} covers offsets "
                             "another member had already covered; its replica must be rebuilt")
            return
        if not mine and msg.value:
            try:
                self.apply(msg.value)
            except ValueError as exc:
                # not a delta of this model, or applied already: the same verdict at every replica
                # (they share the first snapshot's model). A member's own delta is its model's,
                # so it is settled unread (it is in its replica already)
                self._refuse(msg, meta, str(exc))
                return
        self.bytes_read += len(msg.value or b"")
        self.state.settle(meta, msg.offset)
        if meta.get("origin") and self.on_origin is not None:
            self.on_origin()

    def _refuse(self, msg, meta: dict, why: str) -> None:
        """A message that counts nowhere: one line, counted (``state.refuse``), read past."""
        self.state.refuse(meta)
        self.state.position = msg.offset + 1
        log_event("delta_refused", logging.WARNING, offset=msg.offset, member=meta.get("member"),
                  covers=json.dumps(meta.get("covers"), separators=(",", ":")), why=why)

    def close(self) -> None:
        self.reader.close()
