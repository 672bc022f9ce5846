"""Deltas of a ``SketchMF``'s learned state: what one replica learned since its last report, as
arrays that any replica of the same configuration adds to its own (issue 20: a fleet of learners
sharing one model).

An SGD step on a count sketch is an addition to its cells, so most of a model is additive: the
vector and bias cells, the rating count and sum, the learned/skipped counters, the DP step
count. A ``ModelReplica`` keeps a copy of the state it last published (its *base*); ``take``
returns ``now - base`` (only the entries that changed) and moves the base to now; ``apply`` adds
another replica's delta to the model and to the base alike, so it is not published again. A take
costs one pass over the arrays (O(cells)); tracking dirty cells in the kernels would make it
O(changed cells) if that ever matters.

The heavy-hitter slots are the part that is not additive: which ids hold an exact slot is
decided locally (``models.heavy_filter``, by the replica's own stream), and an exchange moves an
id's mass between its slot and the sketch cells. So the delta is taken in the *flat* view, where
every held id's slot is poured back into its cells (F = cells + scatter(slots)): exchanges do not
change F, learning changes it by exactly the SGD updates. The delta is

- ``cells``/``bias``: dF less the per-id part below (ids admitted or evicted since the base are
  included here, through their slot values, so their exchanges cancel out);
- per id held both at the base and now: its slot's change (its own SGD updates, exact), applied
  by a receiver to its slot if it holds that id, else added to the id's sketch cells.

Replicas that applied the same deltas hold the same flat state F (up to float rounding: additions
in another order) and, where they hold the same ids in slots, the same slots; an id held by one
replica and not by another is exact in the first and a sketch estimate in the second. See
``stream.serving.replica`` for the guarantees this gives and for the byte format.
"""

from __future__ import annotations

import numpy as np

from sketchrec.models._sgd import COUNT, RMAX, RMIN, TOTAL
from sketchrec.models.base import ITEM, USER
from sketchrec.sketches.count_sketch import scatter_rows

FAMILIES = (USER, ITEM)


def changed_entries(now: np.ndarray, base: np.ndarray, name: str) -> dict[str, np.ndarray]:
    """``now - base`` where it is nonzero: sparse (``name.i`` gaps between flat indices, uint32,
    which compress well; ``name.v`` values) or dense (``name.d``) when that is smaller; {} when
    nothing changed.

    >>> changed_entries(np.array([1., 5., 1., 1.]), np.ones(4), "x")
    {'x.i': array([1], dtype=uint32), 'x.v': array([4.])}
    """
    diff = (now - base).reshape(-1)
    idx = np.flatnonzero(diff)
    if not len(idx):
        return {}
    if len(idx) * (4 + diff.itemsize) < diff.nbytes:
        return {name + ".i": np.diff(idx, prepend=0).astype(np.uint32), name + ".v": diff[idx]}
    return {name + ".d": diff}


def entries_of(arrays: dict[str, np.ndarray], name: str, like: np.ndarray):
    """(flat indices or None for dense, values) of ``changed_entries`` output, checked against
    the array they apply to; None when the delta has none. Raises ValueError on a mismatch."""
    if name + ".d" in arrays:
        values = arrays[name + ".d"]
        if values.shape != (like.size,) or values.dtype != like.dtype:
            raise ValueError(f"delta's {name} does not fit this model (shape or dtype)")
        return None, values
    if name + ".i" not in arrays:
        return None
    idx = np.cumsum(arrays[name + ".i"], dtype=np.int64)
    values = arrays[name + ".v"]
    if values.shape != idx.shape or values.dtype != like.dtype or (len(idx) and idx[-1] >= like.size):
        raise ValueError(f"delta's {name} does not fit this model (indices or dtype)")
    return idx, values


def add_entries(target: np.ndarray, arrays: dict[str, np.ndarray], name: str) -> None:
    """target += the entries ``changed_entries`` wrote under ``name`` (in place)."""
    found = entries_of(arrays, name, target)
    if found is None:
        return
    idx, values = found
    flat = target.reshape(-1)  # a view: the state arrays are contiguous
    if idx is None:
        flat += values
    else:
        flat[idx] += values


