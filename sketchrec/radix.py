"""The stable order of integer keys (timestamps) by a least-significant-digit radix sort in
compiled code: linear in the rows, where numpy's comparison sorts are n log n (a large file's
time order was a visible part of its replay: docs/results.md).

Like sketchrec.csv_lines it sits in the ground tier: its kernel inlines nothing from other
modules, so numba's own per-file cache check is enough, and editing it recompiles nobody else's.
"""

from __future__ import annotations

import numpy as np
from numba import njit

DIGIT_BITS = 11   # 2,048 buckets: a pass's counters and write positions stay in the cache
MAX_SPAN_BITS = 44   # up to four passes; a wider span is left to numpy


def radix_order(keys: np.ndarray) -> np.ndarray | None:
    """``np.argsort(keys, kind="stable")`` (as int32: fewer than 2^31 rows) for integer keys
    whose span (largest less smallest) fits MAX_SPAN_BITS bits, else None.

    >>> radix_order(np.array([5, 3, 5, 3, -1])).tolist()
    [4, 1, 3, 0, 2]
    """
    if keys.dtype.kind not in "iu" or len(keys) < 2 or len(keys) >= 1 << 31:
        return None
    low, high = int(keys.min()), int(keys.max())
    span_bits = (high - low).bit_length()
    if span_bits > MAX_SPAN_BITS:
        return None
    passes = max(-(-span_bits // DIGIT_BITS), 1)
    wide = keys.astype(np.int64 if keys.dtype.kind == "i" else np.uint64, copy=False)
    # each key less the least (no overflow in 64 bits once the span fits), in 32 bits when they
    # fit: the sort's memory is then 16 bytes a row, all but the order freed on return
    shifted = np.empty(len(keys), np.uint32 if span_bits <= 32 else np.uint64)
    kind = shifted.dtype.type
    return _radix(wide, wide.dtype.type(low), shifted,
                  (np.arange(passes) * DIGIT_BITS).astype(shifted.dtype), kind((1 << DIGIT_BITS) - 1))


@njit(cache=True, nogil=True)
def _radix(keys, low, shifted, shifts, mask):
    """The stable order of ``keys``: one read writes each key less ``low`` into ``shifted``
    (unsigned) and counts its digits, then a scatter per digit of ``shifts`` (the digits'
    offsets, in the type of ``shifted``, as ``mask``)."""
    n, passes = shifted.shape[0], shifts.shape[0]
    counts = np.zeros((passes, np.int64(mask) + 2), np.int64)
    order = np.empty(n, np.int32)
    for row in range(n):
        order[row] = row
        shifted[row] = keys[row] - low
        key = shifted[row]
        for p in range(passes):
            counts[p, np.int64((key >> shifts[p]) & mask) + 1] += 1
    spare_keys = np.empty_like(shifted)
    spare_order = np.empty(n, np.int32)
    for p in range(passes):
        starts = counts[p]
        for b in range(starts.shape[0] - 1):
            starts[b + 1] += starts[b]
        shift = shifts[p]
        for k in range(n):   # stable: rows of one digit keep the order of the pass before
            key = shifted[k]
            digit = np.int64((key >> shift) & mask)
            at = starts[digit]
            starts[digit] = at + 1
            spare_keys[at] = key
            spare_order[at] = order[k]
        shifted, spare_keys = spare_keys, shifted
        order, spare_order = spare_order, order
    return order
