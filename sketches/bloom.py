"""Bloom filter (thesis §2.3.2.2): set membership with no false negatives.

Sized from (capacity n, false-positive rate p): ``m = ceil(-n ln p / ln(2)^2)`` bits and
``k = round(m / n * ln 2)`` hashes, addressed by double hashing (Kirsch-Mitzenmacher) from the
id's 64-bit key. The bit array is exposed (``bits`` / ``set_bits``) so that a privacy release can
flip bits (BLIP, thesis ch. 3).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from sketchrec.sketches.base import Sketch
from sketchrec.sketches.hashing import as_keys, mix64, salt_of

_ONE = np.uint64(1)
_SEVEN = np.uint64(7)
_THREE = np.uint64(3)


@njit(inline="always", cache=True)
def _probe(key, salt1, salt2, i, m_bits):
    h1 = mix64(key ^ salt1)
    h2 = mix64(key ^ salt2) | _ONE
    return (h1 + np.uint64(i) * h2) % np.uint64(m_bits)


# keys whose probes are hashed before any of their bits is set: a large filter's writes miss the
# caches, and a block of them whose addresses are all known can be in flight at once (interleaved
# with the hashing, each write waited on the one before); the bits set are the same
_BLOCK = 64


@njit(nogil=True, cache=True)
def _add_many(words, keys, salt1, salt2, n_hashes, m_bits):
    bits = np.empty(_BLOCK * n_hashes, np.uint64)
    for start in range(0, keys.shape[0], _BLOCK):
        k = 0
        for n in range(start, min(start + _BLOCK, keys.shape[0])):
            for i in range(n_hashes):
                bits[k] = _probe(keys[n], salt1, salt2, i, m_bits)
                k += 1
        for j in range(k):
            words[bits[j] >> _THREE] |= np.uint8(1) << np.uint8(bits[j] & _SEVEN)


@njit(nogil=True, cache=True)
def _contains_many(words, keys, salt1, salt2, n_hashes, m_bits, out):
    for n in range(keys.shape[0]):
        found = True
        for i in range(n_hashes):
            bit = _probe(keys[n], salt1, salt2, i, m_bits)
            if (words[bit >> _THREE] >> np.uint8(bit & _SEVEN)) & np.uint8(1) == 0:
                found = False
                break
        out[n] = found


class BloomFilter(Sketch):
    """A Bloom filter of ``m_bits`` bits (packed, little-endian bit order) and ``n_hashes`` hashes.

    >>> bf = BloomFilter(capacity=1000, fp_rate=0.01, seed=0)
    >>> bf.m_bits, bf.n_hashes
    (9586, 7)
    >>> bf.add("alice")
    >>> "alice" in bf, bf.contains_many(["alice", "bob"]).tolist()
    (True, [True, False])
    """

    kind = "BloomFilter"

    def __init__(self, capacity: int, fp_rate: float, seed: int = 0):
        if capacity < 1 or not (0 < fp_rate < 1):
            raise ValueError("capacity must be positive and fp_rate in (0, 1)")
        self.capacity, self.fp_rate, self.seed = int(capacity), float(fp_rate), int(seed)
        self.m_bits = max(8, math.ceil(-self.capacity * math.log(self.fp_rate) / math.log(2) ** 2))
        self.n_hashes = max(1, round(self.m_bits / self.capacity * math.log(2)))
        self.cells = np.zeros((self.m_bits + 7) // 8, dtype=np.uint8)
        self._salt1 = np.uint64(salt_of(self.seed, 1))
        self._salt2 = np.uint64(salt_of(self.seed, 2))

    def params(self) -> dict:
        return {"capacity": self.capacity, "fp_rate": self.fp_rate, "seed": self.seed}

    def _combine(self, other: "BloomFilter") -> None:
        # The Bloom filter of a union is the OR of the filters.
        self.cells |= other.cells

    def add_many(self, keys) -> None:
        _add_many(self.cells, as_keys(keys), self._salt1, self._salt2, self.n_hashes, self.m_bits)

    def contains_many(self, keys) -> np.ndarray:
        keys = as_keys(keys)
        out = np.empty(keys.shape[0], dtype=np.bool_)
        _contains_many(self.cells, keys, self._salt1, self._salt2, self.n_hashes, self.m_bits, out)
        return out

    def add(self, key) -> None:
        self.add_many([key])

    def contains(self, key) -> bool:
        return bool(self.contains_many([key])[0])

    def __contains__(self, key) -> bool:
        return self.contains(key)

    @property
    def bits(self) -> np.ndarray:
        """The filter as a bool array of length ``m_bits`` (a copy)."""
        return np.unpackbits(self.cells, bitorder="little")[: self.m_bits].astype(bool)

    def set_bits(self, bits: np.ndarray) -> None:
        """Replace the bit array (e.g. after a BLIP bit-flip release)."""
        bits = np.asarray(bits, dtype=bool)
        if bits.shape != (self.m_bits,):
            raise ValueError(f"expected {self.m_bits} bits, got shape {bits.shape}")
        self.cells = np.packbits(bits, bitorder="little")

    def fill_ratio(self) -> float:
        return float(self.bits.mean())

    def estimated_count(self) -> float:
        """Distinct ids inserted, estimated from the fill ratio: -m/k ln(1 - X/m)."""
        ones = self.fill_ratio()
        if ones >= 1.0:
            return math.inf
        return -self.m_bits / self.n_hashes * math.log1p(-ones)


@njit(nogil=True, cache=True)
def _positions(keys, salt1, salt2, n_hashes, m_bits, out):
    for n in range(keys.shape[0]):
        for i in range(n_hashes):
            out[n, i] = _probe(keys[n], salt1, salt2, i, m_bits)


def codewords(keys, n_hashes: int, m_bits: int, seed: int = 0) -> np.ndarray:
    """The bit positions (n, n_hashes) that each key sets in a Bloom filter of ``m_bits`` bits with
    ``n_hashes`` hashes — the codeword view of thesis eq. 3.1/3.2 that a BLIP release and its
    decoders need (the same double hashing as ``BloomFilter``, with an explicit shape)."""
    keys = as_keys(keys)
    out = np.empty((keys.shape[0], n_hashes), dtype=np.int64)
    _positions(keys, np.uint64(salt_of(seed, 1)), np.uint64(salt_of(seed, 2)), n_hashes, m_bits, out)
    return out
