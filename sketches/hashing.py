"""Deterministic hashing of ids into 64-bit keys, and of keys into sketch addresses and signs.

Every id (an int or a string) is turned into a 64-bit key by ONE MurmurHash3 call (x64, 128-bit,
low half kept). Ints and their decimal strings are the same id (``5`` and ``"5"`` give the same key),
because ids arrive as text from files and Kafka and as integers from numpy arrays.

Row addresses and +/-1 signs are derived from the key inside numba with the splitmix64 finaliser,
salted per (seed, family, row, component). Nothing here uses Python's salted ``hash()``, so keys,
addresses and signs are identical across processes and machines.
"""

from __future__ import annotations

import hashlib
from typing import Hashable, Iterable

import mmh3
import numpy as np
from numba import njit

KEY_DTYPE = np.uint64
_MASK64 = (1 << 64) - 1


# str(int) refuses ints over sys.get_int_max_str_digits() digits (a guard against quadratic
# conversion of untrusted input); ids are hashed, not parsed, so a huge int is converted in chunks of
# this many digits instead (quadratic only in the number of chunks, bounded by the message size).
_CHUNK_DIGITS = 1000
_CHUNK = 10**_CHUNK_DIGITS


def _decimal(value: int) -> str:
    """Decimal text of an int of any size (the text str() gives whenever str() accepts it)."""
    if -_CHUNK < value < _CHUNK:
        return str(value)
    sign, value = ("-", -value) if value < 0 else ("", value)
    parts = []
    while value >= _CHUNK:
        value, low = divmod(value, _CHUNK)
        parts.append(str(low).zfill(_CHUNK_DIGITS))
    parts.append(str(value))
    return sign + "".join(reversed(parts))


def id_bytes(item_id: Hashable) -> bytes:
    """Canonical byte form of an id: ints (and numpy ints) as decimal text, strings as UTF-8.

    Every Python str is an id: lone surrogates (which strict UTF-8 refuses) are encoded with
    'surrogatepass', so any text a decoder let through hashes instead of raising; a str without
    surrogates gives exactly its UTF-8 bytes, so no key that existed before changes.
    """
    if isinstance(item_id, (bool, np.bool_)):
        raise TypeError("booleans are not ids")
    if isinstance(item_id, (int, np.integer)):
        return _decimal(int(item_id)).encode()
    if isinstance(item_id, str):
        return item_id.encode("utf-8", "surrogatepass")
    if isinstance(item_id, bytes):
        return item_id
    raise TypeError(f"ids must be int or str, not {type(item_id).__name__}")


def key_of(item_id: Hashable, seed: int = 0) -> int:
    """The 64-bit key of one id (one mmh3 call); an int and its decimal text are the same id.

    >>> key_of(5) == key_of("5") != key_of(6)
    True
    """
    low, _high = mmh3.hash64(id_bytes(item_id), seed, signed=False)
    return low


def keys_of(ids: Iterable[Hashable] | np.ndarray, seed: int = 0) -> np.ndarray:
    """Keys of many ids as a uint64 array. Each distinct id is hashed once."""
    arr = ids if isinstance(ids, np.ndarray) else np.asarray(list(ids), dtype=object)
    if arr.size == 0:
        return np.empty(0, dtype=KEY_DTYPE)
    if arr.dtype.kind in "iu":
        wide = np.int64 if arr.dtype.kind == "i" else np.uint64  # one compiled kernel per kind
        return _int_keys(arr.reshape(-1).astype(wide, copy=False), np.uint64(seed))
    text = _as_utf8(arr.reshape(-1))
    if text is not None:   # every id a str: hashed in compiled code from arrow's UTF-8 buffers
        offsets, data = text
        return _text_keys(offsets, data, np.uint64(seed))
    cache: dict = {}
    out = np.empty(arr.size, dtype=KEY_DTYPE)
    for n, item_id in enumerate(arr.reshape(-1)):
        key = cache.get(item_id)
        if key is None:
            key = cache[item_id] = key_of(item_id, seed)
        out[n] = key
    return out


