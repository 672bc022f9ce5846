"""A fleet's model delta as bytes: the envelope around the frame that ``tracker.DeltaTracker``
takes and applies (``encode``, ``decode``).

Format (version 3): ``b"SKRD"``, a version byte, a codec byte (0 raw, 1 zstd, 2 zlib), the
length of its packed head (u32, little-endian), the head (compressed when that is smaller), then
the rest of the body as it is. The body is a ``sketches.serial`` blob, a ``sketchrec.frame`` (JSON
header: member, sequence, model parameters, new catalogue ids, caller's ``meta``; then raw
little-endian arrays, the float arrays and 64-bit keys last), whose CRC-32 covers all of it: the
envelope keeps no checksum of its own. The head is all of the body but those arrays, which zstd
shrank little (floats) or not at all (hashed keys) for as much CPU as the rest of a take. Written
from the frame's chunks, so the arrays are copied once (into the blob); a raw body is read in
place. Version 2 (the same with a CRC-32 of the body before the head length, computed a second
time on each side) and version 1 (a model topic written before: no head length, the whole body
packed) are still read.
"""

from __future__ import annotations

import struct
import threading
import zlib

import numpy as np

from sketchrec import frame
from sketchrec.sketches import serial

MAGIC, VERSION = b"SKRD", 3   # 3: no CRC of its own (the frame's); 2: floats not compressed
RAW, ZSTD, ZLIB = 0, 1, 2
_KIND = "ModelDelta"

try:  # kafka-python[zstd] brings it; zlib otherwise
    import zstandard
except ImportError:  # pragma: no cover
    zstandard = None
# zstd contexts, one of each per thread (a context is not thread-safe), reused: making one per
# delta cost as much as (de)compressing a small delta's head
_zstd = threading.local()


def _zstd_context(kind: str):
    """This thread's zstd compressor ("compress", level 1) or decompressor ("decompress")."""
    context = getattr(_zstd, kind, None)
    if context is None:
        context = zstandard.ZstdCompressor(level=1) if kind == "compress" else zstandard.ZstdDecompressor()
        setattr(_zstd, kind, context)
    return context


def decode(blob: bytes) -> tuple[dict, dict[str, np.ndarray]]:
    """(header, arrays) of a delta; ValueError (one line) for anything that is not one."""
    if not isinstance(blob, (bytes, bytearray, memoryview)) or bytes(blob[:4]) != MAGIC or len(blob) < 10:
        raise ValueError("not a sketchrec model delta (bad magic)")
    view = memoryview(blob).cast("B")
    version, crc = view[4], None
    if version == VERSION:   # the body's frame checks itself
        codec, packed = struct.unpack("<BI", view[5:10])
        start = 10
    elif version == 2 and len(view) >= 14:
        codec, crc, packed = struct.unpack("<BII", view[5:14])
        start = 14
    elif version == 1:   # all of the body packed (a model topic written before version 2)
        codec, crc = struct.unpack("<BI", view[5:10])
        start, packed = 10, len(view) - 10
    else:
        raise ValueError(f"unsupported model delta version {version}")
    try:
        head, tail = view[start:start + packed], view[start + packed:]
        if codec == ZSTD:
            if zstandard is None:
                raise ValueError("zstd-compressed delta but zstandard is not installed")
            head = _zstd_context("decompress").decompress(head)
        elif codec == ZLIB:
            head = zlib.decompress(head)
        elif codec != RAW:
            raise ValueError(f"unknown codec {codec}")
        body = view[start:] if codec == RAW else b"".join((head, tail))
        if crc is not None and zlib.crc32(body) != crc:
            raise ValueError("checksum mismatch")
        if version == VERSION:   # the envelope keeps no checksum: the body's frame must
            got = frame.decode(body, serial.MAGIC, f"{_KIND} blob", require_crc=True)
            if got.header.get("kind") != _KIND:
                raise ValueError(f"blob holds a {got.header.get('kind')}, not a {_KIND}")
            header, arrays = got.header.get("params", {}), got.parts
        else:
            header, arrays = serial.unpack(body, _KIND)
        header["member"], header["seq"], header["items"]  # noqa: B018 (required fields)
    except ValueError as exc:
        raise ValueError(f"corrupt model delta: {exc}") from None
    except Exception as exc:  # zstd/zlib/json/struct errors on damaged bytes
        raise ValueError(f"corrupt model delta: {type(exc).__name__}: {exc}") from None
    return header, arrays


def encode(header: dict, arrays: dict[str, np.ndarray], compress: str) -> bytes:
    """The delta's blob: its float arrays and 64-bit keys last and left as they are (float32
    changes barely compress: zstd took little off them for as much CPU as a take's own work; hashed
    keys do not), the rest compressed where that is smaller (index gaps and bitmaps, counts)."""
    raw = [name for name, arr in arrays.items() if _incompressible(arr)]
    ordered = {name: arr for name, arr in arrays.items() if not _incompressible(arr)}
    ordered.update((name, arrays[name]) for name in raw)
    # serial.pack's frame as chunks (magic, length, header, then one per array): the raw arrays
    # are the last len(raw) of them, copied once, into the blob
    chunks = frame.encode_chunks(serial.MAGIC, {"kind": _KIND, "params": header}, ordered)
    split = len(chunks) - len(raw)
    plain = b"".join(chunks[:split])
    codec, head = RAW, plain
    if compress == "zstd" and zstandard is not None:
        codec, head = ZSTD, _zstd_context("compress").compress(plain)
    elif compress != "none":
        codec, head = ZLIB, zlib.compress(plain, 6)
    if len(head) >= len(plain):
        codec, head = RAW, plain
    return b"".join([MAGIC, struct.pack("<BBI", VERSION, codec, len(head)), head, *chunks[split:]])


def _incompressible(arr: np.ndarray) -> bool:
    return arr.dtype.kind == "f" or arr.dtype == np.uint64
