"""The one binary frame sketchrec writes: a magic, a JSON header, named parts.

Layout: ``MAGIC`` (4 bytes, one per kind of frame) | u32 little-endian header length | header
JSON | the parts' bytes, in header order, nothing after them. The header holds the writer's own
fields beside three of the frame's: ``frame`` (the layout's version), ``parts`` (each part's name
and either its ``length`` in bytes or, for a numpy array, its little-endian ``dtype`` and
``shape``) and, last, ``crc32``: the CRC-32 of the header's bytes before it and of the parts'
bytes (null when the writer keeps a digest of its own).

A frame is read without trusting anything but its own bytes: the magic, the version, the header's
JSON and every length are checked before a part is taken, an array part is copied out of the
blob, object and structured dtypes are refused (numbers and fixed-width text only), and anything
wrong is one ``FrameError`` line (a ``ValueError``) that names what was being read. Frames written
before this module (``frame`` absent: version 1) are read through the writer's ``legacy``
function, which turns the old header's part list into today's; without one, version 1 is refused
in a line naming it.

Sketches and model blobs (``sketches.serial``), saved models (``models.api``), checkpoint files
(``stream.checkpoint``), the secret id key (``privacy.keys``) and the operator-state blobs inside
checkpoints (``decode_arrays``: before, ``np.savez`` archives, still read) are frames. The
fleet's model-topic codecs wrap a serial frame in a compression envelope of their own
(``stream.fleet``; see ``encode_chunks``).

>>> import numpy as np
>>> blob = encode(b"DEMO", {"kind": "demo"}, {"cells": np.arange(3, dtype=np.int32), "note": b"hi"})
>>> got = decode(blob, b"DEMO", "demo blob")
>>> got.header["kind"], got.parts["cells"].tolist(), got.parts["note"]
('demo', [0, 1, 2], b'hi')
>>> try:
...     decode(blob[:-1], b"DEMO", "demo blob")
... except FrameError as refused:
...     print(refused)
demo blob: truncated frame (part 'note' needs 2 bytes, 1 left)
"""

from __future__ import annotations

import io
import json
import struct
import zipfile
import zlib
from dataclasses import dataclass
from typing import Callable, Mapping, Union

import numpy as np

VERSION = 2
_OWN = ("frame", "parts", "crc32")   # header keys the frame keeps for itself
# numbers and fixed-width text (string ids): no objects (pickles), no structured records
_KINDS = "biufcUS"
Part = Union[bytes, bytearray, memoryview, np.ndarray]


class FrameError(ValueError):
    """A blob that is not a whole, well-formed frame of the expected kind (one line)."""


@dataclass(frozen=True)
class Frame:
    """A decoded frame: the whole header as stored (the frame's keys included, so a writer's own
    digest can cover them), the parts by name (arrays copied out; bytes parts as bytes), the
    parts' bytes as stored (``body``) and the layout's ``version``."""

    header: dict
    parts: dict[str, Union[bytes, np.ndarray]]
    body: memoryview
    version: int


def _spec(name: str, part: Part) -> tuple[dict, memoryview]:
    if isinstance(part, np.ndarray):
        little = np.asarray(part, dtype=part.dtype.newbyteorder("<"), order="C")   # keeps 0-d
        return ({"name": name, "dtype": little.dtype.str, "shape": list(little.shape)},
                memoryview(little.reshape(-1).view(np.uint8)))   # any shape, (0, 0) too
    view = memoryview(part).cast("B")
    return {"name": name, "length": view.nbytes}, view


def layout(parts: Mapping[str, Part]) -> list[dict]:
    """The header's part list ``encode`` writes for these parts (a writer whose own digest covers
    the header computes it before encoding)."""
    return [_spec(name, part)[0] for name, part in parts.items()]


def encode_chunks(magic: bytes, header: dict, parts: Mapping[str, Part],
                  checksum: bool = True) -> list:
    """The frame as a list of byte-likes to write one after the other (no copy of the parts:
    a checkpoint writes them straight to its file; ``b"".join`` makes the blob). The parts come
    last and in order, so a codec that compresses the front of a frame and leaves its float
    arrays raw (the fleet's deltas) can split it at ``len(blob) - raw bytes``."""
    if len(magic) != 4 or any(key in header for key in _OWN):
        raise ValueError(f"a frame's magic is 4 bytes and its header leaves {_OWN} to the frame")
    specs, views = zip(*(_spec(name, part) for name, part in parts.items())) if parts else ((), ())
    # the crc32 entry closes the header: it covers the bytes before it (one dump, none to read)
    raw = json.dumps({**header, "frame": VERSION, "parts": list(specs)}, sort_keys=True).encode()[:-1]
    if checksum:
        crc = zlib.crc32(raw)
        for view in views:
            crc = zlib.crc32(view, crc)
        # fixed width (8 hex digits): a blob's size depends on its shape alone, never its values
        raw += b', "crc32": "%08x"}' % crc
    else:
        raw += b', "crc32": null}'
    return [magic, struct.pack("<I", len(raw)), raw, *views]


def encode(magic: bytes, header: dict, parts: Mapping[str, Part], checksum: bool = True) -> bytes:
    """The frame as one blob (``encode_chunks`` joined)."""
    return b"".join(encode_chunks(magic, header, parts, checksum))


