"""Replicas of one recommender: a member of a fleet publishes what it learned as a compact
delta and adds every other member's deltas to its own replica (issue 20).

>>> from sketchrec.models import SketchMF
>>> from sketchrec.stream.serving.recommender import Recommender
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

- the model (``models.replica.ModelReplica``): vector and bias cells, heavy-hitter slots per id,
  rating count/sum/range, learned and skipped counters, DP steps;
- the Bloom filters of seen (user, item) pairs and of users: the bytes that gained bits (merged
  by OR), the popularity count-min sketch: changed counters (merged by sum) and its total;
- the item catalogue: ids first seen since the last take (merged by union); the popular-items
  list is then re-ranked from the catalogue by the merged count-min (deterministic: count, then
  key), so replicas with equal sketches and catalogues list the same items.

Guarantees. Replicas that applied the same deltas, in any order, hold the same counters and
serving structures exactly (integer sums, OR, union) and the same model up to float rounding
(cells are float32 sums added in another order: ~1e-7 relative), where they hold the same ids in
heavy slots (see ``models.replica`` for ids held by some replicas and not others). A delta must
be applied once: each carries its member's id and a sequence number, and ``apply`` refuses one
whose sequence number it has already passed for that member (ValueError); deltas of one member
must therefore be applied in the order they were taken.

Format: ``b"SKRD"``, a version byte, a codec byte (0 raw, 1 zstd, 2 zlib), then the body: a
``sketches.serial`` blob (JSON header: member, sequence, model parameters, new catalogue ids,
caller's ``meta``; then raw little-endian arrays). Compressed when that is smaller.
"""

from __future__ import annotations

import hashlib
import json
import struct
import uuid
import zlib

import numpy as np

from sketchrec.models.replica import ModelReplica, add_entries, changed_entries, entries_of
from sketchrec.sketches import serial
from sketchrec.sketches.hashing import as_keys

MAGIC, VERSION = b"SKRD", 1
RAW, ZSTD, ZLIB = 0, 1, 2
_KIND = "ModelDelta"

try:  # kafka-python[zstd] brings it; zlib otherwise
    import zstandard
except ImportError:  # pragma: no cover
    zstandard = None


class DeltaTracker:
    """Publishes a recommender's local learning as deltas and applies other members' deltas.

    ``member`` names this replica in its deltas (default: a random id); the current state counts
    as published when the tracker is made. ``compress``: "zstd" (default, zlib if zstandard is
    missing), "zlib" or "none". ``admit_after``: sightings in this member's stream after which it
    announces an id for a heavy slot (``models.fleet_slots``)."""

    def __init__(self, recommender, member: str | None = None, compress: str = "zstd",
                 admit_after: int = 8):
        if compress not in ("zstd", "zlib", "none"):
            raise ValueError("compress must be zstd, zlib or none")
        self.rec = recommender
        self.member = member or uuid.uuid4().hex[:12]
        self.compress = compress
        self.seq = 0                         # deltas taken so far
        self.applied: dict[str, int] = {}    # member -> last sequence number applied
        self._model = ModelReplica(recommender.model, admit_after)
        recommender.observers.append(self._model.observe)
        self._params = _params_digest(recommender.model)
        self._mark_serving()

    def _mark_serving(self) -> None:
        rec = self.rec
        self._pairs, self._users = rec.pairs_seen.cells.copy(), rec.users_seen.cells.copy()
        self._popular, self._total = rec.popularity.sketch.cells.copy(), rec.popularity.sketch.total
        self._n_items = len(rec.catalogue)

    # --- publish ------------------------------------------------------------------------------------
    def take(self, meta: dict | None = None) -> bytes | None:
        """Everything learned locally since the last take, encoded (None if nothing); ``meta``
        (JSON-able, e.g. the input offsets the delta covers) travels in its header."""
        rec = self.rec
        arrays = self._model.take()
        pairs, users = rec.pairs_seen.cells, rec.users_seen.cells
        arrays.update(_gained_bytes(pairs, self._pairs, "pairs"))
        arrays.update(_gained_bytes(users, self._users, "users"))
        sketch = rec.popularity.sketch
        arrays.update(changed_entries(sketch.cells, self._popular, "popular"))
        ids, _ = rec.catalogue.snapshot()
        new_ids = ids[self._n_items:]
        if not arrays and not new_ids and sketch.total == self._total:
            return None
        header = {"member": self.member, "seq": self.seq + 1, "params": self._params,
                  "items": new_ids, "popular_total": sketch.total - self._total, "meta": meta}
        self.seq += 1
        self._mark_serving()
        rerank_popular(rec)
        return _encode(serial.pack(_KIND, header, arrays), self.compress)

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
        for name, bloom in (("pairs", rec.pairs_seen), ("users", rec.users_seen)):
            entries_of(arrays, name, bloom.cells)
        self._model.apply(arrays)  # checks its own arrays before changing anything
        for name, bloom, base in (("pairs", rec.pairs_seen, self._pairs),
                                  ("users", rec.users_seen, self._users)):
            _or_bytes(bloom.cells, arrays, name)
            _or_bytes(base, arrays, name)
        sketch = rec.popularity.sketch
        add_entries(sketch.cells, arrays, "popular")
        add_entries(self._popular, arrays, "popular")
        sketch.total += int(header["popular_total"])
        self._total += int(header["popular_total"])
        items = header["items"]
        if items:
            before = len(rec.catalogue)
            cat = np.array(items, dtype=object)
            rec.catalogue.add(cat, as_keys(cat))
            self._n_items += len(rec.catalogue) - before  # ours to publish: none of them
        self.applied[member] = seq
        rerank_popular(rec)
        return {"member": member, "seq": seq, "meta": header.get("meta")}

    # --- checks -------------------------------------------------------------------------------------
    def state_digest(self) -> str:
        """A short hash of the replica's whole state (model bytes, Bloom filters, count-min,
        catalogue as a set, popular list): equal digests mean bit-identical replicas."""
        rec = self.rec
        h = hashlib.sha256(rec.model.to_bytes())
        for arr in (rec.pairs_seen.cells, rec.users_seen.cells, rec.popularity.sketch.cells,
                    np.sort(rec.catalogue.snapshot()[1])):
            h.update(np.ascontiguousarray(arr).tobytes())
        h.update(json.dumps([rec.popularity.sketch.total, rec.popularity.most_common()],
                            default=str).encode())
        return h.hexdigest()[:16]


