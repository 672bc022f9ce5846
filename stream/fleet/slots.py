"""Heavy-hitter slots that the replicas of one model agree on (fleet mode).

A single learner admits an id into an exact slot by the Randomized Admission Policy and moves the
id's sketch estimate with it (``models.heavy_filter``): a local decision, and a move whose size
depends on what the cells hold at that moment. Replicas applying the same deltas in different
orders would then hold different ids, and different values, in their slots. In fleet mode:

- *Membership* is a function of a grow-only set. A member announces an id once it has seen it
  often enough in its own stream (``threshold``), or at once while its bucket has a free way (a
  plain learner's free slot: ``stream.fleet.announce``); the announcement travels in its next delta; a bucket
  holds the ``WAYS`` smallest (key, family) among the ids announced into it. The union of
  announcements does not depend on the order it arrives in, and neither does membership. An id
  pushed out by smaller ones never comes back, so its slot can go to the cells for good.
- A slot holds a *residual* S: the id's vector is its sketch estimate plus S. Admission moves
  nothing (S = 0); eviction adds S to the id's cells (its estimate grows by exactly S). Learning
  on a held id adds to its S (published per id), learning on any other id adds to the cells.
- The kernels read a slot as the whole vector (``models._sgd``), so the slot row holds the *view*
  S + estimate, refreshed by the replica (``models.replica.ModelReplica.ready``): at every take
  and apply, or, deferred (a fleet member), where an apply moved S at once and everywhere every
  few takes and applies and when the replica settles: O(held x depth x light_dim) in one
  compiled pass. Admitted ids get theirs at once.

So the cells, each held id's S and the membership are the same function of the set of applied
deltas on every replica (up to float rounding), and so is every prediction after a refresh.
The RAP kernel is kept from exchanging by FROZEN counts (it admits against a count c with
probability 1/(c + 1)); free slots carry the family FREE, which no id has. Components beyond
``light_dim`` live only in S: an evicted id loses them, on every replica alike.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from sketchrec.models.base import ITEM, USER
from sketchrec.models.heavy_filter import _FAMILY_SALT, WAYS, bucket_starts
from sketchrec.sketches.bloom import BloomFilter
from sketchrec.sketches.count_min import CountMinSketch
from sketchrec.sketches.count_sketch import gather_mean, gather_rows, locate, scatter_add, scatter_rows
from sketchrec.stream.fleet.announce import FREE, announce_ids, due_after

FROZEN = 1 << 62   # every slot's count in fleet mode: RAP never exchanges against it
FAMILIES = (USER, ITEM)


class FleetSlots:
    """A ``SketchMF``'s heavy filter run in fleet mode (see module docstring). The slots held
    when it is made stay held (replicas starting from one snapshot agree on them)."""

    def __init__(self, model, admit_after: int = 8):
        self.model, self.admit_after = model, int(admit_after)
        h = model.heavy
        held = (h.counts > 0) & (h.families != FREE)
        h.families[~held], h.keys[~held] = FREE, 0
        h.counts[:] = FROZEN
        self.S = np.zeros(h.cells.shape, dtype=np.float64)
        self.S[held] = h.cells[held] - self._estimates(np.flatnonzero(held))
        self.view = h.cells.copy()
        n = max(1024, h.n_slots)
        self._sightings = CountMinSketch(width=2 * n, depth=3, seed=7)
        self._announced = BloomFilter(4 * n, 0.01, seed=8)
        self.pending: list[tuple[int, int]] = []   # (key, family) announced, not yet published
        self._observed: list[tuple[np.ndarray, np.ndarray]] = []   # batches not yet counted
        self.spilled: list[tuple[int, int]] = []   # evicted with unpublished changes (to cells)

    # --- local stream -------------------------------------------------------------------------------
    def observe(self, ukeys: np.ndarray, ikeys: np.ndarray) -> None:  # real rows only
        """Count a learned batch's ids (at the next ``announce``)."""
        self._observed.append((np.asarray(ukeys, dtype=np.uint64), np.asarray(ikeys, dtype=np.uint64)))

    def announce(self) -> None:
        """The ids observed since the last call that have been seen ``threshold()`` times, or
        whose bucket has a free way, go to ``pending`` (``announce.announce_ids``): batch by
        batch, users then items, as if each were counted as it came (one compiled pass; a take
        calls it before it reads ``pending``)."""
        if not self._observed:
            return
        segments = [keys for batch in self._observed for keys in batch]
        self._observed = []
        keys = np.concatenate(segments)
        ends = np.cumsum([len(k) for k in segments])
        families = np.tile(np.array(FAMILIES, np.uint8), len(segments) // 2)
        out_keys, out_families = np.empty(len(keys), np.uint64), np.empty(len(keys), np.uint8)
        cms, bloom = self._sightings, self._announced
        n, cms.total = announce_ids(keys, ends, families, _FAMILY_SALT, cms.cells, cms._salts,
                                    cms.total, self.admit_after, self.model.heavy.families,
                                    bloom.cells, bloom._salt1, bloom._salt2, bloom.n_hashes,
                                    bloom.m_bits, out_keys, out_families)
        self.pending.extend(zip(out_keys[:n].tolist(), out_families[:n].tolist()))

    def threshold(self) -> int:
        """Sightings that make an id due: ``admit_after``, or half the mean sightings per slot
        once that is more (at most twice as many ids as slots can be that heavy at one time, so
        the announcements of a long stream keep to its heavy ids, while buckets, which take ids
        by hash, still fill: ML-100k x 6, 2 members: 8,483 of 10,184 slots held, against 6,851
        at the mean and a plain learner's 9,999; prequential RMSE, ML-100k in time order, 2
        members: 0.96511 against 0.96522 at the mean; the synthetic stream, 3 members: 0.64466
        against 0.64500)."""
        return due_after(self.admit_after, self._sightings.total, max(1, self.model.heavy.n_slots))

    # --- the residuals ------------------------------------------------------------------------------
    def held(self) -> np.ndarray:
        return np.flatnonzero(self.model.heavy.families != FREE)

    def harvest(self, dtype=None, slots: np.ndarray | None = None) -> tuple[np.ndarray, ...]:
        """(keys, families, rows) of local learning on held ids since the last refresh, as
        ``dtype`` (default float32); added to S (rounding stays local, for the next harvest).
        ``slots``: the held slots that can have changed (default: all)."""
        h = self.model.heavy
        slots = self.held() if slots is None else slots
        moved = np.empty(len(slots), np.int64)
        slots = moved[:_changed(h.cells, self.view, slots, moved)]   # those learned on
        if dtype is None:  # float32: the view becomes the slot (view + change may differ in its last bit)
            change = np.empty((len(slots), h.cells.shape[1]), np.float32)
            _harvest(h.cells, self.view, self.S, slots, change)
        else:
            change = (h.cells[slots] - self.view[slots]).astype(dtype)
            moved = np.flatnonzero(change.any(axis=1))
            slots, change = slots[moved], change[moved]
            self.S[slots] += change
            self.view[slots] += change
        return h.keys[slots], h.families[slots], change

    def refresh(self, slots: np.ndarray | None = None) -> None:
        """Slot rows = S + the ids' current estimates (+ local learning not yet harvested), for
        ``slots`` (default: every held one)."""
        m, h = self.model, self.model.heavy
        _refresh(h.cells, self.view, self.S, h.keys, h.families,
                 self.held() if slots is None else slots, m.vectors.cells,
                 m.store.salts, m.biases.cells, m.store.bias_salts)

    def _estimates(self, slots: np.ndarray) -> np.ndarray:
        """Sketch estimates of the ids in these slots, as slot rows (vector, zeros, bias)."""
        m, h = self.model, self.model.heavy
        out = np.zeros((len(slots), m.dim + 1))
        for family in (USER, ITEM):
            rows = np.flatnonzero(h.families[slots] == family)
            keys = h.keys[slots[rows]]
            salts = m.store.salts[family]
            out[rows, :salts.shape[1]] = gather_rows(m.vectors.cells, salts, keys)
            out[rows, m.dim:] = gather_rows(m.biases.cells, m.store.bias_salts[family], keys)
        return out

    # --- membership ---------------------------------------------------------------------------------
    def locate(self, keys: np.ndarray, families: np.ndarray) -> np.ndarray:
        """Slot of each id, -1 where not held."""
        h = self.model.heavy
        keys = np.ascontiguousarray(keys, dtype=np.uint64)
        families = np.ascontiguousarray(families, dtype=np.uint8)
        return _find(h.keys, h.families, keys, families, bucket_starts(keys, families, h.n_slots))

    def admit(self, keys: np.ndarray, families: np.ndarray, bases: tuple) -> None:
        """Announced ids join their buckets, which keep their WAYS smallest (key, family); an id
        pushed out goes to the cells (and to ``bases``, the published copies of the cells,
        alike: every replica does this itself, so it is not published). One compiled pass."""
        m, h = self.model, self.model.heavy
        keys = np.ascontiguousarray(keys, dtype=np.uint64)
        families = np.ascontiguousarray(families, dtype=np.uint8)
        spilled = np.empty((len(keys), 2), np.uint64)
        n = _admit(h.keys, h.families, h.cells, self.S, self.view, keys, families,
                   bucket_starts(keys, families, h.n_slots), m.vectors.cells, m.store.salts,
                   m.biases.cells, m.store.bias_salts, bases[0], bases[1], spilled)
        if n:
            self.spilled.extend((int(k), int(f)) for k, f in spilled[:n].tolist())

    def route(self, keys: np.ndarray, families: np.ndarray, rows: np.ndarray,
              bases: tuple) -> np.ndarray:
        """Another member's per-id changes: into S where the id is held, else its cells.
        Returns the held slots whose S moved. Their rows (and views) move by the same change at
        once: a row is S + the id's estimate + local learning, and only S moved. Cheaper than
        refreshing them (which hashes each id's cells again: at M = 4 it was the apply's largest
        part); what collisions moved in their cells waits for the next full refresh, which also
        recomputes each view from S in float64, so a settled replica is the same either way."""
        m = self.model
        slots = self.locate(keys, families)
        inside = slots >= 0
        if rows.dtype == np.float32:   # the usual case, in one pass (distinct slots: as numpy's)
            _add_rows(self.S, m.heavy.cells, self.view, slots, rows)
        else:
            self.S[slots[inside]] += rows[inside]
            change = rows[inside].astype(np.float32)
            m.heavy.cells[slots[inside]] += change   # distinct slots: one delta's ids are distinct
            self.view[slots[inside]] += change
        if inside.all():
            return slots
        for family in (USER, ITEM):
            out = np.flatnonzero(~inside & (families == family))
            salts, bsalts = m.store.salts[family], m.store.bias_salts[family]
            for cells, bias in ((m.vectors.cells, m.biases.cells), bases):
                scatter_rows(cells, salts, keys[out], rows[out, :salts.shape[1]])
                scatter_rows(bias, bsalts, keys[out], rows[out, m.dim:])
        return slots[inside]


@njit(nogil=True, cache=True)
def _refresh(rows, view, S, keys, families, slots, cells, salts, bias, bias_salts):
    """For each held slot: view = float32(S + estimate) (vector, zeros, bias) and the slot row
    = view + (row - old view), in one pass: the arithmetic of ``gather_rows`` and numpy's, in
    the same order, without temporaries (it runs often: see the module docstring)."""
    k, light = salts.shape[1], salts.shape[2]
    dim = rows.shape[1] - 1
    addr, sign = np.empty((k, light), np.int64), np.empty((k, light), np.float64)
    kb = bias_salts.shape[1]
    baddr, bsign = np.empty((kb, 1), np.int64), np.empty((kb, 1), np.float64)
    est, best = np.empty(light, np.float64), np.empty(1, np.float64)
    for s in slots:
        f = families[s]
        locate(salts[f], keys[s], cells.shape[1], addr, sign)
        gather_mean(cells, addr, sign, est)
        locate(bias_salts[f], keys[s], bias.shape[1], baddr, bsign)
        gather_mean(bias, baddr, bsign, best)
        for l in range(dim + 1):
            e = est[l] if l < light else (best[0] if l == dim else 0.0)
            fresh = np.float32(S[s, l] + e)
            local = rows[s, l] - view[s, l]
            view[s, l] = fresh
            rows[s, l] = fresh + local


@njit(nogil=True, cache=True)
def _find(slot_keys, slot_families, keys, families, starts):
    """Slot of each (key, family) within its bucket, -1 where not held (``locate``)."""
    out = np.full(keys.shape[0], -1, np.int64)
    for n in range(keys.shape[0]):
        for s in range(starts[n], starts[n] + WAYS):
            if slot_keys[s] == keys[n] and slot_families[s] == families[n]:
                out[n] = s
                break
    return out


@njit(nogil=True, cache=True)
def _admit(slot_keys, slot_families, rows, S, view, keys, families, starts, cells, salts, bias,
           bias_salts, base_cells, base_bias, spilled):
    """``FleetSlots.admit``: each (key, family) not held takes a free way of its bucket, or the
    way of the bucket's largest (key, family) if it is smaller, which is evicted (its S, and
    its local learning not yet harvested, added to its cells: ``_evict``); then the buckets
    placed into are sorted (``_sort_bucket``) and the rows of the ids placed and still held
    refreshed (``_refresh``: never a zero row, even before the next full refresh). The evicted
    ids that held local learning go to ``spilled`` (key, family); returns how many."""
    n_spilled = 0
    touched = np.zeros(slot_keys.shape[0] // WAYS + 1, np.bool_)
    placed = np.zeros(keys.shape[0], np.bool_)
    for n in range(keys.shape[0]):
        key, family, start = keys[n], families[n], starts[n]
        free, largest, held = -1, -1, False
        for s in range(start, start + WAYS):
            if slot_families[s] == FREE:
                if free < 0:
                    free = s
            elif slot_keys[s] == key and slot_families[s] == family:
                held = True
            elif largest < 0 or _before(slot_keys[largest], slot_families[largest],
                                        slot_keys[s], slot_families[s]):
                largest = s
        if held:
            continue
        slot = free
        if slot < 0:
            if _before(slot_keys[largest], slot_families[largest], key, family):
                continue  # pushed out at once: it never holds a slot
            slot = largest
            if _evict(slot, slot_keys, slot_families, rows, S, view, cells, salts, bias,
                      bias_salts, base_cells, base_bias):
                spilled[n_spilled, 0], spilled[n_spilled, 1] = slot_keys[slot], slot_families[slot]
                n_spilled += 1
        slot_keys[slot], slot_families[slot] = key, family
        S[slot, :], view[slot, :], rows[slot, :] = 0.0, 0.0, 0.0
        touched[start // WAYS], placed[n] = True, True
    # one bucket's rows in their new order: allocated once, not per bucket sorted
    scratch = (np.empty((WAYS, rows.shape[1]), rows.dtype), np.empty((WAYS, S.shape[1])),
               np.empty((WAYS, view.shape[1]), view.dtype))
    for b in np.flatnonzero(touched):
        _sort_bucket(b * WAYS, slot_keys, slot_families, rows, S, view, scratch)
    placed_at = np.flatnonzero(placed)   # where each id placed sits now (-1: pushed out since)
    fresh = _find(slot_keys, slot_families, keys[placed_at], families[placed_at], starts[placed_at])
    _refresh(rows, view, S, slot_keys, slot_families, fresh[fresh >= 0], cells, salts, bias,
             bias_salts)
    return n_spilled


@njit(inline="always", cache=True)
def _before(key_a, family_a, key_b, family_b):
    """(key_a, family_a) < (key_b, family_b)."""
    return key_a < key_b or (key_a == key_b and family_a < family_b)


@njit(cache=True)
def _evict(slot, slot_keys, slot_families, rows, S, view, cells, salts, bias, bias_salts,
           base_cells, base_bias):
    """The slot's S plus its local learning to its id's cells, S alone to the bases (the
    arithmetic of ``scatter_rows``); the slot is left to its new id. Whether local learning
    went with it."""
    family, width = slot_families[slot], rows.shape[1]
    k, light = salts.shape[1], salts.shape[2]
    addr, sign = np.empty((k, light), np.int64), np.empty((k, light), np.float64)
    kb = bias_salts.shape[1]
    baddr, bsign = np.empty((kb, 1), np.int64), np.empty((kb, 1), np.float64)
    local, mine, base = np.empty(width, np.float32), np.empty(width), np.empty(width)
    any_local = False
    for l in range(width):
        local[l] = rows[slot, l] - view[slot, l]
        any_local |= local[l] != 0
        mine[l], base[l] = S[slot, l] + local[l], S[slot, l]
    locate(salts[family], slot_keys[slot], cells.shape[1], addr, sign)
    locate(bias_salts[family], slot_keys[slot], bias.shape[1], baddr, bsign)
    scatter_add(cells, addr, sign, mine[:light])
    scatter_add(bias, baddr, bsign, mine[width - 1:])
    scatter_add(base_cells, addr, sign, base[:light])
    scatter_add(base_bias, baddr, bsign, base[width - 1:])
    return any_local


@njit(cache=True)
def _sort_bucket(start, slot_keys, slot_families, rows, S, view, scratch):
    """Held ids in (key, family) order, free slots last, in a stable order: the same layout on
    every replica. ``scratch``: room for one bucket's rows, S and view."""
    order = np.arange(start, start + WAYS)
    moved = False
    for i in range(1, WAYS):  # insertion sort: stable
        j = i
        while j > 0 and _after(order[j - 1], order[j], slot_keys, slot_families):
            order[j - 1], order[j] = order[j], order[j - 1]
            j -= 1
            moved = True
    if not moved:
        return
    keys, families = slot_keys[order], slot_families[order]
    r, s_, v = scratch
    for i in range(WAYS):
        r[i], s_[i], v[i] = rows[order[i]], S[order[i]], view[order[i]]
    for i in range(WAYS):
        slot_keys[start + i], slot_families[start + i] = keys[i], families[i]
        rows[start + i], S[start + i], view[start + i] = r[i], s_[i], v[i]


@njit(inline="always", cache=True)
def _after(a, b, slot_keys, slot_families):
    """Slot a sorts after slot b: free after held, then by (key, family)."""
    free_a, free_b = slot_families[a] == FREE, slot_families[b] == FREE
    if free_a != free_b:
        return free_a
    return _before(slot_keys[b], slot_families[b], slot_keys[a], slot_families[a])


@njit(nogil=True, cache=True)
def _changed(rows, view, slots, out):
    """The slots whose row differs from its view, into ``out``; how many."""
    n = 0
    for s in slots:
        for l in range(rows.shape[1]):
            if rows[s, l] - view[s, l] != 0:
                out[n] = s
                n += 1
                break
    return n


@njit(nogil=True, cache=True)
def _harvest(rows, view, S, slots, change):
    """``harvest`` in float32: change = row - view, S += change, view = row (numpy's arithmetic)."""
    for n in range(slots.shape[0]):
        s = slots[n]
        for l in range(rows.shape[1]):
            change[n, l] = rows[s, l] - view[s, l]
            S[s, l] += change[n, l]
            view[s, l] = rows[s, l]


@njit(nogil=True, cache=True)
def _add_rows(S, cells, view, slots, rows):
    """S, the slot row and its view += row where the slot is held (>= 0): numpy's arithmetic (S
    in float64, the row and view in float32), in one pass."""
    for n in range(slots.shape[0]):
        s = slots[n]
        if s >= 0:
            for l in range(rows.shape[1]):
                S[s, l] += rows[n, l]
                cells[s, l] += rows[n, l]
                view[s, l] += rows[n, l]