def _as_utf8(flat: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """(offsets, bytes) of the UTF-8 text of ids that are all str (arrow encodes them in C: the
    same bytes ``id_bytes`` gives a str), or None for anything else (ints, bytes or None among
    them, a lone surrogate), which the per-id loop of ``keys_of`` hashes or refuses as before."""
    import pyarrow as pa
    if flat.dtype.kind not in "OU":
        return None
    try:
        text = pa.array(flat, type=pa.large_string())
    except (pa.ArrowException, TypeError, ValueError, OverflowError):   # UnicodeError: a ValueError
        return None
    if text.null_count:
        return None
    offsets = np.frombuffer(text.buffers()[1], np.int64, len(text) + 1, text.offset * 8)
    data = text.buffers()[2]
    return offsets, (np.frombuffer(data, np.uint8) if data is not None else np.zeros(1, np.uint8))


def keyed_key_of(item_id: Hashable, secret: bytes) -> int:
    """The 64-bit key of one id under a secret: keyed BLAKE2b, a pseudorandom function.

    ``key_of``'s MurmurHash3 is public and invertible (whoever knows the code constructs an id with
    any key, or two ids with one key, seed or no seed); without ``secret`` nobody can. Same
    canonical bytes as ``key_of`` (5 and "5" are one id)."""
    digest = hashlib.blake2b(id_bytes(item_id), digest_size=8, key=secret, person=b"sketchrec-id").digest()
    return int.from_bytes(digest, "little")


def keyed_keys_of(ids: Iterable[Hashable] | np.ndarray, secret: bytes) -> np.ndarray:
    """Keys of many ids under a secret (``keyed_key_of``), as a uint64 array; each distinct id is
    hashed once."""
    arr = ids if isinstance(ids, np.ndarray) else np.asarray(list(ids), dtype=object)
    flat = arr.reshape(-1)
    if flat.size == 0:
        return np.empty(0, dtype=KEY_DTYPE)
    if flat.dtype.kind in "iu":   # few distinct ids per batch: hash each once
        distinct, inverse = np.unique(flat, return_inverse=True)
        keys = np.array([keyed_key_of(int(v), secret) for v in distinct], dtype=KEY_DTYPE)
        return keys[inverse.reshape(-1)]
    cache: dict = {}
    out = np.empty(flat.size, dtype=KEY_DTYPE)
    for n, item_id in enumerate(flat):
        key = cache.get((type(item_id), item_id))
        if key is None:
            key = cache[(type(item_id), item_id)] = keyed_key_of(item_id, secret)
        out[n] = key
    return out


def salt_of(*parts: int) -> int:
    """A 64-bit salt from small integers (seed, family, row, ...), via mmh3 so it is stable."""
    text = ",".join(str(int(p)) for p in parts).encode()
    return mmh3.hash64(text, 0x5EED, signed=False)[0]


def salt_table(seed: int, family: int, rows: int, cols: int) -> np.ndarray:
    """Salts for every (row, component) address of one hash family, shape (rows, cols)."""
    table = np.empty((rows, cols), dtype=KEY_DTYPE)
    for j in range(rows):
        for c in range(cols):
            table[j, c] = salt_of(seed, family, j, c)
    return table


# --- numba kernels -------------------------------------------------------------------------------
# MurmurHash3 x64-128 of an integer id's decimal text, inside numba. mmh3 hashes one bytes object per
# Python call (~0.5 us, and it holds the GIL); ids from files and Kafka arrive as int arrays, and the
# learner's batch path hashed 2 ids per rating that way (a fifth of its time). This port is checked
# against mmh3 on every integer range in tests/test_sketches.py, so keys are unchanged.
# All arithmetic stays in uint64 (mixing in Python ints would make numba promote to float64).
_U64 = np.uint64
_MM_C1, _MM_C2 = _U64(0x87C37B91114253D5), _U64(0x4CF5AD432745937F)
# (shift, multiplier, shift, multiplier, shift) of the two 64-bit finalisers (see _finalise)
_MURMUR_FMIX = (_U64(33), _U64(0xFF51AFD7ED558CCD), _U64(33), _U64(0xC4CEB9FE1A85EC53), _U64(33))
_SPLITMIX = (_U64(30), _U64(0xBF58476D1CE4E5B9), _U64(27), _U64(0x94D049BB133111EB), _U64(31))


@njit(inline="always", cache=True)
def _finalise(z, constants):
    """xor-shift, multiply, xor-shift, multiply, xor-shift: the finaliser shape MurmurHash3's
    fmix64 and splitmix64 share, each with its own constants (global tuples: folded at compile)."""
    a, m1, b, m2, c = constants
    z = (z ^ (z >> a)) * m1
    z = (z ^ (z >> b)) * m2
    return z ^ (z >> c)


@njit(inline="always", cache=True)
def _rotl(x, r):
    return (x << _U64(r)) | (x >> _U64(64 - r))


@njit(inline="always", cache=True)
def _word(text, start, stop):
    """Little-endian word from text[start:stop] (at most 8 bytes)."""
    w = _U64(0)
    for b in range(stop - start):
        w |= _U64(text[start + b]) << _U64(8 * b)
    return w


@njit(cache=True)
def _murmur3_low(text, n, seed):
    """Low 64 bits of MurmurHash3_x64_128(text[:n], seed), as mmh3.hash64(...)[0] unsigned."""
    h1, h2 = seed, seed
    full = n // 16
    for blk in range(full):
        k1 = _word(text, 16 * blk, 16 * blk + 8) * _MM_C1
        h1 ^= _rotl(k1, 31) * _MM_C2
        h1 = (_rotl(h1, 27) + h2) * _U64(5) + _U64(0x52DCE729)
        k2 = _word(text, 16 * blk + 8, 16 * blk + 16) * _MM_C2
        h2 ^= _rotl(k2, 33) * _MM_C1
        h2 = (_rotl(h2, 31) + h1) * _U64(5) + _U64(0x38495AB5)
    rest = n - 16 * full
    if rest > 8:
        k2 = _word(text, 16 * full + 8, n) * _MM_C2
        h2 ^= _rotl(k2, 33) * _MM_C1
    if rest > 0:
        k1 = _word(text, 16 * full, 16 * full + min(rest, 8)) * _MM_C1
        h1 ^= _rotl(k1, 31) * _MM_C2
    h1 ^= _U64(n)
    h2 ^= _U64(n)
    h1 += h2
    h2 += h1
    h1, h2 = _finalise(h1, _MURMUR_FMIX), _finalise(h2, _MURMUR_FMIX)
    return h1 + h2


@njit(nogil=True, cache=True)
def _int_keys(values, seed):
    """Keys of integer ids (int64 or uint64): MurmurHash3 of their decimal text, as key_of does."""
    out = np.empty(values.shape[0], dtype=np.uint64)
    digits = np.empty(20, dtype=np.uint8)
    text = np.empty(21, dtype=np.uint8)
    for n in range(values.shape[0]):
        negative = values[n] < 0
        # |x| as uint64: the cast wraps, so 0 - x is exact for int64's minimum too
        x, count = (_U64(0) - _U64(values[n])) if negative else _U64(values[n]), 0
        while True:
            digits[count] = _U64(48) + x % _U64(10)
            count += 1
            x //= _U64(10)
            if x == 0:
                break
        length = 0
        if negative:
            text[0] = 45  # "-"
            length = 1
        for c in range(count):
            text[length + c] = digits[count - 1 - c]
        out[n] = _murmur3_low(text, length + count, seed)
    return out


@njit(nogil=True, cache=True)
def _text_keys(offsets, data, seed):
    """Keys of str ids from their UTF-8 bytes (``data[offsets[n]:offsets[n + 1]]``), as key_of."""
    out = np.empty(offsets.shape[0] - 1, dtype=np.uint64)
    for n in range(out.shape[0]):
        start = offsets[n]
        out[n] = _murmur3_low(data[start:], offsets[n + 1] - start, seed)
    return out


_S11, _S32 = _U64(11), _U64(32)
_INV53 = 1.0 / 9007199254740992.0  # 2**-53


@njit(inline="always", cache=True)
def mix64(z):
    """splitmix64's finaliser: a bijection on 64-bit words with full avalanche."""
    return _finalise(z, _SPLITMIX)


@njit(inline="always", cache=True)
def reduce32(h, width):
    """Map the high 32 bits of h onto [0, width) by multiply-shift (Lemire), avoiding a division."""
    return np.int64(((h >> _S32) * np.uint64(width)) >> _S32)


@njit(inline="always", cache=True)
def unit_interval(h):
    """A uniform draw in [0, 1) from the top 53 bits of a 64-bit hash."""
    return np.float64(h >> _S11) * _INV53


@njit(inline="always", cache=True)
def address(key, salt, width):
    """Cell address in [0, width) of a key under one salt (no sign: count-min, Bloom)."""
    return reduce32(mix64(key ^ salt), width)


@njit(cache=True)
def _pair_keys(a, b):
    out = np.empty(a.shape[0], dtype=np.uint64)
    rot = np.uint64(29)
    for n in range(a.shape[0]):
        out[n] = mix64(a[n] ^ ((b[n] << rot) | (b[n] >> np.uint64(35))) ^ np.uint64(0x9E3779B97F4A7C15))
    return out


def pair_keys(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """Keys of ordered pairs (e.g. (user, item)) from the keys of their parts."""
    a = np.ascontiguousarray(first, dtype=KEY_DTYPE)
    b = np.ascontiguousarray(second, dtype=KEY_DTYPE)
    if a.shape != b.shape:
        raise ValueError("pair_keys needs arrays of the same shape")
    return _pair_keys(a.reshape(-1), b.reshape(-1)).reshape(a.shape)


def as_keys(ids_or_keys) -> np.ndarray:
    """Accept either a uint64 key array (used as is) or ids of any kind (hashed)."""
    if isinstance(ids_or_keys, np.ndarray) and ids_or_keys.dtype == KEY_DTYPE:
        return np.ascontiguousarray(ids_or_keys)
    if np.isscalar(ids_or_keys) or isinstance(ids_or_keys, (str, bytes)):
        return np.array([key_of(ids_or_keys)], dtype=KEY_DTYPE)
    return keys_of(ids_or_keys)