def rerank_popular(rec) -> None:
    """Track the catalogue's most counted items, ties by key: the same list on every replica
    whose count-min sketch and catalogue are equal (O(catalogue) per call)."""
    ids, keys = rec.catalogue.snapshot()
    if not len(ids):
        return
    counts = rec.popularity.sketch.estimate_many(keys)
    top = np.lexsort((keys, -counts))[:rec.popularity.capacity]
    rec.popularity.replace({ids[n]: keys[n] for n in top})


def decode(blob: bytes) -> tuple[dict, dict[str, np.ndarray]]:
    """(header, arrays) of a delta; ValueError (one line) for anything that is not one."""
    if not isinstance(blob, (bytes, bytearray, memoryview)) or bytes(blob[:4]) != MAGIC or len(blob) < 6:
        raise ValueError("not a sketchrec model delta (bad magic)")
    version, codec = blob[4], blob[5]
    if version != VERSION:
        raise ValueError(f"unsupported model delta version {version}")
    try:
        body = bytes(blob[6:])
        if codec == ZSTD:
            if zstandard is None:
                raise ValueError("zstd-compressed delta but zstandard is not installed")
            body = zstandard.ZstdDecompressor().decompress(body)
        elif codec == ZLIB:
            body = zlib.decompress(body)
        elif codec != RAW:
            raise ValueError(f"unknown codec {codec}")
        header, arrays = serial.unpack(body, _KIND)
        header["member"], header["seq"], header["items"]  # noqa: B018 (required fields)
    except ValueError as exc:
        raise ValueError(f"corrupt model delta: {exc}") from None
    except Exception as exc:  # zstd/zlib/json/struct errors on damaged bytes
        raise ValueError(f"corrupt model delta: {type(exc).__name__}: {exc}") from None
    return header, arrays


def _encode(body: bytes, compress: str) -> bytes:
    codec, packed = RAW, body
    if compress == "zstd" and zstandard is not None:
        codec, packed = ZSTD, zstandard.ZstdCompressor(level=3).compress(body)
    elif compress != "none":
        codec, packed = ZLIB, zlib.compress(body, 6)
    if len(packed) >= len(body):
        codec, packed = RAW, body
    return MAGIC + struct.pack("<BB", VERSION, codec) + packed


def _params_digest(model) -> str:
    """Which models may exchange deltas: same class and constructor parameters."""
    text = json.dumps([type(model).__name__, model.params()], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _gained_bytes(now: np.ndarray, base: np.ndarray, name: str) -> dict[str, np.ndarray]:
    """Bloom filter bytes that gained bits since the base (a receiver ORs them in)."""
    changed = np.flatnonzero(now != base)
    if not len(changed):
        return {}
    if len(changed) * 5 < now.size:
        return {name + ".i": np.diff(changed, prepend=0).astype(np.uint32), name + ".v": now[changed]}
    return {name + ".d": now.copy()}


def _or_bytes(target: np.ndarray, arrays: dict[str, np.ndarray], name: str) -> None:
    found = entries_of(arrays, name, target)
    if found is None:
        return
    idx, values = found
    if idx is None:
        target |= values
    else:
        target[idx] |= values
