"""A block of plain decimal lines parsed in one compiled pass: the common file (integer ids,
ratings such as ``4.5``, integer timestamps) without arrow's split into lists and its casts,
which copied every field twice (docs/results.md has what it costs and saves).

The pass takes a line only when its text leaves nothing to interpret: exactly the layout's
number of fields, every field read a run of ASCII digits (ids and timestamps: 1 to 18 digits, so
an int64 of the same value arrow's cast gives; a rating: an optional minus, digits and optional
decimals, at most 15 digits in all, no exponent). Such a rating, m / 10^k with m and 10^k exact
doubles, is one correctly rounded division: the double arrow's cast (itself correctly rounded)
gives. Anything else (a sign, a space, a carriage return, an empty or long field, text ids)
stops the pass, and the caller reads the block the general way (``sketchrec.chunks``), which
finds every reason; so a block gives the same columns whichever way it is read.

Like sketchrec.csv_lines it sits in the ground tier: its kernel inlines nothing from other
modules, so numba's own per-file cache check is enough, and editing it recompiles nobody else's.
"""

from __future__ import annotations

import numpy as np
from numba import njit

import pyarrow as pa

_POW10 = np.array([10.0 ** k for k in range(16)])   # exact doubles: 10^k for k <= 22
MAX_DIGITS = 18          # an id or timestamp field (int64 without overflow)
MAX_RATING_DIGITS = 15   # a rating's digits (its mantissa below 2^53)
# roles in the kernel's order; a role the layout lacks is -1 (its column stays zero)
ROLES = ("user", "item", "rating", "timestamp")


def decimal_block(lines: pa.Array, sep: str, width: int, index: dict[str, int]):
    """(users, items, ratings, timestamps) of a block of lines (an arrow binary array) when the
    compiled pass takes every line, else None (read the block the general way).

    >>> lines = pa.array([b"1,10,4.5,99", b"2,7,3,100"], pa.binary())
    >>> users, items, ratings, stamps = decimal_block(lines, ",", 4, {"user": 0, "item": 1,
    ...                                               "rating": 2, "timestamp": 3})
    >>> users.tolist(), items.tolist(), ratings.tolist(), stamps.tolist()
    ([1, 2], [10, 7], [4.5, 3.0], [99, 100])
    >>> decimal_block(pa.array([b"1,x,4,5"], pa.binary()), ",", 4, {"user": 0, "item": 1,
    ...               "rating": 2, "timestamp": 3}) is None
    True
    """
    n = len(lines)
    if lines.null_count or not pa.types.is_binary(lines.type) or not sep or n == 0:
        return None
    _, offsets_buffer, data_buffer = lines.buffers()
    offsets = np.frombuffer(offsets_buffer, np.int32, n + 1, lines.offset * 4)
    data = (np.frombuffer(data_buffer, np.uint8) if data_buffer is not None and data_buffer.size
            else np.zeros(1, np.uint8))
    where = np.array([index.get(role, -1) for role in ROLES], np.int64)
    users, items, stamps = (np.zeros(n, np.int64) for _ in range(3))
    ratings = np.zeros(n, np.float64)
    ok = _parse(offsets, data, np.frombuffer(sep.encode(), np.uint8), width, where,
                users, items, ratings, stamps, _POW10)
    return (users, items, ratings, stamps) if ok else None


@njit(cache=True, nogil=True, inline="always")
def _digits(data, start, end):
    """The int64 of a field of 1..MAX_DIGITS ASCII digits, or -1."""
    if end <= start or end - start > MAX_DIGITS:
        return -1
    value = 0
    for k in range(start, end):
        d = data[k] - 48
        if d < 0 or d > 9:
            return -1
        value = value * 10 + d
    return value


@njit(cache=True, nogil=True, inline="always")
def _rating(data, start, end, pow10):
    """(ok, value) of a field [-]digits[.digits] of at most MAX_RATING_DIGITS digits."""
    negative = start < end and data[start] == 45           # '-'
    if negative:
        start += 1
    mantissa, digits, decimals, point = 0, 0, 0, -1
    for k in range(start, end):
        c = data[k]
        if c == 46 and point < 0:                          # '.'
            point = k
            continue
        d = c - 48
        if d < 0 or d > 9:
            return False, 0.0
        mantissa = mantissa * 10 + d
        digits += 1
        if point >= 0:
            decimals += 1
    # digits on both sides of a point (".5" and "5." are left to the general reader)
    if digits == 0 or digits > MAX_RATING_DIGITS or point == start or (point >= 0 and decimals == 0):
        return False, 0.0
    value = float(mantissa) / pow10[decimals] if decimals else float(mantissa)
    return True, -value if negative else value


@njit(cache=True, nogil=True)
def _parse(offsets, data, sep, width, where, users, items, ratings, stamps, pow10):
    n_sep = sep.shape[0]
    for row in range(offsets.shape[0] - 1):
        start, end = offsets[row], offsets[row + 1]
        field, at = 0, start
        k = start
        while True:
            # the field ends at the next separator (matched left to right) or the line's end
            stop = end
            if n_sep == 1:
                first = sep[0]
                while k < end:
                    if data[k] == first:
                        stop = k
                        break
                    k += 1
            else:
                while k <= end - n_sep:
                    match = True
                    for s in range(n_sep):
                        if data[k + s] != sep[s]:
                            match = False
                            break
                    if match:
                        stop = k
                        break
                    k += 1
            if field >= width:
                return False
            if field == where[0] or field == where[1] or field == where[3]:
                value = _digits(data, at, stop)
                if value < 0:
                    return False
                if field == where[0]:
                    users[row] = value
                elif field == where[1]:
                    items[row] = value
                else:
                    stamps[row] = value
            elif field == where[2]:
                ok, value = _rating(data, at, stop, pow10)
                if not ok:
                    return False
                ratings[row] = value
            field += 1
            if stop == end:
                break
            k = at = stop + n_sep
        if field != width:
            return False
    return True