def decode(blob: Part, magic: bytes, what: str,
           legacy: Callable[[dict], list] | None = None, require_crc: bool = False) -> Frame:
    """Read a frame of kind ``magic``; ``what`` names the blob in errors. ``legacy`` turns a
    version-1 header (written before this module) into today's part list. ``require_crc``: a
    frame without a CRC-32 of its own (a null ``crc32``, or version 1) is refused, for a caller
    that keeps no digest of its own (the fleet's deltas); otherwise it is read unchecked.

    >>> unchecked = encode(b"DEMO", {}, {"note": b"hi"}, checksum=False)
    >>> decode(unchecked, b"DEMO", "demo blob").parts["note"]
    b'hi'
    >>> try:
    ...     decode(unchecked, b"DEMO", "demo blob", require_crc=True)
    ... except FrameError as refused:
    ...     print(refused)
    demo blob: the frame carries no checksum (crc32 null or absent), and one is required
    """
    view = memoryview(blob).cast("B")
    if bytes(view[:4]) != magic or view.nbytes < 8:
        raise FrameError(f"{what}: not a {magic.decode(errors='replace')} frame (bad magic)")
    (hlen,) = struct.unpack("<I", view[4:8])
    if 8 + hlen > view.nbytes:
        raise FrameError(f"{what}: truncated frame (a header of {hlen} bytes, {view.nbytes - 8} left)")
    text = bytes(view[8:8 + hlen])
    try:
        header = json.loads(text)
    except (ValueError, RecursionError):
        raise FrameError(f"{what}: corrupt frame header (not JSON)") from None
    if not isinstance(header, dict):
        raise FrameError(f"{what}: corrupt frame header (not an object)")
    version = header.get("frame", 1)
    if version == 1 and legacy is not None:
        try:
            specs = legacy(header)
        except (KeyError, TypeError, ValueError):
            raise FrameError(f"{what}: corrupt version-1 header") from None
    elif version == VERSION:
        if "crc32" not in header:   # null when unchecked: a missing key is damage
            raise FrameError(f"{what}: corrupt frame header (no crc32 entry)")
        specs = header.get("parts")
    else:
        raise FrameError(f"{what}: frame version {version!r}; this sketchrec reads version {VERSION}"
                         + (" and 1" if legacy else ""))
    if require_crc and (version != VERSION or header["crc32"] is None):
        raise FrameError(f"{what}: the frame carries no checksum (crc32 null or absent), and one "
                         "is required")
    body = view[8 + hlen:]
    parts = _take(body, specs, what)
    if version == VERSION and header["crc32"] is not None:
        _check_crc(text, body, header["crc32"], what)
    return Frame(header, parts, body, version)


def _check_crc(text: bytes, body: memoryview, crc, what: str) -> None:
    closing = b', "crc32": "%s"}' % str(crc).encode()
    if not isinstance(crc, str) or not text.endswith(closing):
        raise FrameError(f"{what}: corrupt frame header (crc32 entry)")
    if b"%08x" % zlib.crc32(body, zlib.crc32(text[:-len(closing)])) != closing[12:-2]:
        raise FrameError(f"{what}: checksum mismatch (corrupt frame)")


def _take(body: memoryview, specs, what: str) -> dict:
    if not isinstance(specs, list):
        raise FrameError(f"{what}: corrupt frame header (no part list)")
    parts, pos = {}, 0
    for spec in specs:
        name, dtype, shape, count, size = _checked(spec, what)
        if pos + size > body.nbytes:
            raise FrameError(f"{what}: truncated frame (part {name!r} needs {size} bytes, "
                             f"{body.nbytes - pos} left)")
        if dtype is None:
            parts[name] = bytes(body[pos:pos + size])
        else:   # read in place, then copied once (a slice of the bytes would be a second copy)
            parts[name] = np.frombuffer(body, dtype, count, pos).reshape(shape).copy()
        pos += size
    if pos != body.nbytes:
        raise FrameError(f"{what}: {body.nbytes - pos} bytes after the frame's last part")
    return parts


def _checked(spec, what: str) -> tuple[str, np.dtype | None, tuple, int, int]:
    """(name, dtype or None for bytes, shape, elements, bytes) of one part's header entry (the
    elements counted here, not by ``np.prod``: a small frame's read is mostly per-part costs)."""
    try:
        name = spec["name"]
        if not isinstance(name, str):
            raise TypeError
        if "length" in spec:
            size = spec["length"]
            if isinstance(size, bool) or not isinstance(size, int) or size < 0:
                raise ValueError
            return name, None, (), size, size
        dtype, shape = np.dtype(spec["dtype"]), tuple(spec["shape"])
        if dtype.kind not in _KINDS or any(isinstance(n, bool) or not isinstance(n, int) or n < 0
                                           for n in shape):
            raise ValueError
    except (KeyError, TypeError, ValueError):
        raise FrameError(f"{what}: corrupt frame header (part {spec!r:.80})") from None
    count = 1
    for n in shape:
        count *= n
    return name, dtype, shape, count, count * dtype.itemsize


_NPZ = b"PK\x03\x04"   # an ``np.savez`` archive (a zip) begins so; a frame never does


def decode_arrays(blob: Part, magic: bytes, what: str) -> Frame:
    """A frame of kind ``magic``, or the ``np.savez`` archive the same writer stored before it was
    a frame (version 1: read without pickles; its JSON ``meta`` array, as those writers kept it,
    moved into the header). Damage in either is one ``FrameError`` line."""
    view = memoryview(blob).cast("B")
    if bytes(view[:4]) != _NPZ:
        return decode(view, magic, what)
    try:
        with np.load(io.BytesIO(view), allow_pickle=False) as archive:
            parts = {name: archive[name] for name in archive.files}
        header = {"meta": json.loads(parts.pop("meta").tobytes())} if "meta" in parts else {}
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, KeyError, UnicodeDecodeError):
        raise FrameError(f"{what}: corrupt version-1 blob (np.savez archive)") from None
    return Frame(header, parts, memoryview(b""), 1)
