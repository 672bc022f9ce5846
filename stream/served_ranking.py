"""How /recommend ranks a known user's unseen items: ``models.ranking.RankerMix`` (the model's
score blended with all-time and recent popularity, weighted online by hits) fed from the serving
structures.

- Popularity: at every item-snapshot rebuild the count-min sketch's estimates for the catalogue are
  read; what they grew by since the previous rebuild is added to the recent counts (discounted by
  the ratings learned in between, all counted as the latest), and the served blend's popularity
  term is computed once for the snapshot. A request adds it to its standardised model scores: one
  vectorised scoring as before.
- Feedback: a learned batch's first rating >= ``RELEVANT`` by a known user of a catalogue item is
  ranked by every ranker against the snapshot just before it is learned (the items the user has
  rated excluded, by the pair Bloom filter), and the hits are the mix's round. Feedback is skipped
  while less than ten times its own last cost has passed since the previous one, so it never takes
  more than ~10% of the learning thread.
"""

from __future__ import annotations

import threading
import time

import numpy as np

from sketchrec.stream.ranker_mix import RankerMix, RecentCounts

RELEVANT = 4.0   # a rating >= this is a hit to find


class ServedRanking:
    """The ranking state of one recommender (runtime only, not checkpointed: it relearns)."""

    def __init__(self, mix: RankerMix | None = None):
        self.mix = mix if mix is not None else RankerMix()
        self.recent = RecentCounts(self.mix.decays)
        self._counted = np.zeros(0)   # count-min estimates per catalogue row at the last refresh
        self._keys = np.zeros(0, dtype=np.uint64)   # the catalogue rows' keys at the last refresh
        self._learned = 0             # ratings learned at the last refresh
        self._next_feedback, self._lock = 0.0, threading.Lock()

    def popularity(self, estimates: np.ndarray, learned: int,
                   keys: np.ndarray | None = None) -> np.ndarray:
        """Counts per catalogue row (all-time, then one row per decay) from the count-min's
        ``estimates`` for the catalogue, read when the model had learned ``learned`` ratings.
        ``keys``: the rows' item keys; when the rows are no longer those of the last refresh
        with new ones appended (the catalogue was compacted), the per-row state follows its
        items to their new rows and an item new to the catalogue starts from nothing."""
        with self._lock:
            estimates = np.asarray(estimates, dtype=np.float64)
            if keys is not None:
                self._follow(np.asarray(keys, dtype=np.uint64))
            grown = estimates - np.pad(self._counted, (0, len(estimates) - len(self._counted)))
            rows = np.arange(len(estimates))
            self.recent.add(rows, max(learned - self._learned, 0), np.maximum(grown, 0.0))
            self._counted, self._learned = estimates, learned
            return np.vstack([estimates, self.recent.counts[:, :len(estimates)]])

    def _follow(self, keys: np.ndarray) -> None:
        """Move the per-row state to the rows ``keys`` now hold (the caller holds the lock)."""
        old = self._keys
        m = min(len(old), len(keys))
        if len(keys) >= len(old) and np.array_equal(old, keys[:m]):
            self._keys = keys.copy()   # the same rows, new ones appended: nothing moves
            return
        order = np.argsort(old, kind="stable")
        at = np.minimum(np.searchsorted(old[order], keys), max(len(old) - 1, 0))
        found = (old[order][at] == keys) if len(old) else np.zeros(len(keys), dtype=bool)
        src = order[at]
        counted = np.zeros(len(keys))
        counted[found] = self._counted[src[found]] if len(self._counted) else 0.0
        recent = np.zeros((self.recent.counts.shape[0], len(keys)))
        width = self.recent.counts.shape[1]
        ok = found & (src < width)
        recent[:, ok] = self.recent.counts[:, src[ok]]
        # an item new to the catalogue starts at zero, as an appended one does
        self._counted, self.recent.counts, self._keys = counted, recent, keys.copy()

    @property
    def nbytes(self) -> int:
        """Bytes of the per-row state: sized by the catalogue, which is bounded."""
        return int(self._counted.nbytes + self._keys.nbytes + self.recent.counts.nbytes)

    def feedback(self, snap, counts: np.ndarray, user_vector: np.ndarray, offset: float,
                 item_key: int, seen_rows) -> None:
        """One relevant event: rank the item (key) for the user against the snapshot's items the
        user has not rated (``seen_rows(rows)``) by every ranker, and update the mix."""
        now = time.monotonic()
        at = np.flatnonzero(snap.keys == np.uint64(item_key))
        if not len(at):
            return
        unseen = ~seen_rows(np.arange(len(snap.keys)))
        unseen[at[0]] = True
        rows = np.flatnonzero(unseen)
        scores = snap.vectors[rows] @ user_vector.astype(np.float32) + snap.biases[rows] + offset
        hits = self.mix.hits(scores, counts[:, rows], int(np.searchsorted(rows, at[0])))
        with self._lock:
            self.mix.update(hits)
        self._next_feedback = now + 10 * (time.monotonic() - now)

    def due(self) -> bool:
        """Whether the next relevant event is fed back (see module docstring)."""
        return time.monotonic() >= self._next_feedback

    @staticmethod
    def served(scores: np.ndarray, popular_term: np.ndarray, share: float) -> np.ndarray:
        """The served ranking's scores of the snapshot's items for one user: ``share`` times the
        standardised scores plus the popularity term, less the constant ``share * mean / std``
        (the same order, two passes fewer on the request's path)."""
        sd = float(scores.std())
        out = scores * (share / sd) if sd > 0 else np.zeros(len(scores))
        out += popular_term
        return out
