"""Ratings written as CSV lines in one compiled pass, and rows grouped by a code in linear time:
what ``sketchrec produce`` sends, built for a whole file at once instead of a Python string per
rating (formatting the lines took most of a 10M-rating produce).

A line is ``user,item,rating,timestamp`` followed by a newline, exactly the text of
``f"{user},{item},{rating:g},{timestamp}"``: an int64 column's values are written as their
decimal digits here, any other column comes as text (arrow's UTF-8 buffers) and is copied, and
the ratings come as a small table of their ``:g`` texts (``star_of`` picks a row's entry), so a
float is never formatted in compiled code.

This module sits in the ground tier (beside the reader), outside the learner tiers whose sources
key the kernel cache: its kernels inline nothing from other modules, so numba's own per-file
cache check is enough, and editing it costs no one else a recompile.
"""

from __future__ import annotations

import numpy as np
from numba import njit

_EMPTY_INTS = np.zeros(0, np.int64)
_EMPTY_BYTES = np.zeros(0, np.uint8)


def text_or_ints(column: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
    """A column as the line writer takes it: (ints, offsets, bytes, is_text). Signed integers
    as int64; anything else as arrow's UTF-8 text of it (ValueError or an arrow error when arrow
    cannot tell one type for the column, such as ints mixed with text)."""
    if column.dtype.kind == "i":
        return column.astype(np.int64, copy=False), _EMPTY_INTS, _EMPTY_BYTES, False
    import pyarrow as pa
    if column.dtype.kind == "f":
        raise ValueError("float column: its text is Python's to give")
    text = pa.array(column).cast(pa.large_string())
    if text.null_count:
        raise ValueError("a missing value has no CSV text")
    offsets = np.frombuffer(text.buffers()[1], np.int64, len(text) + 1, text.offset * 8)
    data = text.buffers()[2]
    return _EMPTY_INTS, offsets, (np.frombuffer(data, np.uint8) if data is not None else _EMPTY_BYTES), True


def group_order(codes: np.ndarray, n_codes: int) -> np.ndarray:
    """The rows sorted by ``codes`` (0..n_codes-1), stable: ``np.argsort(codes, kind="stable")``
    in one counting pass.

    >>> group_order(np.array([2, 0, 2, 1, 0]), 3).tolist()
    [1, 4, 3, 0, 2]
    """
    return _group_order(codes.astype(np.int64, copy=False), n_codes)


def csv_lines(order: np.ndarray, users, items, star_of: np.ndarray, stars: list[str],
              timestamps) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, bytes): the lines of rows ``order`` (in that order), line k being
    ``bytes[offsets[k]:offsets[k + 1]]`` with its newline. ``users``, ``items`` and
    ``timestamps`` as ``text_or_ints`` gives them; ``stars[star_of[row]]`` is a row's rating text.

    >>> lines = csv_lines(np.array([1, 0]), text_or_ints(np.array([7, -12])),
    ...                   text_or_ints(np.array(["a", "bé"], object)), np.array([0, 1]),
    ...                   ["4.5", "3"], text_or_ints(np.array([0, 99])))
    >>> bytes(lines[1]).decode()
    '-12,bé,3,99\\n7,a,4.5,0\\n'
    """
    encoded = [s.encode() for s in stars]
    star_offsets = np.zeros(len(encoded) + 1, np.int64)
    star_offsets[1:] = np.cumsum([len(s) for s in encoded])
    star_bytes = np.frombuffer(b"".join(encoded), np.uint8) if star_offsets[-1] else _EMPTY_BYTES
    # numbers gathered into line order by numpy first: the kernel then reads them in sequence
    # (gathering four columns inside it, row by row, cost it twice its time in cache misses)
    order = order.astype(np.int64, copy=False)
    users, items, timestamps = ((col[0][order] if not col[3] else col[0], *col[1:])
                                for col in (users, items, timestamps))
    return _lines(order, *users, *items, star_of[order].astype(np.int64, copy=False), star_offsets,
                  star_bytes, *timestamps)


@njit(cache=True, nogil=True)
def _group_order(codes, n_codes):
    starts = np.zeros(n_codes + 1, np.int64)
    for c in codes:
        starts[c + 1] += 1
    for c in range(n_codes):
        starts[c + 1] += starts[c]
    order = np.empty(codes.shape[0], np.int64)
    for row in range(codes.shape[0]):
        c = codes[row]
        order[starts[c]] = row
        starts[c] += 1
    return order


_INT64_MIN = np.frombuffer(b"-9223372036854775808", np.uint8).copy()   # its magnitude has no int64


@njit(cache=True, nogil=True, inline="always")
def _int_width(value):
    """Characters of an int64's decimal text (sign included), by comparisons: no division."""
    if value == -9223372036854775807 - 1:
        return 20
    width, power = 1, 10
    if value < 0:
        width, value = 2, -value
    while power <= 1_000_000_000_000_000_000 and value >= power:
        width += 1
        power *= 10
    return width


@njit(cache=True, nogil=True, inline="always")
def _width(ints, offsets, is_text, k, row):
    """Characters of line k's field: text at ``row``, or the int at ``k`` (in line order)."""
    if is_text:
        return offsets[row + 1] - offsets[row]
    return _int_width(ints[k])


@njit(cache=True, nogil=True, inline="always")
def _put(out, at, ints, offsets, data, is_text, k, row):
    """Write line k's field (as ``_width``) at ``at``; the position after it."""
    if is_text:
        for k in range(offsets[row], offsets[row + 1]):
            out[at] = data[k]
            at += 1
        return at
    value = ints[k]
    if value == -9223372036854775807 - 1:
        for k in range(_INT64_MIN.shape[0]):
            out[at + k] = _INT64_MIN[k]
        return at + _INT64_MIN.shape[0]
    if value < 0:
        out[at] = 45                                    # '-'
        at += 1
        value = -value
    end = at + _int_width(value)
    pos, rest = end - 1, np.uint64(value)
    while True:                  # unsigned: a division by a constant is a multiply, no sign fix-up
        tenth = rest // np.uint64(10)
        out[pos] = np.uint8(rest - tenth * np.uint64(10)) + np.uint8(48)
        rest = tenth
        pos -= 1
        if rest == np.uint64(0):
            break
    return end


@njit(cache=True, nogil=True)
def _lines(order, u_ints, u_offsets, u_data, u_text, i_ints, i_offsets, i_data, i_text,
           star_of, s_offsets, s_data, t_ints, t_offsets, t_data, t_text):
    n = order.shape[0]
    offsets = np.empty(n + 1, np.int64)
    offsets[0] = 0
    for k in range(n):                                  # each line's length, then its bytes
        row = order[k]
        star = star_of[k]
        offsets[k + 1] = (offsets[k] + 4 + _width(u_ints, u_offsets, u_text, k, row)
                          + _width(i_ints, i_offsets, i_text, k, row) + s_offsets[star + 1]
                          - s_offsets[star] + _width(t_ints, t_offsets, t_text, k, row))
    out = np.empty(offsets[n], np.uint8)
    for k in range(n):
        row = order[k]
        at = _put(out, offsets[k], u_ints, u_offsets, u_data, u_text, k, row)
        out[at] = 44                                    # ','
        at = _put(out, at + 1, i_ints, i_offsets, i_data, i_text, k, row)
        out[at] = 44
        at = _put(out, at + 1, s_offsets, s_offsets, s_data, True, k, star_of[k])
        out[at] = 44
        at = _put(out, at + 1, t_ints, t_offsets, t_data, t_text, k, row)
        out[at] = 10                                    # '\n'
    return offsets, out
