"""A file's text ids as dense integer codes: each distinct id's UTF-8 bytes are kept once in a
compiled hash table (``Vocabulary``), and a block's rows become int32 codes into it, so a text
id costs a Python object per distinct id (only when someone asks for the ids themselves:
``Vocabulary.names``), never one per rating, and what is counted, sorted and hashed per rating
is an integer.

Why a table of our own and not arrow's ``index_in``: that builds its hash table from the value
set at every call, and a file's ids are looked up a block at a time against all the ids seen
before (a quarter of a million for an ML-25M-shaped file), so each block would rebuild it.
Here arrow's ``dictionary_encode`` finds a block's distinct ids (a small table, in C++), and
only those are looked up in the file's table, in numba.

A decimal id of 1 to 18 digits is kept as its int's text (``"007"`` is ``"7"``): an int and
its decimal text are one id (sketchrec.sketches.hashing), and a file whose ids are decimal in
one block and text in another holds each id once.

Like sketchrec.csv_lines it sits in the ground tier: its kernels inline nothing from other
modules, so numba's own per-file cache check is enough, and editing it recompiles no one else's.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numba import njit

MAX_DECIMAL = 18   # digits of a decimal id kept as its int's text (an int64 without overflow)
_EMPTY = -1        # a free slot of the table


MAX_IDS = 2**31 - 2   # distinct ids of one vocabulary: int32 codes (and the table's "empty")


class Vocabulary:
    """The distinct text ids of a file, each once, numbered 0, 1, 2, ... as first seen.

    Examples
    --------
    >>> vocab = Vocabulary()
    >>> vocab.codes(pa.array(["ann", "bob", "ann", "007"])).tolist()
    [0, 1, 0, 2]
    >>> vocab.codes(pa.array(["7", "cy"])).tolist(), vocab.names().tolist()
    ([2, 3], ['ann', 'bob', '7', 'cy'])
    >>> vocab.int_codes(np.array([7, 12])).tolist(), len(vocab)
    ([2, 4], 5)
    """

    def __init__(self) -> None:
        self.count = 0
        self.offsets = np.zeros(1 << 10, np.int64)     # name n is data[offsets[n]:offsets[n + 1]]
        self.data = np.zeros(1 << 14, np.uint8)
        self.hashes = np.zeros(1 << 10, np.uint64)     # each name's hash (the table grows by it)
        self.table = np.full(1 << 11, _EMPTY, np.int32)   # open addressing, at most half full
        self._names = np.empty(0, dtype=object)

    def __len__(self) -> int:
        return self.count

    def codes(self, text: pa.Array) -> np.ndarray:
        """The codes (int32) of a column of text ids (arrow string or binary, no nulls); ids
        not seen before are added."""
        if len(text) == 0:
            return np.zeros(0, np.int32)
        encoded = pc.dictionary_encode(text)
        mine = self._code_distinct(encoded.dictionary)
        return mine[encoded.indices.to_numpy(zero_copy_only=False)]

    def int_codes(self, values: np.ndarray) -> np.ndarray:
        """The codes of integer ids, as the codes of their decimal text."""
        return self.codes(pa.array(np.asarray(values, np.int64)).cast(pa.string()))

    def _code_distinct(self, distinct: pa.Array) -> np.ndarray:
        offsets, data = utf8_buffers(distinct)
        n = len(offsets) - 1
        self._reserve(n, int(offsets[-1] - offsets[0]))
        out = np.empty(n, np.int32)
        self.count = _code(offsets, data, self.table, self.hashes, self.offsets, self.data,
                           self.count, out)
        return out

    def _reserve(self, names: int, nbytes: int) -> None:
        """Room for ``names`` more names of ``nbytes`` bytes in all (the kernel never grows).
        Codes are int32: more distinct ids than that are refused, never wrapped."""
        need = self.count + names
        if need > MAX_IDS:
            raise ValueError(f"more than {MAX_IDS:,} distinct text ids in one file: codes are int32 "
                             "(split the file, or replay it with --order file)")
        if need + 1 > len(self.offsets):
            self.offsets = _grown(self.offsets, need + 1)
            self.hashes = _grown(self.hashes, need)
        used = int(self.offsets[self.count])
        if used + nbytes > len(self.data):
            self.data = _grown(self.data, used + nbytes)
        if 2 * need > len(self.table):
            size = len(self.table)
            while 2 * need > size:
                size *= 2
            self.table = np.full(size, _EMPTY, np.int32)
            _rehash(self.table, self.hashes, self.count)

    def names(self) -> np.ndarray:
        """Every id as a Python str (an object array indexed by code), built once per id."""
        if len(self._names) < self.count:
            start = len(self._names)
            fresh = self.text(start).to_numpy(zero_copy_only=False)
            self._names = np.concatenate([self._names, fresh.astype(object, copy=False)])
        return self._names[:self.count]

    def text(self, start: int = 0) -> pa.Array:
        """The ids from code ``start`` on, as an arrow large_string array over this table's bytes."""
        offsets = self.offsets[start:self.count + 1]
        return pa.LargeStringArray.from_buffers(
            self.count - start, pa.py_buffer(offsets), pa.py_buffer(self.data[:max(int(offsets[-1]), 1)]))


