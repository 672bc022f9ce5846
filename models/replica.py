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

The heavy-hitter slots are not additive in a single learner (an id's admission is a local
decision that moves its estimate out of the cells); a replica runs them in fleet mode
(``models.fleet_slots``): membership decided by announcements that every replica applies alike,
a slot holding a residual on top of the id's sketch estimate. A delta then carries the cells'
changes, the per-id residual changes of held ids and the ids announced.
"""

from __future__ import annotations

import numpy as np

from sketchrec.models._sgd import COUNT, RMAX, RMIN, TOTAL
from sketchrec.models.base import ITEM
from sketchrec.models.fleet_slots import FleetSlots


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


class ModelReplica:
    """The published state of one ``SketchMF`` and the delta arithmetic on it (see module doc).
    ``admit_after``: local sightings after which an id is announced for a heavy slot.

    >>> from sketchrec.models import SketchMF
    >>> a, b = SketchMF(dim=4, width=512, heavy_slots=16), SketchMF(dim=4, width=512, heavy_slots=16)
    >>> ra, rb = ModelReplica(a), ModelReplica(b)
    >>> _ = a.learn_many([1, 2], [7, 7], [4.0, 3.0])
    >>> rb.apply(ra.take())
    >>> b.n_learned, float(b.global_mean), ra.take()
    (2, 3.5, {})
    """

    def __init__(self, model, admit_after: int = 8):
        if not hasattr(model, "heavy") or not hasattr(model, "vectors"):
            raise TypeError(f"replicas need a SketchMF, not {type(model).__name__}")
        self.model = model
        self.slots = FleetSlots(model, admit_after) if model.heavy.n_slots else None
        m = model
        self._cells, self._bias = m.vectors.cells.copy(), m.biases.cells.copy()
        self._stats, self._counters, self._dp_steps = m.stats.copy(), m.counters.copy(), m.dp_steps.copy()

    def observe(self, ukeys: np.ndarray, ikeys: np.ndarray) -> None:
        """Count a learned batch's ids (heavy-slot announcements); a no-op without slots."""
        if self.slots is not None:
            self.slots.observe(ukeys, ikeys)

    # --- take ---------------------------------------------------------------------------------------
    def take(self) -> dict[str, np.ndarray]:
        """The arrays of everything learned since the base ({} if nothing); the base moves to now."""
        m = self.model
        out: dict[str, np.ndarray] = {}
        if self.slots is not None:
            keys, families, rows = self.slots.harvest()
            if len(keys):
                out.update({"slot_keys": keys, "slot_families": families, "slot_rows": rows})
        out.update(changed_entries(m.vectors.cells, self._cells, "cells"))
        out.update(changed_entries(m.biases.cells, self._bias, "bias"))
        out.update(changed_entries(m.counters, self._counters, "counters"))
        out.update(changed_entries(m.dp_steps, self._dp_steps, "dp_steps"))
        if m.stats[COUNT] != self._stats[COUNT] or m.stats[TOTAL] != self._stats[TOTAL]:
            out["stats"] = np.array([m.stats[COUNT] - self._stats[COUNT],
                                     m.stats[TOTAL] - self._stats[TOTAL], m.stats[RMIN], m.stats[RMAX]])
        self._cells[...], self._bias[...] = m.vectors.cells, m.biases.cells
        self._stats[...], self._counters[...], self._dp_steps[...] = m.stats, m.counters, m.dp_steps
        if self.slots is not None and self.slots.pending:
            keys, families = np.array(self.slots.pending, dtype=np.uint64).reshape(-1, 2).T
            self.slots.pending = []
            out.update({"announce_keys": keys, "announce_families": families.astype(np.uint8)})
            self.slots.admit(keys, families.astype(np.uint8), (self._cells, self._bias))
        if self.slots is not None and out:
            self.slots.refresh()
        return out

    # --- apply --------------------------------------------------------------------------------------
    def apply(self, arrays: dict[str, np.ndarray]) -> None:
        """Add another replica's ``take`` to the model and to the base (ValueError if it does not
        fit this model's shape; then nothing has changed)."""
        m = self.model
        self._check(arrays)
        for cells, bias, stats, counters, dp_steps in (
                (m.vectors.cells, m.biases.cells, m.stats, m.counters, m.dp_steps),
                (self._cells, self._bias, self._stats, self._counters, self._dp_steps)):
            add_entries(cells, arrays, "cells")
            add_entries(bias, arrays, "bias")
            add_entries(counters, arrays, "counters")
            add_entries(dp_steps, arrays, "dp_steps")
            if "stats" in arrays:
                merge_stats(stats, arrays["stats"])
        if self.slots is None:
            return
        bases = (self._cells, self._bias)
        for prefix in ("announce", "slot"):
            if prefix + "_keys" in arrays:
                self.slots.admit(arrays[prefix + "_keys"], arrays[prefix + "_families"], bases)
        if "slot_keys" in arrays:
            self.slots.route(arrays["slot_keys"], arrays["slot_families"], arrays["slot_rows"], bases)
        self.slots.refresh()

    def _check(self, arrays: dict[str, np.ndarray]) -> None:
        m = self.model
        for name, like in (("cells", m.vectors.cells), ("bias", m.biases.cells),
                           ("counters", m.counters), ("dp_steps", m.dp_steps)):
            entries_of(arrays, name, like)
        if "stats" in arrays and arrays["stats"].shape != (4,):
            raise ValueError("delta's stats do not fit this model")
        for prefix, width in (("slot", m.dim + 1), ("announce", None)):
            if prefix + "_keys" not in arrays:
                continue
            if self.slots is None:
                raise ValueError("delta has heavy slots, this model none")
            keys, families = arrays[prefix + "_keys"], arrays[prefix + "_families"]
            if (keys.dtype != np.uint64 or families.shape != keys.shape or keys.ndim != 1
                    or families.dtype != np.uint8 or (families > ITEM).any()
                    or (width and arrays["slot_rows"].shape != (len(keys), width))):
                raise ValueError(f"delta's {prefix} ids do not fit this model")


def merge_stats(stats: np.ndarray, delta: np.ndarray) -> None:
    """Add a delta's rating count and sum; the range becomes the union of both ranges."""
    count, total, low, high = delta
    if stats[COUNT] > 0:
        low, high = min(low, stats[RMIN]), max(high, stats[RMAX])
    stats[COUNT] += count
    stats[TOTAL] += total
    stats[RMIN], stats[RMAX] = low, high
