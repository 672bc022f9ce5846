"""Top-N retrieval over the item vectors with cosine sketches (thesis ch. 5): a Hamming short-list
from compact binary codes, then exact scoring of the short-list only.

Maximum inner product -> cosine. The score to rank is s(u, i) = b_i + p_u . q_i (the user's own
terms are constant for one user). With a_i = [q_i, b_i] and M >= max_i ||a_i||, the item point
x_i = [a_i, sqrt(M^2 - ||a_i||^2)] / M has unit norm and the query y_u = [p_u, 1, 0] satisfies
y_u . x_i = s(u, i) / M, so ranking by cosine(y_u, x_i) ranks by score (Bachrach et al. 2014;
Neyshabur & Srebro 2015). Items are encoded once with the sketch's quantizer (qoLSH by default);
a query is encoded by plain signs of its projections (it is not stored, so the better quantizer
buys nothing there). M is kept with headroom; an item whose norm outgrows it forces a full rebuild.

Refresh is incremental: ``update`` re-encodes only items that are new or whose point moved by more
than ``refresh_angle`` since it was encoded; the rest keep their codes.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from sketchrec.sketches.cosine import CosineSketch

ENCODE_ROWS = 2048   # rows encoded at once: bounds the transient memory of a (re)build


@njit(nogil=True, cache=True)
def _score_rows(vectors, biases, rows, query, out):
    """b_i + q_i . p for the short-listed rows only: numpy would first copy the rows out
    (fancy indexing), which costs more than scoring them."""
    for n in range(rows.shape[0]):
        i = rows[n]
        acc = biases[i]
        for l in range(query.shape[0]):
            acc += vectors[i, l] * query[l]
        out[n] = acc


class RetrievalIndex:
    """Two-stage top-k search over item vectors and biases (see module docstring)."""

    def __init__(self, dim: int, bits: int = 64, seed: int = 0, method: str = "qolsh",
                 shortlist: float = 0.1, min_shortlist: int = 200, refresh_angle: float = 0.05,
                 headroom: float = 1.2):
        if bits % 64:
            raise ValueError("bits must be a multiple of 64 (codes are compared as uint64 words)")
        self.dim, self.bits, self.shortlist, self.min_shortlist = dim, bits, shortlist, min_shortlist
        self.refresh_cos = float(np.cos(refresh_angle))
        self.headroom = headroom
        self.sketch = CosineSketch(dim + 2, bits, seed=seed, method=method)
        self.query_sketch = CosineSketch(dim + 2, bits, seed=seed, method="frame")
        self.scale = 0.0
        self.points = np.empty((0, dim + 2))
        self.codes = np.empty((0, bits // 64), dtype=np.uint64)
        self.vectors = np.empty((0, dim), dtype=np.float32)
        self.biases = np.empty(0, dtype=np.float32)
        self.reencoded = 0  # items encoded by the last update
        self.last_scored = 0
        self.index = (self.codes.T.copy(), self.vectors, self.biases)  # what search reads, swapped whole

    def __len__(self) -> int:
        return self.vectors.shape[0]

    @property
    def nbytes(self) -> int:
        """Bytes of its arrays (points, codes, the word-major copy search reads, vectors, biases):
        about ``8 (dim + 2) + 4 dim + bits / 2`` per item, so bounded by the catalogue's size."""
        words = self.index[0]
        return int(self.points.nbytes + self.codes.nbytes + words.nbytes + self.vectors.nbytes
                   + self.biases.nbytes)

    def _points(self, vectors: np.ndarray, biases: np.ndarray) -> np.ndarray:
        a = np.hstack([vectors.astype(np.float64), biases.astype(np.float64)[:, None]])
        tail = np.sqrt(np.maximum(self.scale ** 2 - np.einsum("ij,ij->i", a, a), 0.0))
        return np.hstack([a, tail[:, None]]) / self.scale

    def _encode(self, points: np.ndarray) -> np.ndarray:
        """Codes (n, bits / 64) of ``points``, ``ENCODE_ROWS`` at a time: qoLSH's work arrays take
        ~10 KB a row, which over a whole catalogue was the index's peak memory, not its size."""
        codes = np.empty((len(points), self.bits // 64), dtype=np.uint64)
        for start in range(0, len(points), ENCODE_ROWS):
            packed = self.sketch.encode(points[start:start + ENCODE_ROWS])  # (rows, bits / 8) uint8
            codes[start:start + len(packed)] = np.ascontiguousarray(packed).view(np.uint64)
        return codes

    def update(self, vectors: np.ndarray, biases: np.ndarray) -> int:
        """Adopt the current item vectors (rows in a stable order; new items appended at the end);
        returns how many items were (re-)encoded. New arrays are swapped in at the end, so a
        concurrent ``search`` sees either the old index or the new one."""
        vectors = np.asarray(vectors, dtype=np.float32)
        biases = np.asarray(biases, dtype=np.float32)
        norms = np.sqrt(np.einsum("ij,ij->i", vectors, vectors, dtype=np.float64) + biases.astype(np.float64) ** 2)
        top = float(norms.max()) if len(norms) else 0.0
        old = len(self.points)
        points = np.empty((len(vectors), self.dim + 2))
        codes = np.empty((len(vectors), self.bits // 64), dtype=np.uint64)
        if top > self.scale or not old:
            self.scale = max(top * self.headroom, 1e-12)
            stale = np.arange(len(vectors))
        else:
            current = self._points(vectors[:old], biases[:old])
            moved = np.einsum("ij,ij->i", current, self.points) < self.refresh_cos
            stale = np.r_[np.flatnonzero(moved), np.arange(old, len(vectors))]
            points[:old], codes[:old] = self.points, self.codes
        if len(stale):
            fresh = self._points(vectors[stale], biases[stale])
            points[stale] = fresh
            codes[stale] = self._encode(fresh)
        # word-major copy for search: one contiguous XOR + popcount pass per 64-bit word
        self.index = (np.ascontiguousarray(codes.T), vectors, biases)  # swapped in one assignment
        self.points, self.codes, self.vectors, self.biases = points, codes, vectors, biases
        self.reencoded = len(stale)
        return self.reencoded

    def shortlist_size(self, n: int | None = None) -> int:
        n = len(self) if n is None else n
        return int(min(n, max(self.min_shortlist, np.ceil(self.shortlist * n))))

    def search(self, user_vector: np.ndarray, k: int, exclude=None):
        """(item rows, exact scores b_i + p.q_i) of the k best items, best first. ``exclude`` — a
        boolean mask over rows, or a function from short-listed rows to such a mask — removes
        rows (e.g. items the user rated) before the exact re-rank. Returns as many as the
        short-list holds after exclusion (the caller falls back to exact scoring if fewer than k)."""
        words, vectors, biases = self.index
        n = words.shape[1]
        if n == 0:
            return np.empty(0, dtype=np.int64), np.empty(0)
        query = np.r_[np.asarray(user_vector, dtype=np.float64), 1.0, 0.0]
        qcode = np.ascontiguousarray(self.query_sketch.encode(query[None, :])).view(np.uint64)[0]
        distance = np.bitwise_count(words[0] ^ qcode[0]).astype(np.int32)
        for w in range(1, words.shape[0]):
            distance += np.bitwise_count(words[w] ^ qcode[w])
        s = self.shortlist_size(n)
        if s < n:  # distances are small integers: the cut-off from their histogram, not a sort
            cut = int(np.searchsorted(np.cumsum(np.bincount(distance)), s))
            rows = np.flatnonzero(distance <= cut)
        else:
            rows = np.arange(n)
        if exclude is not None:
            rows = rows[~(exclude(rows) if callable(exclude) else exclude[rows])]
        self.last_scored = len(rows)  # scored exactly by the last search (ties at the cut included)
        scores = np.empty(len(rows))
        _score_rows(vectors, biases, rows, np.asarray(user_vector, dtype=np.float32), scores)
        top = np.argpartition(-scores, k)[:k] if len(rows) > k else np.arange(len(rows))
        best = top[np.argsort(-scores[top], kind="stable")]
        return rows[best], scores[best]
