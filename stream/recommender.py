"""The serving state around a learner: what the live endpoint needs beyond the model.

- the item catalogue seen so far (ids and their keys only; vectors stay in the sketch), at most
  ``max_items`` of them, the most rated kept (``stream.catalogue``): every per-item structure
  below is sized by it, and every per-user one (the Bloom filters) by its capacity, so the
  serving side's memory is fixed by configuration, not by the stream (``memory()``, in /stats),
- a Bloom filter over (user, item) pairs, so recommendations never include an item the user
  rated (a false positive may hide an unseen item, never show a seen one),
- a Bloom filter over users (unknown users get the most popular items),
- a count-min sketch with a heavy-hitters list of the most rated items (ranked for unknown users
  on the snapshot's cadence below, not per request),
- a snapshot of the catalogue's item factors, so /recommend is one matrix-vector product. It is
  rebuilt when the model has learned since it was read, at most every ``refresh_s`` seconds and
  at most once per ten times its own build cost: recommendations reflect the model as of at most
  ``max(refresh_s, 10 x build time)`` ago (``refresh_s`` 1 s by default).
- the served ranking (``stream.serving.ranking``, unless ``served_ranking=False`` or the model is
  central-DP: its release covers the scores, the counts are operator state): a known user's
  items ranked by the model's score blended with all-time and recent popularity, weighted online
  by the blends' hits on learned ratings >= 4 (the retrieval index's path ranks by the model alone),
- for catalogues of ``index_threshold`` items or more, a retrieval index over the snapshot
  (``models.retrieval``: qoLSH codes, a Hamming short-list, exact re-rank of the short-list),
  refreshed incrementally with the snapshot; smaller catalogues are scored exactly.

``Recommender.learn_many`` has the learner's signature, so the evaluation protocols and the
learning thread drive it exactly as they drive a bare model. The monitor feed and the LDP debias
map are a ``models.wrapped.Wrapped`` learner's hooks (``monitor``, ``debias``); canary rows
(``privacy.audit.real_rows``) reach the model and the monitor, never the serving structures. Learning and reading run in different
threads: the model's kernels release the GIL; the catalogue grows under a lock and readers take
a consistent snapshot (arrays are only ever appended to or replaced, never shrunk).
"""

from __future__ import annotations

import json
import sys
import threading
import time

import numpy as np

from sketchrec.models.base import ITEM, USER
from sketchrec.models.wrapped import Wrapped
from sketchrec.privacy.audit import real_rows
from sketchrec.privacy.mode import mode_of
from sketchrec.stream.catalogue import Catalogue, ItemSnapshot, default_max_items
from sketchrec.stream.served_ranking import RELEVANT, ServedRanking
from sketchrec.sketches import BloomFilter, CountMinSketch, HeavyHitters, pair_keys
from sketchrec.privacy.keys import PUBLIC, IdKeys, id_keys_of, restore_id_key

__all__ = ["Catalogue", "ItemSnapshot", "Recommender", "user_key"]   # Catalogue: stream.catalogue


def _learner_hook(name: str, doc: str) -> property:
    """A Recommender attribute that is its learner's (a ``Wrapped``) hook of that name."""
    return property(lambda self: getattr(self.learner, name),
                    lambda self, value: setattr(self.learner, name, value), doc=doc)


def _ranks_publicly(model) -> bool:
    """Whether the served ranking may blend popularity in: not under central DP, whose release
    covers /recommend's scores (``privacy.release``) while the count-min's exact counts and the
    ranking's feedback are operator state; a DP model's items are ranked by the model alone."""
    return mode_of(model).surface("popularity") == "exact"


