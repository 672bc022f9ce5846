"""Count-min sketch (thesis §2.3.2.4) and a bounded heavy-hitters tracker on top of it.

Counts are non-negative integers (a cash-register stream), so the estimate — the minimum over
rows — never under-counts. Conservative update raises each row only as far as needed, which
keeps that guarantee while shrinking over-counts.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from sketchrec.sketches.base import Sketch
from sketchrec.sketches.hashing import address, as_keys, salt_table


@njit(nogil=True, cache=True)
def _add_many(cells, salts, keys, counts, conservative):
    depth, width = cells.shape
    addr = np.empty(depth, dtype=np.int64)
    for n in range(keys.shape[0]):
        for j in range(depth):
            addr[j] = address(keys[n], salts[j], width)
        if conservative:
            low = cells[0, addr[0]]
            for j in range(1, depth):
                low = min(low, cells[j, addr[j]])
            target = low + counts[n]
            for j in range(depth):
                if cells[j, addr[j]] < target:
                    cells[j, addr[j]] = target
        else:
            for j in range(depth):
                cells[j, addr[j]] += counts[n]


@njit(nogil=True, cache=True)
def _estimate_many(cells, salts, keys, out):
    depth, width = cells.shape
    for n in range(keys.shape[0]):
        low = cells[0, address(keys[n], salts[0], width)]
        for j in range(1, depth):
            low = min(low, cells[j, address(keys[n], salts[j], width)])
        out[n] = low


class CountMinSketch(Sketch):
    """Frequencies of keys in ``depth x width`` int64 counters.

    Sized either by ``width`` and ``depth`` or by ``epsilon`` and ``delta``: then
    ``width = ceil(e / epsilon)`` and ``depth = ceil(ln(1 / delta))``, so that with probability
    at least ``1 - delta`` an estimate exceeds the true count by at most ``epsilon * total``.

    >>> cms = CountMinSketch(epsilon=0.01, delta=0.01, seed=0)
    >>> cms.width, cms.depth
    (272, 5)
    >>> cms.add_many(["a", "b", "a"])
    >>> cms.estimate("a"), cms["b"], cms["never-seen"], cms.total
    (2, 1, 0, 3)
    """

    kind = "CountMinSketch"

    def __init__(self, width: int | None = None, depth: int | None = None,
                 epsilon: float | None = None, delta: float | None = None, seed: int = 0,
                 conservative: bool = False):
        if width is None or depth is None:
            if epsilon is None or delta is None:
                raise ValueError("give either width and depth, or epsilon and delta")
            if not (0 < epsilon < 1 and 0 < delta < 1):
                raise ValueError("epsilon and delta must lie in (0, 1)")
            width = width or math.ceil(math.e / epsilon)
            depth = depth or math.ceil(math.log(1 / delta))
        if width < 1 or depth < 1:
            raise ValueError("width and depth must be positive")
        if width >= 2**32:
            raise ValueError("width must be below 2**32 (addresses are 32-bit)")
        self.width, self.depth, self.seed = int(width), int(depth), int(seed)
        self.conservative = bool(conservative)
        self.cells = np.zeros((self.depth, self.width), dtype=np.int64)
        self.total = 0
        self._salts = salt_table(self.seed, 0, self.depth, 1)[:, 0].copy()

    def params(self) -> dict:
        return {"width": self.width, "depth": self.depth, "seed": self.seed,
                "conservative": self.conservative}

    def _extra_arrays(self) -> dict[str, np.ndarray]:
        return {"total": np.array([self.total], dtype=np.int64)}

    def _load_extra_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        self.total = int(arrays["total"][0])

    def _combine(self, other: "CountMinSketch") -> None:
        # Sums of conservative sketches still never under-count: each row bounds its own sum.
        self.cells += other.cells
        self.total += other.total

    def add_many(self, keys, counts=None) -> None:
        """Add counts (default 1 each) for many ids or uint64 keys."""
        keys = as_keys(keys)
        if counts is None:
            counts = np.ones(keys.shape[0], dtype=np.int64)
        else:
            counts = np.ascontiguousarray(counts, dtype=np.int64).reshape(keys.shape[0])
            if (counts < 0).any():
                raise ValueError("count-min counts must be non-negative")
        _add_many(self.cells, self._salts, keys, counts, self.conservative)
        self.total += int(counts.sum())

    def estimate_many(self, keys) -> np.ndarray:
        keys = as_keys(keys)
        out = np.empty(keys.shape[0], dtype=np.int64)
        _estimate_many(self.cells, self._salts, keys, out)
        return out

    def add(self, key, count: int = 1) -> None:
        self.add_many([key], [count])

    def estimate(self, key) -> int:
        return int(self.estimate_many([key])[0])

    def __getitem__(self, key) -> int:
        return self.estimate(key)


class HeavyHitters:
    """The (at most) ``capacity`` most frequent ids, ranked by count-min estimates.

    Memory is bounded by ``capacity`` ids beside the sketch. Candidates are re-estimated when the
    list is trimmed, so a tracked id's count never goes stale.

    >>> hh = HeavyHitters(2, CountMinSketch(width=256, depth=4))
    >>> hh.add_many(["a", "b", "a", "c", "a", "b"])
    >>> hh.most_common()
    [('a', 3), ('b', 2)]
    """

    def __init__(self, capacity: int, sketch: CountMinSketch):
        if capacity < 1:
            raise ValueError("capacity must be positive")
        self.capacity = int(capacity)
        self.sketch = sketch
        self._tracked: dict = {}  # id -> key

    def add_many(self, ids, keys=None, counts=None) -> None:
        """Count ids (keys are derived when not given) and refresh the top list."""
        ids = np.asarray(ids, dtype=object) if not isinstance(ids, np.ndarray) else ids
        keys = as_keys(ids) if keys is None else np.ascontiguousarray(keys, dtype=np.uint64)
        self.sketch.add_many(keys, counts)
        _, first = np.unique(keys, return_index=True)
        # new ids in key order, as a loop of setdefault would add them (tie order), converted
        # in one call: the per-id numpy scalar reads were most of a batch's cost here
        fresh = ids[first].tolist()
        if ids.dtype == object:   # numpy scalars held in an object array become Python's
            fresh = [i.item() if hasattr(i, "item") else i for i in fresh]
        tracked = self._tracked
        tracked.update({i: k for i, k in zip(fresh, keys[first].tolist()) if i not in tracked})
        if len(self._tracked) > self.capacity:
            self._trim()

    def track(self, ids, keys=None) -> None:
        """Follow these ids without counting them (e.g. the list saved beside a restored sketch);
        ``keys``: theirs when the sketch is keyed otherwise than by the public hash."""
        ids = list(ids)
        keys = as_keys(np.array(ids, dtype=object)) if keys is None else keys
        self._tracked.update(zip(ids, np.asarray(keys, dtype=np.uint64).tolist()))
        if len(self._tracked) > self.capacity:
            self._trim()

    def replace(self, tracked: dict) -> None:
        """Follow exactly these ids ({id: key}, at most ``capacity``), in this order for ties."""
        self._tracked = dict(list(tracked.items())[:self.capacity])

    def _trim(self) -> None:
        ids = list(self._tracked)
        counts = self.sketch.estimate_many(np.fromiter(self._tracked.values(), dtype=np.uint64,
                                                       count=len(ids)))
        keep = np.argsort(-counts, kind="stable")[: self.capacity]
        self._tracked = {ids[n]: self._tracked[ids[n]] for n in keep}

    def most_common(self, n: int | None = None) -> list[tuple[object, int]]:
        """[(id, estimated count)], most frequent first."""
        ids = list(self._tracked)
        if not ids:
            return []
        counts = self.sketch.estimate_many(np.fromiter(self._tracked.values(), dtype=np.uint64,
                                                       count=len(ids)))
        order = np.argsort(-counts, kind="stable")
        top = order if n is None else order[:n]
        return [(ids[i], int(counts[i])) for i in top]

    def __len__(self) -> int:
        return len(self._tracked)
