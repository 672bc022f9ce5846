"""The model topic of a fleet: the ordered record of what every member has learned.

Format. One partition (``TOPIC.model`` by default), so every replica reads the same sequence.
A message is one member's delta since its previous one: the value is the delta blob of
``stream.serving.replica.DeltaTracker.take()`` (empty when the member only stepped over dead
letters), the key is the member's id, and the header ``sketchrec.delta`` holds JSON::

    {"v": 1, "member": "…", "seq": 7, "covers": {"3": [1200, 1750]}, "errors": {"n": …, "sq": …, "abs": …},
     "skipped": {"reason": count}, "claims": ["3"], "view": [412, "9f…"]}

(``claims`` only in a member's claim, see below; its value is empty. ``view``: the member's digest
of its verdicts on the records before the position it had read to, checked by every reader:
``views``.)

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
from collections import Counter
from dataclasses import InitVar, dataclass, field

from sketchrec.models.metrics import ErrorStats
from sketchrec.privacy.ldp import combine

HEADER = "sketchrec.delta"
VERSION = 1
MAX_MESSAGE_BYTES = 64 << 20   # the topic is created allowing messages this large


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
                skipped: Counter, claims: list[int] = (), origin: dict | None = None,
                view: list | None = None) -> bytes:
    """The header of one delta message, or of a claim (see the module docstring); ``origin``:
    how many of its ratings came perturbed on the device or raw, and the local-DP mechanism
    their headers named (``LearningService.origin``); ``view``: the member's [position, digest]
    (``FleetState.view``, checked by every reader: ``views``)."""
    meta = {"v": VERSION, "member": member, "seq": seq,
            "covers": {str(p): [int(a), int(b)] for p, (a, b) in covers.items()},
            "errors": errors.to_dict(), "skipped": dict(skipped)}
    if claims:
        meta["claims"] = [str(p) for p in claims]
    if origin and (origin.get("perturbed_on_device") or origin.get("raw")):
        meta["origin"] = origin
    if view:
        meta["view"] = view
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
    view = meta.get("view")
    if view is not None and not (isinstance(view, list) and len(view) == 2 and type(view[0]) is int
                                 and isinstance(view[1], str)):
        raise ValueError("delta header: view is not [position, digest]")
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
    # the chained digest of this replica's verdicts at ``position`` (None: unknown), kept from
    # then on by ``views`` (``views.chain``)
    chain: InitVar[str | None] = ""

    def __post_init__(self, chain: str | None):
        from sketchrec.stream.fleet.views import Views   # (it imports this module's Fenced)
        self.views = Views(self.position, chain)

    def passed(self, offset: int, verdict: str) -> None:
        """The record at ``offset`` was decided: taken ("a", by ``settle``), refused ("r") or
        passed over ("n"); the next position, and the verdict chained (``views``)."""
        self.position = offset + 1
        self.views.step(offset, verdict)

    def view(self) -> list | None:
        """[position, digest] for this replica's next header (``views``)."""
        return self.views.at(self.position)

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
        self.passed(offset, "a")

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
                "origin": self.origin, "ldp_debias": self.ldp_debias, "chain": self.views.chain}

    @classmethod
    def from_dict(cls, d: dict, member: str | None = None) -> "FleetState":
        return cls(member, d["position"], dict(d["covered"]), ErrorStats.from_dict(d["errors"]),
                   Counter(d.get("skipped", {})), seen=dict(d.get("seen", {})),
                   owners=dict(d.get("owners", {})), dp=d.get("dp"),
                   passes=dict(d.get("passes", {})), charged=list(d.get("charged", [])),
                   origin={**no_origin(), **(d.get("origin") or {})},
                   ldp_debias=bool(d.get("ldp_debias", False)), chain=d.get("chain"))


def no_origin() -> dict:
    """A ``LearningService.origin`` that has counted nothing."""
    return {"perturbed_on_device": 0, "raw": 0, "mechanism": None}