class Recommender:
    """A learner plus the bounded structures that serving needs (see module docstring)."""

    def __init__(self, model, pair_capacity: int = 5_000_000, user_capacity: int = 1_000_000,
                 fp_rate: float = 0.01, popular: int = 1000, seed: int = 0, refresh_s: float = 1.0,
                 monitor=None, index_threshold: int = 20_000, index_shortlist: float = 0.1,
                 served_ranking: bool = True, max_items: int | None = None):
        self.model = model
        # not a base class: a Recommender does not pass unknown attributes on to the model
        self.learner = Wrapped(model, monitor)
        self.index_threshold, self.index_shortlist = index_threshold, index_shortlist
        self.pairs_seen = BloomFilter(pair_capacity, fp_rate, seed=seed)
        self.users_seen = BloomFilter(user_capacity, fp_rate, seed=seed + 1)
        self.popularity = HeavyHitters(popular, CountMinSketch(epsilon=1e-4, delta=1e-3, seed=seed))
        # at most max_items items (default: what the model is sized for), the most rated kept
        self.catalogue = Catalogue(max_items or default_max_items(model),
                                   score=self._item_counts)
        # called with every learned batch's user and item keys and its real rows (replica.py)
        self.observers: list = []
        # called with no arguments before every learned batch (replica.py: deferred refreshes)
        self.before_learning: list = []
        # called with a batch's user and item keys and its real rows before it is learned (a
        # fleet replica counts their sightings first, so that ids heavy in the batch learn it in
        # their slots)
        self.before_batch: list = []
        # runtime state, never checkpointed
        self.refresh_s = refresh_s
        self.index = None   # models.retrieval.RetrievalIndex, built with the snapshot when large
        self._index_generation = 0   # the catalogue generation the index's rows belong to
        self._snapshot: ItemSnapshot | None = None
        self._popular: tuple | None = None   # (built, model.n_learned, [(item, count)]) for popular()
        # how a known user's items are ranked (None: by the model's scores alone)
        self.ranking = ServedRanking() if served_ranking else None
        if served_ranking:   # its first count-min read loads a kernel: not a rebuild's cost
            self.popularity.sketch.estimate_many(np.zeros(1, dtype=np.uint64))
        self._snapshot_lock = threading.Lock()
        # one batch learned at a time: the stream's thread and ratings posted over HTTP
        # (stream.feedback) may both learn, and the kernels release the GIL
        self._learn_lock = threading.Lock()
        self.learning = threading.Event()
        self.learning.set()  # cleared = paused

    # the learner's interface ------------------------------------------------------------------------
    monitor = _learner_hook("monitor", "The privacy monitor fed every learned batch "
                            "(``privacy.monitor.PrivacyMonitor``) or None.")
    debias = _learner_hook("predict_map", "The map of every prediction for LDP-perturbed streams "
                           "(``privacy.ldp.Debias``) or None.")

    def learn_many(self, users, items, ratings, epoch: int = 0) -> np.ndarray:
        """Learn a batch (waits while paused) and record it for serving."""
        return self._learn(users, items, ratings, epoch, private=False)

    def noisy_step(self, users, items, ratings, epoch: int = 0) -> np.ndarray:
        """One DP-SGD step of a private model on this batch, recorded for serving likewise."""
        return self._learn(users, items, ratings, epoch, private=True)

    def _learn(self, users, items, ratings, epoch: int, private: bool) -> np.ndarray:
        self.learning.wait()
        with self._learn_lock:
            return self._learn_batch(users, items, ratings, epoch, private)

    def _learn_batch(self, users, items, ratings, epoch: int, private: bool) -> np.ndarray:
        for prepare in self.before_learning:
            prepare()
        users, items = np.asarray(users), np.asarray(items)
        real, ids = real_rows(users), (users, items)
        if self.before_batch:
            # hashed once, for the hooks and the learner alike (which takes uint64 keys as they
            # are): the hooks hashing the batch again cost a fleet replica's learning a share
            ids = self.id_keys.as_keys(users), self.id_keys.as_keys(items)
            for prepare in self.before_batch:
                prepare(*ids, real)
        self._feedback(users, items, ratings)
        ukeys, ikeys, predictions = self.learner.learn_batch(*ids, ratings, epoch, private)
        for observe in self.observers:
            observe(ukeys, ikeys, real)
        users, items, ukeys, ikeys = users[real], items[real], ukeys[real], ikeys[real]
        self.pairs_seen.add_many(pair_keys(ukeys, ikeys))
        self.users_seen.add_many(ukeys)
        self.popularity.add_many(items, ikeys)
        self.catalogue.add(items, ikeys)
        return predictions

    def _feedback(self, users, items, ratings) -> None:
        """The batch's first relevant rating by a known user, ranked before it is learned, is the
        served ranking's feedback (``stream.serving.ranking``), when due."""
        snap = self._snapshot
        if snap is None or snap.counts is None or self.ranking is None or not self.ranking.due():
            return
        for n in np.flatnonzero(np.asarray(ratings) >= RELEVANT)[:8].tolist():
            ukey = self.id_keys.as_keys(users[n])
            real = np.ones(1, dtype=bool)[real_rows(users[n:n + 1])]   # empty for a canary
            if len(real) and real[0] and self.users_seen.contains_many(ukey)[0]:
                p, bu = self.model.factors(ukey, USER)
                item = self.id_keys.key_of(items[n])
                self.ranking.feedback(snap, snap.counts, p[0], self.model.global_mean + bu[0],
                                      item, lambda rows: self.pairs_seen.contains_many(
                                          pair_keys(np.full(len(rows), ukey[0]), snap.keys[rows])))
                return

    def _item_counts(self, keys: np.ndarray) -> np.ndarray:
        """Estimated ratings per item key: what a compaction of the catalogue keeps the most of
        (looked up at the call: a restored recommender's count-min replaces the first one)."""
        return self.popularity.sketch.estimate_many(keys)

    def predict_many(self, users, items, clip: bool = True) -> np.ndarray:
        return self.learner.predict_many(users, items, clip=clip)

    @property
    def id_keys(self) -> IdKeys:
        """How the model turns ids into keys (a secret key in a privacy mode): every id this
        recommender hashes is hashed by it, so its filters and sketches agree with the model."""
        return id_keys_of(self.model)

    @property
    def nbytes(self) -> int:
        return sum(self.memory().values())

    def memory(self) -> dict[str, int]:
        """Bytes held per component: each is sized by configuration (the model's and the Bloom
        filters' capacities, ``max_items``), never by the number of ids the stream carried."""
        snap, ranking = self._snapshot, self.ranking
        index = snap.index if snap is not None else None
        return {"model": int(self.model.nbytes), "pairs_seen": int(self.pairs_seen.nbytes),
                "users_seen": int(self.users_seen.nbytes),
                "popularity": _popularity_bytes(self.popularity),
                "catalogue": int(getattr(self.catalogue, "nbytes", 0)),
                "item_snapshot": int(snap.nbytes) if snap is not None else 0,
                "retrieval_index": int(index.nbytes) if index is not None else 0,
                "served_ranking": int(ranking.nbytes) if ranking is not None else 0}

    @property
    def n_skipped_clip(self) -> int:
        return getattr(self.model, "n_skipped_clip", 0)

    # serving -------------------------------------------------------------------------------------
    def predict(self, user, item) -> float:
        keys = np.array([self.id_keys.key_of(user), self.id_keys.key_of(item)], dtype=np.uint64)
        return float(self.predict_many(keys[:1], keys[1:])[0])

    def recommend(self, user, k: int) -> tuple[list[tuple[object, float]], str]:
        """Top-k unseen items for the user, best first, with the served ranking's scores
        (``stream.serving.ranking``; the model's own on the retrieval index's path), and where they came from
        ("model", "model-index" when the retrieval index answered, or "popular" for a user the
        model has not seen)."""
        ukey = user_key(user, self.id_keys)
        if not len(self.catalogue):
            return [], "empty"
        if ukey is None or not self.users_seen.contains_many(np.array([ukey], dtype=np.uint64))[0]:
            if mode_of(self.model).surface("popularity") != "exact":   # counts: operator state
                return self._released_ranking(k), "popular"
            return self.popular(k), "popular"
        snap = self.item_snapshot(wait=False)
        ids, keys = snap.ids, snap.keys
        p, bu = self.model.factors(np.array([ukey], dtype=np.uint64), USER)
        offset = self.model.global_mean + bu[0]

        def seen_rows(rows=slice(None)) -> np.ndarray:
            """Which of the snapshot's rows (default: all) hold an item this user rated."""
            row_keys = keys[rows]
            ukeys = np.full(len(row_keys), ukey, dtype=np.uint64)
            return self.pairs_seen.contains_many(pair_keys(ukeys, row_keys))

        index = snap.index   # built over these very rows (one generation of the catalogue)
        if index is not None and len(index) == len(ids):
            rows, scores = index.search(p[0], k, exclude=seen_rows)
            if len(rows) == k:
                return [(ids[n], float(s + offset)) for n, s in zip(rows, scores)], "model-index"
        scores = snap.vectors @ p[0].astype(np.float32) + snap.biases + offset
        ranked = scores if snap.popular is None else ServedRanking.served(scores, snap.popular, snap.share)
        top = _top_unseen(ranked, k, seen_rows)
        top = top[np.isfinite(ranked[top])]
        return list(zip([ids[n] for n in top.tolist()], ranked[top].tolist())), "model"

    def _released_ranking(self, k: int) -> list[tuple[object, float]]:
        """A DP mode's answer to a user the model has not seen: the items ranked by the released
        model's item side (offset + item bias: noised, accounted), on the scale known users get,
        never by the exact counts (differencing them around one rating named the rated item)."""
        snap = self.item_snapshot(wait=False)
        scores = snap.biases + self.model.global_mean
        top = np.argsort(-scores, kind="stable")[:k]
        return [(snap.ids[n], float(scores[n])) for n in top.tolist() if np.isfinite(scores[n])]

    def popular(self, k: int) -> list[tuple[object, float]]:
        """The k most rated items with their estimated counts, re-ranked when the model has
        learned since and at most every ``refresh_s`` (as the item snapshot), not per request."""
        cached = self._popular
        if cached is None or (cached[1] != self.model.n_learned
                              and time.monotonic() - cached[0] >= self.refresh_s):
            ranked = [(item, float(count)) for item, count in self.popularity.most_common()]
            if not ranked:
                return []   # nothing ranked yet: asked again next time
            cached = self._popular = (time.monotonic(), self.model.n_learned, ranked)
        return cached[2][:k]

    def item_snapshot(self, wait: bool = True) -> ItemSnapshot:
        """The current item snapshot, rebuilt first if it is stale (see module docstring). Only one
        thread rebuilds; the others go on with the previous snapshot meanwhile. With ``wait``
        False (the HTTP path) a stale snapshot is rebuilt by a thread of its own and the caller
        goes on with the current one: the event loop never waits for a rebuild (a retrieval
        index over a large catalogue takes tens of milliseconds to refresh)."""
        snap = self._snapshot
        if snap is not None:
            changed = snap.learned != self.model.n_learned or len(snap.ids) != len(self.catalogue)
            due = time.monotonic() - snap.built >= max(self.refresh_s, 10 * snap.cost)
            if not (changed and due):
                return snap
        if self._snapshot_lock.acquire(blocking=snap is None):
            if not (wait or snap is None):
                threading.Thread(target=self._rebuild, daemon=True, name="item-snapshot").start()
                return snap
            self._rebuild()
        return self._snapshot

    def _rebuild(self) -> None:
        """Read the catalogue's factors out of the model (the caller holds ``_snapshot_lock``)."""
        try:
            t0 = time.monotonic()
            learned = self.model.n_learned
            ids, keys, generation = _view(self.catalogue)
            vectors, biases = self.model.factors(keys, ITEM)
            vectors = vectors.astype(np.float32)
            index = None
            if len(ids) >= self.index_threshold:
                # rows are renumbered when the catalogue is compacted: a new index then
                if self.index is None or self._index_generation != generation:
                    from sketchrec.stream.retrieval import RetrievalIndex
                    self.index = RetrievalIndex(vectors.shape[1], bits=128,
                                                shortlist=self.index_shortlist)
                    self._index_generation = generation
                index = self.index
                index.update(vectors, biases)
            else:
                self.index = None   # a compacted catalogue below the threshold: scored exactly
            cost = time.monotonic() - t0   # the factor read's, which the cadence bounds
            ranking, served = self.ranking, (None, None, 1.0)
            if ranking is not None and _ranks_publicly(self.model):   # the served ranking's popularity: a few passes over the ids
                counts = ranking.popularity(self.popularity.sketch.estimate_many(keys), learned,
                                            keys)
                served = (counts, ranking.mix.popularity_term(counts), float(ranking.mix.blend[0]))
            self._snapshot = ItemSnapshot(ids, keys, vectors, biases, learned, time.monotonic(),
                                          cost, *served, generation=generation, index=index)
        finally:
            self._snapshot_lock.release()

    # state -----------------------------------------------------------------------------------------
    def state_parts(self) -> dict[str, bytes]:
        ids, _ = self.catalogue.snapshot()
        return {"model": self.model.to_bytes(), "pairs_seen": self.pairs_seen.to_bytes(),
                "users_seen": self.users_seen.to_bytes(),
                "popularity": self.popularity.sketch.to_bytes(),
                "serving": json.dumps({"catalogue": ids, "max_items": self.catalogue.max_items,
                                       "popular_capacity": self.popularity.capacity,
                                       "popular": [i for i, _ in self.popularity.most_common()]}).encode()}

    @classmethod
    def from_parts(cls, parts: dict[str, bytes], model_cls, refresh_s: float = 1.0,
                   monitor=None) -> "Recommender":
        """Back from ``state_parts``: built by ``__init__`` (its defaults for what is not saved:
        the index settings), then the saved structures put in place of the empty ones (which are
        built at the smallest size, since they are thrown away)."""
        serving = json.loads(parts["serving"])
        rec = cls(model_cls.from_bytes(parts["model"]), pair_capacity=1, user_capacity=1,
                  refresh_s=refresh_s, monitor=monitor, max_items=serving.get("max_items"))
        rec.pairs_seen = BloomFilter.from_bytes(parts["pairs_seen"])
        rec.users_seen = BloomFilter.from_bytes(parts["users_seen"])
        rec.popularity = HeavyHitters(serving["popular_capacity"],
                                      CountMinSketch.from_bytes(parts["popularity"]))
        restore_id_key(rec.model, parts)   # before any id below is hashed
        keys = rec.id_keys
        rec.popularity.track(serving["popular"],
                             keys.as_keys(np.array(serving["popular"], dtype=object)))
        if serving["catalogue"]:
            cat = np.array(serving["catalogue"], dtype=object)
            rec.catalogue.add(cat, keys.as_keys(cat))
        return rec


