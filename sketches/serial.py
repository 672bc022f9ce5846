"""Bit-exact serialisation of sketches: a JSON header followed by raw little-endian arrays.

Layout: b"SKRC" | u32 header length | header JSON | array bytes, in header order.
The header holds the kind, the constructor parameters and each array's dtype and shape, so a
blob can be checked and rebuilt without trusting anything but its own bytes.
"""

from __future__ import annotations

import json
import struct

import numpy as np

MAGIC = b"SKRC"
VERSION = 1


def pack(kind: str, params: dict, arrays: dict[str, np.ndarray]) -> bytes:
    """Serialise parameters and arrays of one sketch."""
    specs = []
    blobs = []
    for name, arr in arrays.items():
        little = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<"))
        specs.append({"name": name, "dtype": little.dtype.str, "shape": list(little.shape)})
        blobs.append(little.tobytes())
    header = json.dumps({"kind": kind, "version": VERSION, "params": params, "arrays": specs},
                        sort_keys=True).encode()
    return b"".join([MAGIC, struct.pack("<I", len(header)), header, *blobs])


def unpack(blob: bytes, expect_kind: str) -> tuple[dict, dict[str, np.ndarray]]:
    """Inverse of :func:`pack`; raises ValueError on a wrong kind, version or length."""
    if blob[:4] != MAGIC:
        raise ValueError("not a sketchrec sketch (bad magic)")
    (hlen,) = struct.unpack("<I", blob[4:8])
    header = json.loads(blob[8:8 + hlen])
    if header["kind"] != expect_kind:
        raise ValueError(f"blob holds a {header['kind']}, not a {expect_kind}")
    if header["version"] != VERSION:
        raise ValueError(f"unsupported sketch format version {header['version']}")
    arrays = {}
    pos = 8 + hlen
    for spec in header["arrays"]:
        dtype = np.dtype(spec["dtype"])
        count = int(np.prod(spec["shape"], dtype=np.int64))
        end = pos + count * dtype.itemsize
        if end > len(blob):
            raise ValueError("truncated sketch blob")
        # read in place, then copied once (a slice of the bytes would be a second copy)
        arrays[spec["name"]] = np.frombuffer(blob, dtype=dtype, count=count,
                                             offset=pos).reshape(spec["shape"]).copy()
        pos = end
    if pos != len(blob):
        raise ValueError("trailing bytes after sketch blob")
    return header["params"], arrays