class _Slots:
    """One family's held ids: keys (sorted), and where their rows live (``rows[index[n]]``)."""

    def __init__(self, keys: np.ndarray, rows: np.ndarray, index: np.ndarray, counts=None):
        self.keys, self.rows, self.index, self.counts = keys, rows, index, counts

    @classmethod
    def of(cls, heavy, family: int, copy: bool) -> "_Slots":
        held = np.flatnonzero((heavy.counts > 0) & (heavy.families == family))
        held = held[np.argsort(heavy.keys[held], kind="stable")]
        if copy:  # the base: its own rows, in key order
            return cls(heavy.keys[held].copy(), heavy.cells[held].copy(), np.arange(len(held)),
                       heavy.counts[held].copy())
        return cls(heavy.keys[held], heavy.cells, held, heavy.counts)

    def lookup(self, keys: np.ndarray) -> np.ndarray:
        """Row index of each key, -1 where not held."""
        pos = np.searchsorted(self.keys, keys)
        pos = np.minimum(pos, max(len(self.keys) - 1, 0))
        found = (self.keys[pos] == keys) if len(self.keys) else np.zeros(len(keys), dtype=bool)
        return np.where(found, self.index[pos] if len(self.keys) else -1, -1)


class ModelReplica:
    """The published state of one ``SketchMF`` and the delta arithmetic on it (see module doc).

    >>> from sketchrec.models import SketchMF
    >>> a, b = SketchMF(dim=4, width=512, heavy_slots=16), SketchMF(dim=4, width=512, heavy_slots=16)
    >>> ra, rb = ModelReplica(a), ModelReplica(b)
    >>> _ = a.learn_many([1, 2], [7, 7], [4.0, 3.0])
    >>> rb.apply(ra.take())
    >>> b.n_learned, float(b.global_mean), ra.take()
    (2, 3.5, {})
    """

    def __init__(self, model):
        if not hasattr(model, "heavy") or not hasattr(model, "vectors"):
            raise TypeError(f"replicas need a SketchMF, not {type(model).__name__}")
        self.model = model
        self.mark()

    def mark(self) -> None:
        """Take the model's current state as published (the base)."""
        m = self.model
        self._cells, self._bias = m.vectors.cells.copy(), m.biases.cells.copy()
        self._stats, self._counters, self._dp_steps = m.stats.copy(), m.counters.copy(), m.dp_steps.copy()
        self._slots = [_Slots.of(m.heavy, f, copy=True) for f in FAMILIES]

    def _salts(self, family: int) -> tuple[np.ndarray, np.ndarray]:
        return self.model.store.salts[family], self.model.store.bias_salts[family]

    # --- take ---------------------------------------------------------------------------------------
    def take(self) -> dict[str, np.ndarray]:
        """The arrays of everything learned since the base ({} if nothing); the base moves to now."""
        m = self.model
        dim = m.dim
        flat_cells = m.vectors.cells.astype(np.float64) - self._cells
        flat_bias = m.biases.cells.astype(np.float64) - self._bias
        out: dict[str, np.ndarray] = {}
        ids_keys, ids_fams, ids_rows, ids_counts = [], [], [], []
        for family, base in zip(FAMILIES, self._slots):
            now = _Slots.of(m.heavy, family, copy=True)
            salts, bsalts = self._salts(family)
            light = salts.shape[1]
            both, in_now, in_base = np.intersect1d(now.keys, base.keys, assume_unique=True,
                                                   return_indices=True)
            admitted = np.setdiff1d(np.arange(len(now.keys)), in_now, assume_unique=True)
            evicted = np.setdiff1d(np.arange(len(base.keys)), in_base, assume_unique=True)
            # the flat view: slots of ids that came or went since the base, poured into the cells
            for keys, rows, sign in ((now.keys[admitted], now.rows[admitted], 1.0),
                                     (base.keys[evicted], base.rows[evicted], -1.0)):
                scatter_rows(flat_cells, salts, keys, sign * rows[:, :light])
                scatter_rows(flat_bias, bsalts, keys, sign * rows[:, dim:])
            change = now.rows[in_now] - base.rows[in_base]
            moved = np.flatnonzero(change.any(axis=1))
            ids_keys.append(both[moved])
            ids_fams.append(np.full(len(moved), family, dtype=np.uint8))
            ids_rows.append(change[moved])
            ids_counts.append(now.counts[in_now][moved] - base.counts[in_base][moved])
        out.update(changed_entries(flat_cells.astype(np.float32), np.float32(0), "cells"))
        out.update(changed_entries(flat_bias.astype(np.float32), np.float32(0), "bias"))
        if sum(len(k) for k in ids_keys):
            out.update({"slot_keys": np.concatenate(ids_keys), "slot_families": np.concatenate(ids_fams),
                        "slot_rows": np.concatenate(ids_rows).astype(np.float32),
                        "slot_counts": np.concatenate(ids_counts)})
        out.update(changed_entries(m.counters, self._counters, "counters"))
        out.update(changed_entries(m.dp_steps, self._dp_steps, "dp_steps"))
        if m.stats[COUNT] != self._stats[COUNT] or m.stats[TOTAL] != self._stats[TOTAL]:
            out["stats"] = np.array([m.stats[COUNT] - self._stats[COUNT],
                                     m.stats[TOTAL] - self._stats[TOTAL], m.stats[RMIN], m.stats[RMAX]])
        if out:
            self.mark()
        return out

    # --- apply --------------------------------------------------------------------------------------
    def apply(self, arrays: dict[str, np.ndarray]) -> None:
        """Add another replica's ``take`` to the model and to the base (ValueError if it does not
        fit this model's shape; then nothing has changed)."""
        m = self.model
        self._check(arrays)
        for cells, bias, stats, counters, dp_steps, slots in (
                (m.vectors.cells, m.biases.cells, m.stats, m.counters, m.dp_steps,
                 [_Slots.of(m.heavy, f, copy=False) for f in FAMILIES]),
                (self._cells, self._bias, self._stats, self._counters, self._dp_steps, self._slots)):
            add_entries(cells, arrays, "cells")
            add_entries(bias, arrays, "bias")
            add_entries(counters, arrays, "counters")
            add_entries(dp_steps, arrays, "dp_steps")
            if "stats" in arrays:
                merge_stats(stats, arrays["stats"])
            if "slot_keys" in arrays:
                self._route(arrays, cells, bias, slots)

    def _route(self, arrays, cells, bias, slots: list[_Slots]) -> None:
        """Per-id slot changes: into the receiver's slot where it holds the id, else its cells."""
        keys, fams, rows, counts = (arrays["slot_keys"], arrays["slot_families"], arrays["slot_rows"],
                                    arrays["slot_counts"])
        dim = self.model.dim
        for family, held in zip(FAMILIES, slots):
            mine = np.flatnonzero(fams == family)
            where = held.lookup(keys[mine])
            inside, outside = mine[where >= 0], mine[where < 0]
            held.rows[where[where >= 0]] += rows[inside]
            held.counts[where[where >= 0]] += counts[inside]
            salts, bsalts = self._salts(family)
            scatter_rows(cells, salts, keys[outside], rows[outside, :salts.shape[1]])
            scatter_rows(bias, bsalts, keys[outside], rows[outside, dim:])

    def _check(self, arrays: dict[str, np.ndarray]) -> None:
        m = self.model
        for name, like in (("cells", m.vectors.cells), ("bias", m.biases.cells),
                           ("counters", m.counters), ("dp_steps", m.dp_steps)):
            entries_of(arrays, name, like)
        if "stats" in arrays and arrays["stats"].shape != (4,):
            raise ValueError("delta's stats do not fit this model")
        if "slot_keys" in arrays:
            n = len(arrays["slot_keys"])
            if (arrays["slot_rows"].shape != (n, m.dim + 1) or arrays["slot_families"].shape != (n,)
                    or arrays["slot_counts"].shape != (n,) or (arrays["slot_families"] > 1).any()):
                raise ValueError("delta's slots do not fit this model")


def merge_stats(stats: np.ndarray, delta: np.ndarray) -> None:
    """Add a delta's rating count and sum; the range becomes the union of both ranges."""
    count, total, low, high = delta
    if stats[COUNT] > 0:
        low, high = min(low, stats[RMIN]), max(high, stats[RMAX])
    stats[COUNT] += count
    stats[TOTAL] += total
    stats[RMIN], stats[RMAX] = low, high