def _popularity_bytes(popularity) -> int:
    """Bytes of the count-min sketch and the heavy-hitters list's ids (at most its capacity of
    them); a reader's published list has no sketch of its own."""
    sketch, tracked = getattr(popularity, "sketch", None), getattr(popularity, "_tracked", None)
    size = int(sketch.nbytes) if sketch is not None else 0
    if tracked is not None:
        size += sys.getsizeof(tracked) + sum(sys.getsizeof(i) for i in list(tracked))
    return size


def _view(catalogue) -> tuple[list, np.ndarray, int]:
    """(ids, keys, generation) of a catalogue (a reader's mirror has no generations: 0)."""
    view = getattr(catalogue, "view", None)
    return view() if view is not None else (*catalogue.snapshot(), 0)


def _top_unseen(scores: np.ndarray, k: int, seen_rows) -> np.ndarray:
    """Rows of the k best scores whose item the user has not rated, best first. The Bloom filter
    is asked about a short-list of the best scores only (most users rated few of them), grown
    until it holds k unseen items: every row left out scores no higher than those kept.

    >>> scores = np.array([5.0, 1.0, 4.0, 3.0, 2.0])
    >>> _top_unseen(scores, 2, lambda rows: np.isin(rows, [0, 3])).tolist()
    [2, 4]
    >>> _top_unseen(scores, 9, lambda rows: rows == 1).tolist()   # fewer than k unseen: all of them
    [0, 2, 3, 4]
    """
    n = len(scores)
    m = min(n, 2 * k + 16)
    while True:
        rows = np.argpartition(scores, n - m)[n - m:] if m < n else np.arange(n)
        rows = rows[~seen_rows(rows)]
        if len(rows) >= k or m == n:
            break
        m = min(n, 4 * m)
    return rows[np.argsort(-scores[rows], kind="stable")[:k]]


def user_key(user, keys: IdKeys = PUBLIC) -> int | None:
    """Key of an id given over HTTP (always text) under the model's ``keys``: '5' and 5 are the
    same id."""
    try:
        return keys.key_of(user)
    except TypeError:
        return None
