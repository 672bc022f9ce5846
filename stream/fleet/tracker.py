"""Replicas of one recommender: a member of a fleet publishes what it learned as a compact
delta and adds every other member's deltas to its own replica.

>>> from sketchrec.models import SketchMF
>>> from sketchrec.stream.recommender import Recommender
>>> def member():
...     return Recommender(SketchMF(dim=4, width=512), pair_capacity=1000, user_capacity=100)
>>> a, b = member(), member()
>>> ta, tb = DeltaTracker(a), DeltaTracker(b)
>>> _ = a.learn_many(["ann", "bob"], ["film", "book"], [4.0, 2.0])
>>> _ = b.learn_many(["cat"], ["film"], [5.0])
>>> da, db = ta.take(), tb.take()
>>> _ = ta.apply(db), tb.apply(da)
>>> a.model.n_learned == b.model.n_learned == 3, ta.state_digest() == tb.state_digest()
(True, True)
>>> ta.take() is None                 # what was applied is not published again
True

What a delta covers (``take``: everything changed locally since the last take; ``apply``: adds
another member's):

- the model (``model_replicas.replica_for``: a sketch's ``deltas.ModelReplica``, a combination's
  members side by side): vector and bias cells, heavy-hitter slots per id, and the other arrays
  of its ``state_arrays()`` (rating count/sum/range, counters, DP steps, AdaGrad sums, a
  combination's loss sums);
- the serving structures, as the keys learned since the last take: distinct (user, item) pair keys
  and user keys (the receiver adds them to its Bloom filters: the same bits as an OR of the
  filters), item keys with their counts (added to the popularity count-min sketch: the same cells
  as a sum of the sketches, which are not conservative);
- the item catalogue: ids first seen since the last take (merged by union); the popular-items
  list is then re-ranked from the catalogue by the merged count-min (deterministic: count, then
  key), so replicas with equal sketches and catalogues list the same items. The re-rank costs
  O(catalogue): ``take`` and ``apply`` do it at most every ``RERANK_S`` CPU-seconds, and ``settle``
  does what is left (a fleet member when idle, a serving replica when it has read the model
  topic to its end, and ``state_digest``).

Guarantees. Replicas that applied the same deltas, in any order, hold the same counters and
serving structures exactly (integer sums, OR, union), the same ids in heavy slots, and the same
model up to float rounding: cells are float32 sums taken in another order, so predictions agree
to ~1e-7 (ML-100k, 3 members + a serving replica: 1.2e-7 on 1,000 pairs), bit-identical where
the order was the same. "Applied the same deltas" includes each member's own last ``take``: a
learner's replica runs ahead of what it published by what it learned since. A delta must be
applied once: each carries its member's id and a sequence number, and ``apply`` refuses one
whose sequence number it has already passed for that member, or its own (ValueError); deltas of
one member must therefore be applied in the order they were taken (one Kafka partition per
member's deltas, or one partition for all, keeps that). The catalogue is a union only while
it has room: a full one (``stream.catalogue``, at most the model's size by default) compacts to
its most counted ids when it fills, which happens at another moment on each replica, so full
catalogues may keep different ids (each still gets every id a member first learned: ``take``
publishes them whatever a compaction renumbered).

Operation. ``take`` and ``apply`` change the model: call them between learned batches (the
learning thread, or with ``recommender.learning`` cleared), never while ``learn_many`` runs;
readers may go on as they do during learning. A snapshot is the recommender's state right after
a ``take`` (nothing unpublished) plus ``seq`` and ``applied``; a tracker made on the restored
recommender takes it as published. Making a tracker turns the model's heavy filter to fleet mode
(``models.fleet_slots``: frozen counts, one-way; a plain learner's results are unchanged as long
as no tracker is made). Costs: ``take`` compares only the cells addressed by the
ids learned outside a heavy slot and the slots of the ids learned in one (seen through
``recommender.observers``, which only record each batch; the ids are sorted by slot when
membership is about to change; a batch's ids are counted for announcements before it is learned,
``recommender.before_batch``, and the due ones admitted then), in one compiled
pass, or every cell in one branch-free pass once the rows learned since the last take address
as many cells as the model has (float32; a take of a few thousand ratings of a small catalogue
moves most of them);
``apply`` the delta's size. The held slots' rows (``models.fleet_slots``: depth x light_dim
hashed reads each, one compiled pass) move with the residuals an apply adds to them, at once,
and are all refreshed every ``refresh_every`` ratings learned or applied (a member's: from its
sync interval, ``pace.full_refresh_ratings``), and at least ``deltas.REFRESH_SLOT_RATINGS`` per
held slot (the refresh's cost grows with the model, so must its period), at
``settle`` (so before a digest or snapshot) and at ``ready(full=True)``; in between a held id's
row lags only what collisions moved in its cells (a fleet member calls ``ready`` when it polls
and before it learns); both, at most every ``RERANK_S``, re-rank the popular list over the catalogue
(O(items)). What a take and an apply cost per rating against learning, and the delta bytes per
rating: ``sketchrec bench fleet --breakdown`` (docs/scaling.md; figures in docs/results.md).

The bytes of a delta: ``envelope`` (format, versions, compression).
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid

import numpy as np

from sketchrec.stream.fleet.delta_codec import distinct
from sketchrec.stream.fleet.envelope import decode, encode
from sketchrec.stream.fleet.model_replicas import replica_for
from sketchrec.sketches import HeavyHitters
from sketchrec.sketches.hashing import as_keys, pair_keys

# take/apply re-rank the popular list at most once per RERANK_S CPU-seconds of this process (see
# settle): a wall-clock period made the re-ranks' share of a member's CPU grow with the machine's
# load (a member given a quarter of a core re-ranked four times as often per rating)
RERANK_S = 0.5


class DeltaTracker:
    """Publishes a recommender's local learning as deltas and applies other members' deltas.

    ``member`` names this replica in its deltas (default: a random id); the current state counts
    as published when the tracker is made. ``compress``: "zstd" (default, zlib if zstandard is
    missing), "zlib" or "none". ``admit_after``: sightings in this member's stream after which it
    announces an id for a heavy slot (``models.fleet_slots``). ``precision``: of the published
    cell and slot changes, "float32" or "float16" (see ``models.replica.ModelReplica``)."""

    def __init__(self, recommender, member: str | None = None, compress: str = "zstd",
                 admit_after: int = 8, precision: str = "float32"):
        if compress not in ("zstd", "zlib", "none"):
            raise ValueError("compress must be zstd, zlib or none")
        self.rec = recommender
        self.member = member or uuid.uuid4().hex[:12]
        self.compress = compress
        self.seq = 0                         # deltas taken so far
        self.applied: dict[str, int] = {}    # member -> last sequence number applied
        if recommender.popularity.sketch.conservative:
            raise ValueError("replicas need a plain count-min sketch (conservative updates do not add)")
        self._model = replica_for(recommender.model, admit_after, precision, tracked=True,
                                  deferred=True)
        self._params = _params_digest(recommender.model)
        self._seen: list[tuple[np.ndarray, np.ndarray]] = []   # keys learned since the last take
        recommender.catalogue.take_new()   # the items so far count as published
        self._rerank, self._reranked_at = False, 0.0    # popular list: counts moved since / when
        recommender.popularity = _Counted.of(recommender.popularity)
        recommender.observers.append(self._observe)
        recommender.before_learning.append(self.ready)   # held slots' rows up to date
        recommender.before_batch.append(self._ahead)

    def _ahead(self, ukeys: np.ndarray, ikeys: np.ndarray, real) -> None:
        """A batch about to be learned: its real rows' ids are counted for heavy slots now, and
        those that become due are admitted before it (``ModelReplica.ahead``): a user's ratings
        mostly come together, and counted after the batch (announced at the next take) they
        would all be learned in hashed cells first."""
        self._model.ahead(ukeys[real], ikeys[real])

    def _observe(self, ukeys: np.ndarray, ikeys: np.ndarray, real) -> None:
        """A learned batch: every row moved the model, the real ones (no canaries) also serve."""
        ukeys, ikeys = ukeys.copy(), ikeys.copy()   # kept until the next take
        self._model.touched(ukeys, ikeys)
        self._seen.append((ukeys[real], ikeys[real]))

    # --- publish ------------------------------------------------------------------------------------
    def take(self, meta: dict | None = None) -> bytes | None:
        """Everything learned locally since the last take, encoded (None if nothing); ``meta``
        (JSON-able, e.g. the input offsets the delta covers) travels in its header."""
        rec = self.rec
        arrays = self._model.take()
        if self._seen:
            ukeys, ikeys = (np.concatenate(keys) for keys in zip(*self._seen))
            self._seen = []
            items, counts = np.unique(ikeys, return_counts=True)
            arrays.update({"seen_pairs": distinct(pair_keys(ukeys, ikeys)),
                           "seen_users": distinct(ukeys), "seen_items": items,
                           "seen_counts": counts.astype(np.uint32)})
        new_ids = rec.catalogue.take_new()   # first learned here since the last take
        if not arrays and not new_ids:
            return None
        header = {"member": self.member, "seq": self.seq + 1, "params": self._params,
                  "items": new_ids, "meta": meta}
        self.seq += 1
        if "seen_items" in arrays:
            self._popular_moved()
        return encode(header, arrays, self.compress)

    # --- receive ------------------------------------------------------------------------------------
    def apply(self, blob: bytes) -> dict:
        """Add another member's delta to this replica; returns its header (member, seq, meta).
        ValueError (one line) for a blob that is not a delta of this model, or already applied."""
        header, arrays = decode(blob)
        if header.get("params") != self._params:
            raise ValueError("model delta from a differently configured model (parameters differ)")
        member, seq = header["member"], int(header["seq"])
        if member == self.member or seq <= self.applied.get(member, 0):
            raise ValueError(f"model delta {member}#{seq} already applied (or this member's own)")
        rec = self.rec
        _check_seen(arrays)
        self._model.apply(arrays)  # checks its own arrays before changing anything
        if "seen_pairs" in arrays:
            rec.pairs_seen.add_many(arrays["seen_pairs"])
            rec.users_seen.add_many(arrays["seen_users"])
            rec.popularity.sketch.add_many(arrays["seen_items"], arrays["seen_counts"])
        items = header["items"]
        if items:
            cat = _id_array(items)
            # the model's keys (keyed when private); received, so not this replica's to publish
            rec.catalogue.add(cat, rec.id_keys.as_keys(cat), journal=False)
        self.applied[member] = seq
        if "seen_items" in arrays:
            self._popular_moved()
        return {"member": member, "seq": seq, "meta": header.get("meta")}

    def _popular_moved(self) -> None:
        self._rerank = True
        if time.process_time() - self._reranked_at >= RERANK_S:
            # not settle(): the held slots' full refresh keeps its own schedule (ready), and a
            # refresh at every re-rank as well was a large part of a member's takes and applies
            self._rerank_popular()

    def _rerank_popular(self) -> None:
        rerank_popular(self.rec)
        self._rerank, self._reranked_at = False, time.process_time()

    def ready(self) -> None:
        """Refresh the held slots if a take left them stale (cheap otherwise): what a caller
        does that serves this replica and will not learn or apply soon (``settle`` does it too)."""
        self._model.ready()

    def refresh_every(self, ratings: int) -> None:
        """Refresh the held slots fully every ``ratings`` learned or applied (``pace.full_refresh_ratings``)."""
        self._model.refresh_every(ratings)

    def fleet_size(self, members: int) -> None:
        """Members learning concurrently: a take composes the count-weighted moves and a factor
        model's item biases with this many (``compose``, ``compose_biases``; a model without
        such state ignores it)."""
        if hasattr(self._model, "fleet_size"):
            self._model.fleet_size(members)

    def settle(self) -> None:
        """Re-rank the popular list if counts moved since the last re-rank (``take`` and
        ``apply`` do it at most every ``RERANK_S``), and refresh the held slots' rows if a take
        left them stale (the next apply or learned batch does it otherwise): replicas that
        applied the same deltas and settled hold the same state and list the same popular items."""
        self._model.ready(full=True)
        if self._rerank:
            self._rerank_popular()

    # --- checks -------------------------------------------------------------------------------------
    def state_digest(self) -> str:
        """A short hash of the replica's whole state (model bytes, Bloom filters, count-min,
        catalogue as a set, popular list), settled first: equal digests mean bit-identical
        replicas."""
        self.settle()
        rec = self.rec
        h = hashlib.sha256(rec.model.to_bytes())
        for arr in (rec.pairs_seen.cells, rec.users_seen.cells, rec.popularity.sketch.cells,
                    np.sort(rec.catalogue.snapshot()[1])):
            h.update(np.ascontiguousarray(arr).tobytes())
        h.update(json.dumps([rec.popularity.sketch.total, rec.popularity.most_common()],
                            default=str).encode())
        return h.hexdigest()[:16]


class _Counted(HeavyHitters):
    """A replica's popular-items list: a learned batch only counts its items in the count-min
    sketch, and the list is re-ranked over the catalogue (``rerank_popular``: at take and apply
    at most every ``RERANK_S``, and at ``settle``), which is what makes replicas list the same
    items. ``HeavyHitters.add_many`` also merged the batch's new ids into the list and trimmed
    it, re-estimating every listed id: at a fleet member's sync-sized batches, a large part of
    learning them, for a list the next re-rank replaces."""

    @classmethod
    def of(cls, popular: HeavyHitters) -> "_Counted":
        counted = cls(popular.capacity, popular.sketch)
        counted._tracked = popular._tracked
        return counted

    def add_many(self, ids, keys=None, counts=None) -> None:
        self.sketch.add_many(as_keys(ids) if keys is None else keys, counts)


def rerank_popular(rec) -> None:
    """Track the catalogue's most counted items, ties by key: the same list on every replica
    whose count-min sketch and catalogue are equal (O(catalogue) per call)."""
    ids, keys = rec.catalogue.snapshot()
    if not len(ids):
        return
    counts = rec.popularity.sketch.estimate_many(keys)
    top = np.lexsort((keys, -counts))[:rec.popularity.capacity]
    rec.popularity.replace({ids[n]: keys[n] for n in top})


def _params_digest(model) -> str:
    """Which models may exchange deltas: same class and constructor parameters."""
    text = json.dumps([type(model).__name__, model.params()], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _id_array(ids: list) -> np.ndarray:
    """A delta's new catalogue ids as the learner holds a poll's: int64 when every one is an int
    that fits (hashed in one compiled pass, to the keys the learner made of them), else as they
    are (an object array: each id hashed in Python)."""
    if all(type(i) is int for i in ids):
        try:
            return np.asarray(ids, dtype=np.int64)
        except OverflowError:
            pass
    return np.array(ids, dtype=object)


def _check_seen(arrays: dict[str, np.ndarray]) -> None:
    names = ("seen_pairs", "seen_users", "seen_items", "seen_counts")
    present = [name in arrays for name in names]
    if any(present) and (not all(present) or any(arrays[n].ndim != 1 for n in names)
                         or arrays["seen_items"].shape != arrays["seen_counts"].shape
                         or any(arrays[n].dtype != np.uint64 for n in names[:3])):
        raise ValueError("delta's serving keys are malformed")
