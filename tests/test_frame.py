"""The one binary frame (sketchrec.frame): round trips, every truncation and garbling refused in
one line, and blobs and checkpoint files written before it still read."""

import hashlib
import json
import struct

import numpy as np
import pytest

from sketchrec import frame
from sketchrec.frame import FrameError
from sketchrec.sketches import serial
from sketchrec.stream.checkpoint import MAGIC as CHECKPOINT_MAGIC
from sketchrec.stream.checkpoint import CheckpointStore, _digest

PARTS = {"cells": np.arange(12, dtype=np.float32).reshape(3, 4), "keys": np.array([7, 9], np.uint64),
         "blob": b"operator", "empty": np.zeros(0),
         "none": np.zeros((0, 0), np.float32), "scalar": np.array(3, np.int64), "flags": np.array([True, False])}


def _same(got, want):
    assert list(got) == list(want)
    for name, value in want.items():
        if isinstance(value, np.ndarray):
            assert got[name].dtype == value.dtype and got[name].tobytes() == value.tobytes()
            assert got[name].shape == value.shape and got[name].flags.writeable
        else:
            assert got[name] == value


def test_a_frame_round_trips_arrays_and_bytes_with_its_header():
    got = frame.decode(frame.encode(b"TEST", {"kind": "t", "n": 3}, PARTS), b"TEST", "test")
    assert got.header["kind"] == "t" and got.header["n"] == 3 and got.version == frame.VERSION
    _same(got.parts, PARTS)
    assert frame.encode(b"TEST", {}, PARTS) == b"".join(frame.encode_chunks(b"TEST", {}, PARTS))


def test_every_truncation_and_any_flipped_byte_is_refused_in_one_line():
    blob = frame.encode(b"TEST", {"kind": "t"}, PARTS)
    for cut in range(len(blob)):
        with pytest.raises(FrameError) as refused:
            frame.decode(blob[:cut], b"TEST", "test blob")
        assert str(refused.value).startswith("test blob: ") and "\n" not in str(refused.value)
    for at in range(0, len(blob), 7):
        garbled = bytearray(blob)
        garbled[at] ^= 0x5A
        with pytest.raises(FrameError) as refused:   # the checksum covers the header too
            frame.decode(bytes(garbled), b"TEST", "test blob")
        assert "\n" not in str(refused.value)
    with pytest.raises(FrameError, match="after the frame's last part"):
        frame.decode(blob + b"x", b"TEST", "test blob")


def test_a_checksum_is_what_catches_a_flipped_part_byte():
    blob = bytearray(frame.encode(b"TEST", {}, {"cells": np.ones(8)}))
    blob[-3] ^= 1
    with pytest.raises(FrameError, match="checksum mismatch"):
        frame.decode(bytes(blob), b"TEST", "test blob")
    # the broken variant: without the checksum the same flip is read as data
    unchecked = bytearray(frame.encode(b"TEST", {}, {"cells": np.ones(8)}, checksum=False))
    unchecked[-3] ^= 1
    assert frame.decode(bytes(unchecked), b"TEST", "test blob").parts["cells"][-1] != 1.0


def _forged(header: dict, body: bytes = b"", magic=b"TEST") -> bytes:
    raw = json.dumps(header).encode()
    return magic + struct.pack("<I", len(raw)) + raw + body


@pytest.mark.parametrize("header, says", [
    ({"frame": 3, "parts": []}, "frame version 3; this sketchrec reads version 2"),
    ({"parts": []}, "frame version 1"),
    ({"frame": 2, "parts": []}, "no crc32 entry"),
    ({"frame": 2, "crc32": None, "parts": [{"name": "x", "dtype": "|O", "shape": [1]}]}, "corrupt frame header"),
    ({"frame": 2, "crc32": None, "parts": [{"name": "x", "dtype": "<f8", "shape": [-1]}]}, "corrupt frame header"),
    ({"frame": 2, "crc32": None, "parts": [{"name": "x", "length": 10 ** 12}]}, "truncated frame"),
    ({"frame": 2, "crc32": None, "parts": "x"}, "no part list"),
])
def test_a_forged_header_is_refused_in_one_line(header, says):
    with pytest.raises(FrameError, match=says):
        frame.decode(_forged(header, b"\0" * 8), b"TEST", "test blob")


def test_a_serial_blob_of_the_format_before_frames_still_reads():
    arrays = {"cells": np.arange(4, dtype=np.float32), "keys": np.array([3], np.uint64)}
    specs = [{"name": n, "dtype": a.dtype.str, "shape": list(a.shape)} for n, a in arrays.items()]
    old = _forged({"kind": "CountSketch", "version": 1, "params": {"width": 4}, "arrays": specs},
                  b"".join(a.tobytes() for a in arrays.values()), serial.MAGIC)
    params, got = serial.unpack(old, "CountSketch")
    assert params == {"width": 4}
    _same(got, arrays)
    with pytest.raises(ValueError, match="not a SketchMF"):
        serial.unpack(old, "SketchMF")


def test_a_checkpoint_file_written_before_frames_still_loads(tmp_path):
    parts, meta, seq = {"model": b"m" * 5, "offsets": b"{}"}, {"n": 1}, 1
    body, layout = b"".join(parts.values()), [[name, len(blob)] for name, blob in parts.items()]
    header = {"seq": seq, "meta": meta, "parts": layout, "sha256": hashlib.sha256(body).hexdigest(),
              "sha256_all": _digest(seq, meta, layout, body)}
    (tmp_path / "ckpt-000000000001.skc").write_bytes(_forged(header, body, CHECKPOINT_MAGIC))
    store = CheckpointStore(tmp_path)
    assert store.latest().parts == parts and store.latest().meta == meta
    store.save({"model": b"n" * 5}, {"n": 2})   # the next one is a frame, and both read
    assert [CheckpointStore.read(p).meta["n"] for p in store.paths()] == [1, 2]
    assert store.paths()[-1].read_bytes()[:4] == CHECKPOINT_MAGIC
