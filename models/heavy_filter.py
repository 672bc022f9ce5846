"""Heavy-hitter filter in front of a count sketch of vectors (an augmented sketch).

The few ids that carry most of a stream (Zipf-skewed users and items) get exact, collision-free
slots; everything else stays in the count sketch. Their large, often-updated vectors then no longer
add collision noise to every other id's cells, and their own reads are exact and contiguous.
This is the Augmented Sketch of Roy, Khan and Alonso (SIGMOD 2016) for vectors: a small filter of
heavy items in front of the sketch, items exchanged between the two as their counts change.

Which ids hold a slot is decided by the Randomized Admission Policy of Ben Basat, Chen, Einziger,
Friedman and Kassner (INFOCOM 2017) in its set-associative form: an id maps to one bucket of
``ways`` slots; a monitored id's count goes up by one when it is seen; an unmonitored id takes an
empty slot, or else replaces the bucket's smallest count c with probability 1/(c + 1), starting at
c + 1. The coin is a hash of the key and a clock, so the filter is a pure function of the stream
(checkpoints restore it bit-exactly; no random generator state to save).

An exchange keeps the model's estimate of both ids: the evicted id's vector is added back into its
sketch cells, and the admitted id's sketch estimate moves into the slot and is subtracted from its
cells. Written by hand (no library keeps vectors with a sketch) because it runs inside the
learner's numba loop.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from sketchrec.models.storage import HeavySlots
from sketchrec.sketches.base import Sketch
from sketchrec.sketches.count_sketch import gather_mean, locate, scatter_add
from sketchrec.sketches.hashing import mix64, reduce32, unit_interval

WAYS = 8  # slots per bucket: the 8 keys of a bucket are one 64-byte cache line
# bucket salts of the two hash families (users, items), so that user 5 and item 5 differ
_FAMILY_SALT = np.array([0x243F6A8885A308D3, 0x13198A2E03707344], dtype=np.uint64)
_CLOCK_MUL = np.uint64(0x9E3779B97F4A7C15)


def slot_bytes(dim: int) -> int:
    """Bytes one slot costs: a float32 vector and bias, its uint64 key, int64 count, family byte."""
    return 4 * (dim + 1) + 8 + 8 + 1


class HeavyFilter(Sketch):
    """``buckets x WAYS`` slots of (key, family, count, float32 vector + bias); count 0 marks a
    free slot. ``cells[s, :dim]`` is the learned part of the id's latent vector (its start
    vector is added on reading, as for sketch ids) and ``cells[s, dim]`` its bias; keys, families
    and counts are kept beside the cells (``Sketch._extra_arrays``). Filters do not merge: two
    filters hold different ids in their slots.

    >>> f = HeavyFilter(slots=16, dim=4)
    >>> f.n_slots, f.nbytes
    (16, 592)
    >>> HeavyFilter.from_bytes(f.to_bytes()) == f
    True
    """

    kind = "HeavyFilter"

    def __init__(self, slots: int, dim: int):
        buckets = max(0, int(slots) // WAYS)
        n = buckets * WAYS
        self.dim = int(dim)
        self.keys = np.zeros(n, dtype=np.uint64)
        self.families = np.zeros(n, dtype=np.uint8)
        self.counts = np.zeros(n, dtype=np.int64)
        self.cells = np.zeros((n, self.dim + 1), dtype=np.float32)

    def params(self) -> dict:
        return {"slots": self.n_slots, "dim": self.dim}

    def _extra_arrays(self) -> dict[str, np.ndarray]:
        return {"keys": self.keys, "families": self.families, "counts": self.counts}

    def _load_extra_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        self.keys, self.families, self.counts = arrays["keys"], arrays["families"], arrays["counts"]

    def _combine(self, other: "HeavyFilter") -> None:
        raise TypeError("heavy filters do not merge (their slots hold different ids)")

    @property
    def n_slots(self) -> int:
        return int(self.counts.shape[0])

    @property
    def n_used(self) -> int:
        return int(np.count_nonzero(self.counts))

    def slots(self) -> HeavySlots:
        """The filter's arrays as the kernels take them (views, no copies)."""
        return HeavySlots(self.keys, self.families, self.counts, self.cells)


