"""Bit-exact serialisation of sketches and models: a ``sketchrec.frame`` of kind b"SKRC".

The frame's header holds the ``kind`` and the constructor ``params``; its parts are the state
arrays (dtype and shape in the header), so a blob can be checked and rebuilt without trusting
anything but its own bytes. Blobs written before the frame module (``{"version": 1, "arrays":
[...]}``, the same bytes per array) still read.

>>> import numpy as np
>>> params, arrays = unpack(pack("Demo", {"width": 3}, {"cells": np.ones(3)}), "Demo")
>>> params, arrays["cells"].tolist()
({'width': 3}, [1.0, 1.0, 1.0])
"""

from __future__ import annotations

import numpy as np

from sketchrec import frame

MAGIC = b"SKRC"


def pack(kind: str, params: dict, arrays: dict[str, np.ndarray]) -> bytes:
    """Serialise parameters and arrays of one sketch (or model)."""
    return frame.encode(MAGIC, {"kind": kind, "params": params}, arrays)


def _version_1(header: dict) -> list:
    if header["version"] != 1:
        raise ValueError
    return header["arrays"]


def unpack(blob: bytes, expect_kind: str) -> tuple[dict, dict[str, np.ndarray]]:
    """Inverse of :func:`pack`; ValueError (one line) on a wrong kind, version or length."""
    got = frame.decode(blob, MAGIC, f"{expect_kind} blob", legacy=_version_1)
    kind = got.header.get("kind")
    if kind != expect_kind:
        raise ValueError(f"blob holds a {kind}, not a {expect_kind}")
    return got.header.get("params", {}), got.parts
