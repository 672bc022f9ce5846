"""Durable, atomic checkpoints: several named byte blobs plus JSON metadata in one file.

A checkpoint is written to a temp file in the same directory, fsynced, renamed into place and the
directory fsynced, so a crash leaves either the old file or the new one, never half of one. Each
file carries a SHA-256 of its body; loading verifies it and falls back to the newest older file
that verifies, so a corrupt or truncated checkpoint costs one interval, never the whole state.

File layout: b"SKCP" | u32 header length | header JSON {seq, meta, parts: [[name, length]], sha256}
| part bytes in order.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import struct
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)
MAGIC = b"SKCP"
_NAME = re.compile(r"^ckpt-(\d{12})\.skc$")


@dataclass
class Checkpoint:
    """A loaded checkpoint: its sequence number, metadata, named parts and file."""

    seq: int
    meta: dict
    parts: dict[str, bytes]
    path: Path


class CheckpointStore:
    """Numbered checkpoints in one directory; keeps the newest ``keep`` files."""

    def __init__(self, directory: str | Path, keep: int = 3):
        if keep < 2:
            raise ValueError("keep at least 2 checkpoints, so a corrupt newest one has a fallback")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.keep = keep

    def _files(self) -> list[tuple[int, Path]]:
        found = []
        for path in self.directory.iterdir():
            match = _NAME.match(path.name)
            if match:
                found.append((int(match.group(1)), path))
        return sorted(found)

    def save(self, parts: dict[str, bytes], meta: dict | None = None) -> Path:
        """Write a new checkpoint durably; returns its path."""
        files = self._files()
        seq = files[-1][0] + 1 if files else 1
        body = b"".join(parts.values())
        header = json.dumps({"seq": seq, "meta": {**(meta or {}), "written_at": time.time()},
                             "parts": [[name, len(blob)] for name, blob in parts.items()],
                             "sha256": hashlib.sha256(body).hexdigest()}).encode()
        final = self.directory / f"ckpt-{seq:012d}.skc"
        tmp = final.with_suffix(".tmp")
        with open(tmp, "wb") as fh:
            fh.write(MAGIC + struct.pack("<I", len(header)) + header)
            fh.write(body)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, final)
        dir_fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        for _, old in files[: max(0, len(files) + 1 - self.keep)]:
            old.unlink(missing_ok=True)
        return final

    @staticmethod
    def read(path: Path) -> Checkpoint:
        """Read and verify one checkpoint file; ValueError if it is corrupt or truncated."""
        blob = path.read_bytes()
        if blob[:4] != MAGIC or len(blob) < 8:
            raise ValueError(f"{path.name}: not a checkpoint")
        (hlen,) = struct.unpack("<I", blob[4:8])
        try:
            header = json.loads(blob[8:8 + hlen])
        except (ValueError, UnicodeDecodeError):
            raise ValueError(f"{path.name}: corrupt header") from None
        body = blob[8 + hlen:]
        if hashlib.sha256(body).hexdigest() != header.get("sha256"):
            raise ValueError(f"{path.name}: checksum mismatch (corrupt or truncated)")
        parts, pos = {}, 0
        for name, length in header["parts"]:
            parts[name] = body[pos:pos + length]
            pos += length
        return Checkpoint(header["seq"], header["meta"], parts, path)

    def latest(self) -> Checkpoint | None:
        """The newest checkpoint that verifies (older ones are tried when newer ones are corrupt)."""
        for _, path in reversed(self._files()):
            try:
                return self.read(path)
            except (ValueError, OSError) as exc:
                log.warning("skipping checkpoint %s: %s", path, exc)
        return None

    def newest_seq(self) -> int:
        files = self._files()
        return files[-1][0] if files else 0