@njit(inline="always", cache=True)
def _bucket_start(key, family, n_slots):
    return reduce32(mix64(key ^ _FAMILY_SALT[family]), n_slots // WAYS) * WAYS


@njit(inline="always", cache=True)
def find(keys, families, counts, key, family):
    """Slot of a monitored id, or -1."""
    n_slots = counts.shape[0]
    if n_slots == 0:
        return -1
    start = _bucket_start(key, family, n_slots)
    for s in range(start, start + WAYS):
        if keys[s] == key and counts[s] > 0 and families[s] == family:
            return s
    return -1


@njit(inline="always", cache=True)
def _move(cells, salts, key, addr, sign, vec, scratch, into_sketch):
    """Add a slot's vector to the id's sketch cells, or move the id's sketch estimate into it."""
    locate(salts, key, cells.shape[1], addr, sign)
    if into_sketch:
        for l in range(vec.shape[0]):
            scratch[l] = vec[l]
    else:
        gather_mean(cells, addr, sign, scratch)
        for l in range(vec.shape[0]):
            vec[l] = scratch[l]
            scratch[l] = -scratch[l]
    scatter_add(cells, addr, sign, scratch)


@njit(cache=True)   # rare (an admission): a call, not IR-inlined (kernels compile faster)
def _exchange(store, family, key, addr, sign, baddr, bsign, slot_row, scratch, into_sketch):
    # only the first addr.shape[1] components of a vector live in the sketch (see SketchMF's
    # light_dim): an admitted id starts with zeros beyond them, an evicted one loses them
    sketched, bias = addr.shape[1], slot_row.shape[0] - 1
    if not into_sketch:
        slot_row[sketched:bias] = 0.0
    _move(store.cells, store.salts[family], key, addr, sign, slot_row[:sketched],
          scratch[:sketched], into_sketch)
    _move(store.bias_cells, store.bias_salts[family], key, baddr, bsign, slot_row[bias:],
          scratch[bias:], into_sketch)


@njit(inline="always", cache=True)
def touch(keys, families, counts, vectors, store, key, family, slot, clock, addr, sign, baddr,
          bsign, scratch):
    """Count one sighting of an id whose slot ``find`` gave (-1: none), admitting it by RAP;
    returns its slot now, or -1.

    keys...vectors are ``store.heavy`` (the kernel's locals: read on every call); the rest of the
    ``FactorStore`` is read only by an exchange. ``scratch`` holds dim + 1 floats; addr/sign and
    baddr/bsign are the vector and bias sketches' address buffers (overwritten by an exchange)."""
    if slot >= 0:
        counts[slot] += 1
        return slot
    n_slots = counts.shape[0]
    if n_slots == 0:
        return -1
    start = _bucket_start(key, family, n_slots)
    victim = start
    for s in range(start + 1, start + WAYS):
        if counts[s] < counts[victim]:
            victim = s
    smallest = counts[victim]
    if smallest > 0:
        coin = unit_interval(mix64(key ^ (clock * _CLOCK_MUL) ^ _FAMILY_SALT[family]))
        if coin * (smallest + 1) >= 1.0:
            return -1
        _exchange(store, np.int64(families[victim]), keys[victim], addr, sign, baddr, bsign,
                  vectors[victim], scratch, np.bool_(True))
    # np.bool_, not a bare True/False: numba would compile one _exchange per literal value
    _exchange(store, np.int64(family), key, addr, sign, baddr, bsign, vectors[victim], scratch,
              np.bool_(False))
    keys[victim], families[victim], counts[victim] = key, family, smallest + 1
    return victim



@njit(cache=True)
def bucket_starts(keys, families, n_slots):
    """First slot of each id's bucket, for code that places ids itself (``models.fleet_slots``)."""
    out = np.empty(keys.shape[0], dtype=np.int64)
    for n in range(keys.shape[0]):
        out[n] = _bucket_start(keys[n], families[n], n_slots)
    return out
