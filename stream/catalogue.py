"""The serving catalogue: the item ids seen so far, bounded by configuration, not by the stream.

A stream may carry any number of distinct item ids; everything the serving side keeps per item
(the ids themselves, their keys, the item snapshot's factors, the retrieval index's codes, the
served ranking's counts) is sized by the catalogue. So the catalogue holds at most ``max_items``
ids: when a batch would take it past that, it is *compacted* to the ``keep`` share of
``max_items`` ids that score highest by ``score`` (the recommender passes the count-min sketch's
estimated rating counts: the most rated items stay), ties kept by recency (the newest first).
Compaction starts a new ``generation``: rows are renumbered once, then appended to again, so
anything kept per row (index codes, per-row counts) is valid for one generation and rebuilt or
remapped (by key) when it changes. One compaction costs a sort of ``max_items`` scores and runs
once per ``(1 - keep) * max_items`` new ids: O(log N) per new id.

The default size (``default_max_items``) is what the model itself is sized for: a sketch model's
capacity in distinct ids (its width times depth times space gain over the dimension when it was
built from a width), capped at ``MAX_ITEMS_CAP``.
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass

import numpy as np

MAX_ITEMS_CAP = 1 << 20       # the shared block's catalogue buffers hold this many items
FALLBACK_MAX_ITEMS = 100_000  # for a model that states no size (dense, river adapters)


def default_max_items(model) -> int:
    """The catalogue size a model is built for (see module docstring).

    >>> from sketchrec.models import SketchMF
    >>> default_max_items(SketchMF(capacity=5000, dim=8))
    5000
    >>> default_max_items(SketchMF(dim=64, width=1 << 16))   # 4 rows x 65,536 cells / 64
    4096
    """
    capacity = getattr(model, "capacity", None)
    if capacity is None and getattr(model, "width", None) and getattr(model, "dim", None):
        capacity = (model.width * getattr(model, "depth", 1) * getattr(model, "space_gain", 1.0)
                    / model.dim)
    if not capacity:
        return FALLBACK_MAX_ITEMS
    return int(min(MAX_ITEMS_CAP, max(1000, capacity)))


class Catalogue:
    """Item ids seen so far, in first-seen order within a generation, with their keys in a
    growable buffer; at most ``max_items`` of them (None: unbounded; see module docstring).

    >>> cat = Catalogue()
    >>> cat.add(np.array([7, 5, 7]), np.array([70, 50, 70], dtype=np.uint64))
    >>> cat.add(np.array([5, 9]), np.array([50, 90], dtype=np.uint64))
    >>> cat.snapshot()[0], cat.snapshot()[1].tolist()
    ([7, 5, 9], [70, 50, 90])
    >>> small = Catalogue(max_items=4, keep=0.5, score=lambda keys: (keys == 10).astype(float))
    >>> small.add(np.arange(1, 6), np.arange(1, 6, dtype=np.uint64) * 10)  # 5 > 4: keep 2
    >>> small.snapshot()[0], small.generation   # the top score (item 1), then the newest
    ([1, 5], 1)
    """

    def __init__(self, max_items: int | None = None, keep: float = 0.75, score=None):
        if max_items is not None and max_items < 1 or not 0 < keep <= 1:
            raise ValueError("max_items must be positive and keep in (0, 1]")
        self.max_items, self.keep, self.score = max_items, keep, score
        self.generation = 0      # compactions so far: rows are renumbered at each
        self.evicted = 0         # ids dropped by compactions
        self.ids: list = []
        self._keys = np.empty(1024 if max_items is None else min(1024, max_items), dtype=np.uint64)
        self._known = np.empty(0, dtype=np.uint64)   # the keys, sorted: a batch is checked in C
        self._id_bytes = 0       # Python objects of the ids (kept up to date: /stats reads it)
        self._journal: list | None = None   # ids first seen since the last take_new (None: not kept)
        self._lock = threading.Lock()

    def add(self, ids, keys: np.ndarray, journal: bool = True) -> None:
        """Append the ids not held yet (``keys``: theirs), compacting a full catalogue first.
        ``journal`` False: those ids are not recorded for ``take_new`` (a fleet replica's items
        that came with another member's delta, not its own to publish)."""
        uniq, first = np.unique(keys, return_index=True)
        with self._lock:
            known = self._known
            if len(known):
                at = np.minimum(np.searchsorted(known, uniq), len(known) - 1)
                fresh = known[at] != uniq
                if not fresh.any():
                    return   # the usual batch once the catalogue is complete
                uniq, first = uniq[fresh], first[fresh]
            new = np.sort(first)
            new_ids = [ids[n].item() if hasattr(ids[n], "item") else ids[n] for n in new]
            if journal and self._journal is not None:
                self._journal.extend(new_ids)   # whether a compaction then keeps them or not
            if self.max_items is not None and len(self.ids) + len(new) > self.max_items:
                self._compact(new_ids, keys[new])
                return
            n0, n1 = len(self.ids), len(self.ids) + len(new)
            if n1 > len(self._keys):
                grown = np.empty(self._grown_size(n1), dtype=np.uint64)
                grown[:n0] = self._keys[:n0]
                self._keys = grown  # readers holding the old buffer still see a valid prefix
            self._keys[n0:n1] = keys[new]
            # uniq is sorted and disjoint from known: insert in place of re-sorting the union
            self._known = np.insert(known, np.searchsorted(known, uniq), uniq)
            self._id_bytes += sum(_id_size(i) for i in new_ids)
            self.ids.extend(new_ids)

    def resize(self, max_items: int) -> None:
        """Hold at most ``max_items`` ids from now on (a restored catalogue given another bound
        by the command line): one that holds more is compacted at once, as a full one is.

        >>> cat = Catalogue(max_items=8, score=lambda keys: keys.astype(float))
        >>> cat.add(np.arange(1, 7), np.arange(1, 7, dtype=np.uint64))
        >>> cat.resize(4)
        >>> cat.snapshot()[0], cat.max_items, cat.evicted   # keep 3 of 4: the top scores
        ([4, 5, 6], 4, 3)
        """
        if max_items < 1:
            raise ValueError("max_items must be positive")
        with self._lock:
            self.max_items = max_items
            if len(self.ids) > max_items:
                self._compact([], self._keys[:0])
            elif len(self._keys) > max_items:   # never more buffer than the bound needs
                self._keys = self._keys[:max_items].copy()

    def _grown_size(self, needed: int) -> int:
        doubled = max(needed, 2 * len(self._keys))
        return doubled if self.max_items is None else max(needed, min(doubled, self.max_items))

    def _compact(self, new_ids: list, new_keys: np.ndarray) -> None:
        """Keep the ``keep * max_items`` best-scoring of the catalogue and the new ids (ties:
        the newest), in their first-seen order, as a new generation (the caller holds the lock)."""
        n = len(self.ids)
        ids = self.ids + new_ids
        keys = np.concatenate([self._keys[:n], new_keys])
        target = max(1, int(self.keep * self.max_items))
        scores = (np.zeros(len(keys)) if self.score is None
                  else np.asarray(self.score(keys), dtype=np.float64))
        # lexsort's last key is the primary one: score, then row, both descending
        order = np.lexsort((-np.arange(len(keys)), -scores))
        kept = np.sort(order[:target])
        self.ids = [ids[r] for r in kept.tolist()]
        self._keys = np.empty(self.max_items, dtype=np.uint64)
        self._keys[:len(kept)] = keys[kept]
        self._known = np.sort(keys[kept])
        self._id_bytes = sum(_id_size(i) for i in self.ids)
        self.evicted += len(keys) - len(kept)
        self.generation += 1

    def snapshot(self) -> tuple[list, np.ndarray]:
        return self.view()[:2]

    def take_new(self) -> list:
        """The ids first seen since the last call (by an ``add`` that journals them), in
        first-seen order, whatever compactions renumbered in between (a fleet replica publishes
        them at each take: rows cannot say which ids are new once a compaction reorders them).
        The first call starts the record and returns []; a catalogue never asked keeps none.

        >>> cat = Catalogue(max_items=2, keep=0.5)
        >>> cat.take_new()
        []
        >>> cat.add(np.array([7, 5, 3]), np.array([70, 50, 30], dtype=np.uint64))   # compacts
        >>> cat.take_new(), cat.generation
        ([7, 5, 3], 1)
        """
        with self._lock:
            new, self._journal = self._journal or [], []
            return new

    def view(self) -> tuple[list, np.ndarray, int]:
        """(ids, keys, generation) at one moment: rows are valid within that generation."""
        with self._lock:
            n = len(self.ids)
            return self.ids[:n], self._keys[:n], self.generation

    @property
    def nbytes(self) -> int:
        """Bytes held: the id objects and the list of them, the key buffer and the sorted keys."""
        return (self._id_bytes + sys.getsizeof(self.ids) + self._keys.nbytes + self._known.nbytes)

    def __len__(self) -> int:
        return len(self.ids)


def _id_size(item) -> int:
    return sys.getsizeof(item)


@dataclass
class ItemSnapshot:
    """Factors of the catalogue's items read out of the model at one moment, for fast scoring."""

    ids: list
    keys: np.ndarray
    vectors: np.ndarray   # float32 (n, d)
    biases: np.ndarray    # float64 (n,)
    learned: int          # model.n_learned when read
    built: float          # time.monotonic() when read
    cost: float           # seconds the read took
    counts: np.ndarray | None = None    # popularity signals per item (stream.served_ranking)
    popular: np.ndarray | None = None   # the served ranking's popularity term per item
    share: float = 1.0                  # the served ranking's weight on the standardised model score
    generation: int = 0                 # the catalogue's generation its rows belong to
    index: object = None                # the retrieval index over these rows (None: exact scoring)

    @property
    def nbytes(self) -> int:
        """Bytes of its arrays (the ids and keys are the catalogue's, counted there)."""
        return sum(a.nbytes for a in (self.vectors, self.biases, self.counts, self.popular)
                   if a is not None)