class Coded:
    """A column of text ids held as codes into a vocabulary (see sketchrec.ratings.Ratings).

    >>> vocab = Vocabulary()
    >>> Coded(vocab.codes(pa.array(["b", "a", "b"])), vocab).ids().tolist()
    ['b', 'a', 'b']
    """

    __slots__ = ("codes", "vocab")

    def __init__(self, codes: np.ndarray, vocab: Vocabulary) -> None:
        self.codes, self.vocab = codes, vocab

    def __len__(self) -> int:
        return len(self.codes)

    def ids(self) -> np.ndarray:
        """The ids, as an object array of str (the rows share each id's one object)."""
        return self.vocab.names()[self.codes]


def utf8_buffers(text: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(int64 offsets, bytes) of an arrow string or binary array without nulls."""
    if text.null_count:
        raise ValueError("a missing id has no text")
    wide = pa.types.is_large_string(text.type) or pa.types.is_large_binary(text.type)
    width = 8 if wide else 4
    offsets = np.frombuffer(text.buffers()[1], np.int64 if wide else np.int32, len(text) + 1,
                            text.offset * width).astype(np.int64)
    data = text.buffers()[2]
    return offsets, (np.frombuffer(data, np.uint8) if data is not None and data.size else np.zeros(1, np.uint8))


def all_decimal(offsets: np.ndarray, data: np.ndarray) -> bool:
    """Whether every id is 1..MAX_DECIMAL ASCII digits (the column is then integers).

    >>> all_decimal(*utf8_buffers(pa.array(["12", "007"]))), all_decimal(*utf8_buffers(pa.array(["1", "x"])))
    (True, False)
    """
    return bool(_all_decimal(offsets, data))


def _grown(array: np.ndarray, need: int) -> np.ndarray:
    out = np.zeros(max(need, 2 * len(array)), array.dtype)
    out[:len(array)] = array
    return out


def count_distinct(codes: np.ndarray, size: int) -> int:
    """How many distinct codes below ``size`` a column holds (one pass, no sort).

    >>> count_distinct(np.array([3, 1, 3], np.int32), 5)
    2
    """
    seen = np.zeros(size, bool)
    seen[codes] = True
    return int(np.count_nonzero(seen))


# --- kernels -------------------------------------------------------------------------------------
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


@njit(cache=True, nogil=True, inline="always")
def _mix(z):
    """splitmix64's finaliser: every bit of a word moves the low bits the table uses."""
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


@njit(cache=True, nogil=True, inline="always")
def _hash(data, start, end):
    """A 64-bit hash of data[start:end], eight bytes at a time (the table's own, not a key)."""
    h = np.uint64(end - start) * _GOLDEN
    k = start
    while k < end:
        word = np.uint64(0)
        for b in range(min(8, end - k)):
            word |= np.uint64(data[k + b]) << np.uint64(8 * b)
        h = _mix(h ^ word)
        k += 8
    return h


@njit(cache=True, nogil=True)
def _code(offsets, data, table, hashes, v_offsets, v_data, count, out):
    """Each of the distinct ids data[offsets[n]:offsets[n + 1]] looked up, or added, in the
    table; its code in ``out``; the new count of names. A decimal id of 1..MAX_DECIMAL digits is
    looked up as its int's text (leading zeros dropped)."""
    mask = table.shape[0] - 1
    for n in range(offsets.shape[0] - 1):
        start, end = offsets[n], offsets[n + 1]
        if 0 < end - start <= MAX_DECIMAL:
            decimal = True
            for k in range(start, end):
                if data[k] < 48 or data[k] > 57:
                    decimal = False
                    break
            if decimal:
                while start < end - 1 and data[start] == 48:   # '0'
                    start += 1
        h = _hash(data, start, end)
        slot = np.int64(h & np.uint64(mask))
        while True:
            code = table[slot]
            if code == _EMPTY:
                at = v_offsets[count]
                v_data[at:at + end - start] = data[start:end]
                v_offsets[count + 1] = at + end - start
                hashes[count] = h
                table[slot] = count
                out[n] = count
                count += 1
                break
            if hashes[code] == h:
                first, last = v_offsets[code], v_offsets[code + 1]
                same = last - first == end - start
                if same:
                    for k in range(end - start):
                        if v_data[first + k] != data[start + k]:
                            same = False
                            break
                if same:
                    out[n] = code
                    break
            slot = (slot + 1) & mask
    return count


@njit(cache=True, nogil=True)
def _all_decimal(offsets, data):
    for n in range(offsets.shape[0] - 1):
        start, end = offsets[n], offsets[n + 1]
        if end - start < 1 or end - start > MAX_DECIMAL:
            return False
        for k in range(start, end):
            if data[k] < 48 or data[k] > 57:
                return False
    return True


@njit(cache=True, nogil=True)
def _rehash(table, hashes, count):
    mask = table.shape[0] - 1
    for code in range(count):
        slot = np.int64(hashes[code] & np.uint64(mask))
        while table[slot] != _EMPTY:
            slot = (slot + 1) & mask
        table[slot] = code
