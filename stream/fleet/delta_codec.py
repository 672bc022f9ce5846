"""How a fleet delta is written: the changed entries of one array, as dense values, a bitmap or
delta-coded indices (whichever is smallest), and how a replica reads and adds them back.

``publish`` writes ``now - base`` under a name; ``entries_of`` reads the entries back;
``add_entries`` adds them to a target array. ``stream.fleet.deltas.ModelReplica`` walks a model's
arrays with these.
"""

from __future__ import annotations

import numpy as np
from numba import njit

def publish(now: np.ndarray, base: np.ndarray, name: str, dtype=None,
            where: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """The entries where ``now`` differs from ``base``, as ``dtype`` (default: the arrays' own),
    in the smallest of three forms: sparse (``name.i`` gaps between flat indices, uint16 when
    every gap fits, else uint32 (uint64 past 4 G entries), which compress well; ``name.v``
    values), a bitmap (``name.b``, one bit per entry, little-endian bit order; ``name.v``
    values: a delta that moved 1 entry in 8 or more) or dense
    (``name.d``); {} when nothing changed. ``where`` (sorted flat indices) limits the comparison
    to the entries that can have changed. ``base`` becomes ``now``; when ``dtype`` rounds, only
    the values published are added to it, so that what they do not carry goes out with the next
    delta.

    >>> base = np.ones(4)
    >>> publish(np.array([1., 5., 1., 1.]), base, "x"), base
    ({'x.i': array([1], dtype=uint16), 'x.v': array([4.])}, array([1., 5., 1., 1.]))
    """
    flat_now, flat_base = now.reshape(-1), base.reshape(-1)  # views: the arrays are contiguous
    if dtype is None:  # one compiled pass: the take's larger part
        size = flat_now.size if where is None else len(where)
        idx, values = np.empty(size, np.int64), np.empty(size, flat_now.dtype)
        n = _moved(flat_now, flat_base, where, idx, values)
        idx, values = idx[:n], values[:n]
    else:
        where = np.arange(flat_now.size) if where is None else where
        diff = (flat_now[where] - flat_base[where]).astype(dtype)
        moved = np.flatnonzero(diff)
        idx, values = where[moved], diff[moved]
        flat_base[idx] += values
    return encode_entries(name, idx, values, flat_now.size)


def encode_entries(name: str, idx: np.ndarray, values: np.ndarray, size: int) -> dict[str, np.ndarray]:
    """``publish``'s output for the changes ``values`` at sorted flat indices ``idx`` of an
    array of ``size`` entries: the smallest form (a bitmap where 1 entry in 8 or more moved:
    gaps compress to about a byte each below that).

    >>> out = encode_entries("x", np.arange(0, 64, 2), np.ones(32, np.float32), 64)
    >>> sorted(out), entries_of(out, "x", np.zeros(64, np.float32))[0][:3].tolist()
    (['x.b', 'x.v'], [0, 2, 4])
    """
    n, item = len(idx), values.itemsize
    if not n:
        return {}
    bitmap = -(-size // 8)
    if bitmap + n * item < size * item and 8 * n >= size >= 64:
        bits = np.zeros(bitmap, np.uint8)
        _set_bits(bits, idx)
        return {name + ".b": bits, name + ".v": values}
    if n * (4 + item) < size * item:
        gaps = np.empty(n, np.uint32)
        largest = _index_gaps(idx, gaps)
        if largest < 1 << 16:
            # half the bytes for zstd to pack and unpack (most of a take's and an apply's
            # (de)compression) and a smaller delta; a reader sums gaps of any unsigned width
            gaps = gaps.astype(np.uint16)
        elif largest >= 1 << 32:   # an array of over 4 G entries: uint32 gaps would wrap
            gaps = np.diff(idx, prepend=0).astype(np.uint64)
        return {name + ".i": gaps, name + ".v": values}
    out = np.zeros(size, dtype=values.dtype)
    out[idx] = values
    return {name + ".d": out}


@njit(nogil=True, cache=True)
def _moved(now, base, where, idx, values):
    """idx, values = the entries of ``where`` (None: all) where now != base, and their change;
    base = now there. Returns how many (the same arithmetic as numpy's, in float32)."""
    n = 0
    for k in range(now.shape[0] if where is None else where.shape[0]):
        w = k if where is None else where[k]
        change = now[w] - base[w]
        moved = change != 0
        # no branch (faster where most entries moved): written at n, kept if it moved
        idx[n], values[n] = w, change
        base[w] = now[w] if moved else base[w]
        n += moved
    return n


@njit(nogil=True, cache=True)
def _set_bits(bits, idx):
    for i in idx:
        bits[i >> 3] |= np.uint8(1 << (i & 7))


@njit(nogil=True, cache=True)
def _bit_indices(bits, size, out):
    """The set bits' indices into ``out`` (8 entries longer than their number); returns how
    many, or more than ``out`` holds less 8 when the bits do not match it (one set at or after
    ``size``, or too many: a bad delta)."""
    n, limit = 0, out.shape[0] - 8
    for byte in range(bits.shape[0]):
        b = np.int64(bits[byte])
        if b == 0:
            continue
        if n > limit:
            return limit + 1
        for k in range(8):  # no branch per bit (most bytes have several set): written, kept if set
            out[n] = byte * 8 + k
            n += (b >> k) & 1
    if n and out[n - 1] >= size:
        return limit + 1
    return n


@njit(nogil=True, cache=True)
def _add_at(flat, idx, values):
    for n in range(idx.shape[0]):
        flat[idx[n]] += values[n]


@njit(nogil=True, cache=True)
def _add_at2(flat, other, idx, values):
    """``_add_at`` into two arrays in one pass (a replica's model and its base: the indices
    and values are read once)."""
    for n in range(idx.shape[0]):
        flat[idx[n]] += values[n]
        other[idx[n]] += values[n]


@njit(nogil=True, cache=True)
def _index_gaps(idx, out):
    """out = the gaps between sorted indices (the first from 0), as uint32 (np.diff's prepend
    and cast were a take's larger costs after the comparison itself); returns the largest."""
    last, largest = np.int64(0), np.int64(0)
    for n in range(idx.shape[0]):
        gap = idx[n] - last
        out[n] = np.uint32(gap)
        largest = max(largest, gap)
        last = idx[n]
    return largest


@njit(nogil=True, cache=True)
def _gap_indices(gaps, out):
    """out = the running sum of ``gaps`` (uint16 or uint32) as int64: np.cumsum's cast to int64 went
    through a buffered loop that cost more than the apply's additions."""
    total = np.int64(0)
    for n in range(gaps.shape[0]):
        total += np.int64(gaps[n])
        out[n] = total


def entries_of(arrays: dict[str, np.ndarray], name: str, like: np.ndarray):
    """(flat indices or None for dense, values) of ``publish`` output, checked against
    the array they apply to; None when the delta has none. Raises ValueError on a mismatch."""
    if name + ".d" in arrays:
        values = arrays[name + ".d"]
        if values.shape != (like.size,) or not _fits(values, like):
            raise ValueError(f"delta's {name} does not fit this model (shape or dtype)")
        return None, values
    if name + ".b" in arrays:
        bits, values = arrays[name + ".b"], arrays[name + ".v"]
        if bits.dtype != np.uint8 or bits.shape != (-(-like.size // 8),) or values.ndim != 1:
            raise ValueError(f"delta's {name} does not fit this model (bitmap)")
        idx = np.empty(len(values) + 8, np.int64)
        if _bit_indices(bits, like.size, idx) != len(values) or not _fits(values, like):
            raise ValueError(f"delta's {name} does not fit this model (bitmap or dtype)")
        return idx[:len(values)], values
    if name + ".i" not in arrays:
        return None
    idx = _indices(arrays[name + ".i"])
    values = arrays[name + ".v"]
    if values.shape != idx.shape or not _fits(values, like) or (len(idx) and idx[-1] >= like.size):
        raise ValueError(f"delta's {name} does not fit this model (indices or dtype)")
    return idx, values


def _fits(values: np.ndarray, like: np.ndarray) -> bool:
    return values.dtype == like.dtype or (values.dtype == np.float16 and like.dtype == np.float32)


def _indices(gaps: np.ndarray) -> np.ndarray:
    """The flat indices whose gaps a sparse delta carries (``name.i``)."""
    if gaps.dtype not in (np.uint16, np.uint32) or gaps.ndim != 1:
        return np.cumsum(gaps, dtype=np.int64)
    idx = np.empty(len(gaps), np.int64)
    _gap_indices(gaps, idx)
    return idx


def add_entries(target: np.ndarray, found, other: np.ndarray | None = None) -> None:
    """target (and ``other``, of the same shape, alike) += the entries ``entries_of`` found
    (in place; None: nothing)."""
    if found is None:
        return
    idx, values = found
    flat = target.reshape(-1)  # a view: the state arrays are contiguous
    if idx is not None and values.dtype == flat.dtype and flat.dtype.kind == "f":
        # distinct indices: the same sums as flat[idx] += values
        if other is None:
            _add_at(flat, idx, values)
        else:
            _add_at2(flat, other.reshape(-1), idx, values)
        return
    for flat in (flat,) if other is None else (flat, other.reshape(-1)):
        if idx is None:
            flat += values
        else:
            flat[idx] += values


def distinct(values: np.ndarray) -> np.ndarray:
    """Sorted distinct values (np.unique's hash path is slow on uint64/int64 keys)."""
    values = np.sort(values)
    return values[np.concatenate(([True], values[1:] != values[:-1]))] if len(values) else values


def written_indices(arrays: dict[str, np.ndarray], name: str) -> np.ndarray:
    """The flat indices ``publish`` wrote under ``name``."""
    if name + ".d" in arrays:
        return np.flatnonzero(arrays[name + ".d"])
    if name + ".b" in arrays:
        return np.flatnonzero(np.unpackbits(arrays[name + ".b"], bitorder="little"))
    return _indices(arrays[name + ".i"]) if name + ".i" in arrays else np.empty(0, np.int64)
