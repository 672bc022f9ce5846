"""Whether this replica reads the model topic as the others do, checked as it reads.

Every replica decides each record of the model topic alike (taken, refused, or passed over: not a
delta, or a retry's copy), so the sequence of those verdicts is the same on every replica, and
so is the fleet state it leaves (``model_topic.FleetState``). ``Views`` chains them: its digest
at position P hashes the verdicts on every record before P. A member's delta carries the digest
at the position it had read to when it published (``view`` in its header); a replica reading
the delta compares it with its own at that position.

A replica that read the topic otherwise (a record skipped; a snapshot written by a replica that
had) would otherwise judge later deltas on another coverage than the others, silently and for
good. Here it finds the deltas of every other member disagreeing with it: once ``DISAGREEING``
distinct members disagree and none agrees among the last ``RECENT`` records read, it is the
one that diverged (``Diverged``: a member is fenced and rebuilt from the newest snapshot, a
serving replica rebuilt). A single member disagreeing (in a fleet of two, either side's view
of the other) is logged, not acted on: one witness cannot say which of the two read wrong; but
while any member disagrees, this replica writes no snapshot (``disputed``).

Snapshots carry the digest at their position (``chain``); a replica restored from one written
before digests existed (no ``chain``) neither checks nor publishes them.

>>> a, b = Views(0, ""), Views(0, "")
>>> for offset, verdict in [(0, "a"), (1, "r"), (2, "a")]:
...     a.step(offset, verdict); b.step(offset, verdict)
>>> a.at(3) == b.at(3), a.at(1) == b.at(1)
(True, True)
>>> c = Views(0, "")
>>> c.step(0, "a"); c.step(2, "a")   # record 1 never read
>>> c.at(3) == a.at(3)
False
>>> [c.judge(member, a.at(3), 3 + n) for n, member in enumerate(["m1", "m2"])][-1][:40]
'this replica read the model topic otherw'
"""

from __future__ import annotations

import hashlib
import logging

from sketchrec.stream.fleet.model_topic import Fenced
from sketchrec.stream.health import log_event

WINDOW = 4096     # positions whose digest a replica keeps (a publisher's lags the end by a few)
RECENT = 256      # records read within which the members' agreement counts
DISAGREEING = 2   # distinct members disagreeing, none agreeing: this replica diverged


class Diverged(Fenced):
    """This replica's verdicts on the model topic differ from those of the other members: it is
    rebuilt from the newest snapshot and the topic (``replicas.rebuild``)."""


class Views:
    """The chained digest of this replica's verdicts on the model topic, kept for the last
    ``WINDOW`` positions, and the members' agreement with it (module docstring).

    Parameters
    ----------
    position : where this replica starts reading (a snapshot's position, or 0).
    chain : the digest at ``position`` (a snapshot's ``chain``; "" for the empty topic), or
        None when unknown: nothing is then kept, checked or published.
    """

    def __init__(self, position: int, chain: str | None):
        self.chain = chain
        self.kept: dict[int, str] = {} if chain is None else {position: chain}
        self.members: dict[str, tuple[int, bool]] = {}   # member -> (offset read at, agreed)
        self.told: set[str] = set()   # members whose disagreement was logged

    def step(self, offset: int, verdict: str) -> None:
        """The record at ``offset`` was decided: "a" taken, "r" refused, "n" passed over."""
        if self.chain is None:
            return
        self.chain = hashlib.blake2b(f"{self.chain}:{offset}:{verdict}".encode(), digest_size=8).hexdigest()
        self.kept[offset + 1] = self.chain
        if len(self.kept) > WINDOW:
            del self.kept[next(iter(self.kept))]   # the oldest (kept in insertion order)

    def at(self, position: int) -> list | None:
        """[position, digest] for a delta's header (None when the digest is unknown)."""
        digest = self.kept.get(position)
        return None if digest is None else [position, digest]

    def disputed(self, offset: int) -> bool:
        """Whether a member read within the last ``RECENT`` records before ``offset`` disagreed:
        this replica may be the one that diverged, so it writes no snapshot meanwhile (one would
        hand its reading on to every replica restored from it)."""
        return any(not ok for at, ok in self.members.values() if at > offset - RECENT)

    def judge(self, member: str, view, offset: int) -> str | None:
        """Compare ``member``'s ``view`` (its header's, read at ``offset``) with this replica's
        digest at that position; the reason this replica diverged, or None."""
        if not view or self.chain is None:
            return None
        mine = self.kept.get(int(view[0]))
        if mine is None:   # before this replica's start, or older than WINDOW
            return None
        agreed = mine == view[1]
        self.members[member] = (offset, agreed)
        if not agreed and member not in self.told:
            self.told.add(member)
            log_event("view_mismatch", logging.ERROR, member=member, position=int(view[0]), offset=offset,
                      note="that member and this replica decided some record of the model topic "
                           "differently; the one that differs from the rest is rebuilt")
        recent = [ok for at, ok in self.members.values() if at > offset - RECENT]
        if any(recent) or recent.count(False) < DISAGREEING:
            return None
        return (f"this replica read the model topic otherwise than {recent.count(False)} other "
                f"members (their digests at the positions they published from differ from its "
                f"own); it is rebuilt from the newest snapshot")
