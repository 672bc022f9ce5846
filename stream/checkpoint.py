"""Durable, atomic checkpoints: several named byte blobs plus JSON metadata in one file.

A checkpoint is written to a temp file in the same directory, fsynced, renamed into place and the
directory fsynced, so a crash leaves either the old file or the new one, never half of one. Each
file carries a SHA-256 of its body; loading verifies it and falls back to the newest older file
that verifies, so a corrupt or truncated checkpoint costs one interval, never the whole state.

File layout: a ``sketchrec.frame`` of kind b"SKCP" whose header holds {seq, meta, sha256,
sha256_all} beside the frame's part list, and whose parts are the named blobs. ``sha256`` covers
the parts' bytes; ``sha256_all`` covers them AND the canonical JSON of seq, meta and the part
list, so the privacy ledger in the meta is checked too (a one-byte edit of it once set epsilon to
0, defect D8). Files written before the frame module (version 1: ``parts: [[name, length]]``)
still load.

The privacy ledger is never lost or restarted silently: a directory whose checkpoints hold a
ledger refuses to load when a newer file does not verify (falling back would under-count the
privacy spent by what that file's model released), and ``save`` refuses a ledger that does not
continue the one already stored (defect D9: `replay --checkpoint` twice into one directory started
a fresh ledger); ``continue_ledger`` gives the ledger a new run must extend.

Nor does it go back: the SHA-256 above has no key, and a directory can be restored from an older
copy. So every ledger saved is first recorded OUTSIDE the directory and signed with the operator's
key (``privacy.ledger``: an append-only MAC-chained record keyed by the model's identity), and
``latest`` continues from the record when it is higher than the checkpoint's ledger, and refuses a
ledger whose MAC does not verify.
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

from sketchrec import frame
from sketchrec.privacy.accounting import PrivacyLedger
from sketchrec.privacy.ledger import LedgerIntegrityError, reconcile, seal
from sketchrec.privacy.ledger import extends as _extends
from sketchrec.privacy.release import public_manifest
# a model's operator parts: saved files (models.api) and checkpoints store the same ones
from sketchrec.models.api import operator_parts, restore_operator_parts  # noqa: F401

log = logging.getLogger(__name__)
LEDGER = "privacy_ledger"
LEDGER_MAC = "privacy_ledger_mac"   # HMAC of the ledger under the operator key (never stored here)
MAGIC = b"SKCP"
_NAME = re.compile(r"^ckpt-(\d{12})\.skc$")
_HEADER_KEYS = {"seq", "meta", "parts", "sha256"}


@dataclass
class Checkpoint:
    """A loaded checkpoint: its sequence number, metadata, named parts and file."""

    seq: int
    meta: dict
    parts: dict[str, bytes]
    path: Path

    def summary(self) -> dict:
        """What /stats shows of it: its name (never its path: /stats is public), sequence number,
        ratings learned and when it was written."""
        return {"name": self.path.name, "seq": self.seq,
                "ratings_learned": self.meta.get("ratings_learned"), "at": self.meta.get("written_at")}

    def public(self, mode) -> dict:
        """What may be shown of this checkpoint in privacy mode ``mode`` (``privacy.mode``): its
        metadata and part sizes through the release boundary (``privacy.release.public_manifest``)."""
        return public_manifest(mode, self.meta, {name: len(blob) for name, blob in self.parts.items()})


def _digest(seq: int, meta: dict, parts: list, body: bytes) -> str:
    signed = json.dumps({"seq": seq, "meta": meta, "parts": parts}, sort_keys=True).encode()
    return hashlib.sha256(struct.pack("<Q", len(signed)) + signed + body).hexdigest()


def _version_1(header: dict) -> list:
    """A checkpoint written before the frame module: its parts as [name, length] pairs."""
    return [{"name": name, "length": length} for name, length in header["parts"]]


class CheckpointStore:
    """Numbered checkpoints in one directory; keeps the newest ``keep`` files."""

    def __init__(self, directory: str | Path, keep: int = 3):
        if keep < 2:
            raise ValueError("keep at least 2 checkpoints, so a corrupt newest one has a fallback")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.keep = keep
        self._ledger_cache: tuple | None = None  # (ledger dict,) last verified or written here

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
        meta = {**(meta or {}), "written_at": time.time()}
        if files:
            if self._ledger_cache is None:
                stored = self.latest()
                self._ledger_cache = (stored.meta.get(LEDGER) if stored else None,)
            if not _extends(meta.get(LEDGER), self._ledger_cache[0]):
                raise LedgerIntegrityError(
                    f"{self.directory} holds a privacy ledger that this checkpoint does not "
                    "continue: refusing to start a fresh ledger there (continue it with "
                    "stream.checkpoint.continue_ledger, or use another directory)")
        if meta.get(LEDGER):   # recorded outside the directory before any file shows it
            meta[LEDGER_MAC] = seal(self.directory, meta[LEDGER])
        body = b"".join(parts.values())
        layout = frame.layout(parts)
        chunks = frame.encode_chunks(MAGIC, {"seq": seq, "meta": meta,
                                             "sha256": hashlib.sha256(body).hexdigest(),
                                             "sha256_all": _digest(seq, meta, layout, body)},
                                     parts, checksum=False)   # the SHA-256s above cover them
        final = self.directory / f"ckpt-{seq:012d}.skc"
        tmp = final.with_suffix(".tmp")
        try:
            with open(tmp, "wb") as fh:
                for chunk in chunks:
                    fh.write(chunk)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, final)
        except BaseException:
            tmp.unlink(missing_ok=True)  # a full disk must not leave half a file behind
            raise
        self._ledger_cache = (json.loads(json.dumps(meta.get(LEDGER))),)
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
        got = frame.decode(path.read_bytes(), MAGIC, path.name, legacy=_version_1)
        header, body = got.header, got.body
        if not _HEADER_KEYS <= header.keys() or not isinstance(header["meta"], dict):
            raise ValueError(f"{path.name}: corrupt header (a key is missing or renamed)")
        if hashlib.sha256(body).hexdigest() != header.get("sha256"):
            raise ValueError(f"{path.name}: checksum mismatch (corrupt or truncated)")
        has_ledger = bool(header.get("meta", {}).get(LEDGER))
        if "sha256_all" in header or has_ledger:
            if header.get("sha256_all") != _digest(header["seq"], header["meta"], header["parts"], body):
                raise LedgerIntegrityError(
                    f"{path.name}: the header (metadata{', privacy ledger' if has_ledger else ''}) "
                    "does not match its checksum: edited or corrupt; refusing it")
        return Checkpoint(header["seq"], header["meta"], got.parts, path)

    def latest(self) -> Checkpoint | None:
        """The newest checkpoint that verifies (older ones are tried when newer ones are corrupt).

        LedgerIntegrityError instead of a fallback when the files involved hold a privacy ledger:
        an older ledger would under-count what the newer (already served) models spent."""
        failed = []
        for _, path in reversed(self._files()):
            try:
                ckpt = self.read(path)
            except (ValueError, OSError) as exc:
                log.warning("skipping checkpoint %s: %s", path, exc)
                failed.append((path, exc))
                continue
            if failed and (ckpt.meta.get(LEDGER) or any(_mentions_ledger(p) for p, _ in failed)):
                path, exc = failed[0]
                raise LedgerIntegrityError(
                    f"refusing to load {self.directory}: {exc}. Its checkpoints hold a privacy "
                    "ledger, and falling back to an older one would under-count the privacy "
                    "already spent; restore the file, or move it away knowingly") from None
            ledger = reconcile(self.directory, path.name, ckpt.meta.get(LEDGER), ckpt.meta.get(LEDGER_MAC))
            if ledger is not None:
                ckpt.meta[LEDGER] = ledger   # the operator's record when it is higher
            return ckpt
        if failed and any(_mentions_ledger(p) for p, _ in failed):
            raise LedgerIntegrityError(f"refusing to load {self.directory}: {failed[0][1]} "
                                       "(its privacy ledger cannot be verified)")
        return None

    def ledger(self) -> PrivacyLedger | None:
        """The privacy ledger of the newest valid checkpoint, if it holds one."""
        ckpt = self.latest()
        data = ckpt.meta.get(LEDGER) if ckpt else None
        return PrivacyLedger.from_dict(data) if data else None

    def paths(self) -> list[Path]:
        """The checkpoint files, oldest first (whether they verify or not)."""
        return [path for _, path in self._files()]

    def set_aside(self) -> list[Path]:
        """Rename every checkpoint file to ``*.skc.corrupt`` (kept for inspection, never loaded)."""
        moved = []
        for _, path in self._files():
            target = path.with_name(path.name + ".corrupt")
            os.replace(path, target)
            moved.append(target)
        return moved

    def check_writable(self) -> None:
        """OSError now, at start-up, if checkpoints cannot be written here (not at the first one)."""
        probe = self.directory / f".probe-{os.getpid()}.tmp"
        try:
            with open(probe, "wb") as fh:
                fh.write(b"x")
                os.fsync(fh.fileno())
        finally:
            probe.unlink(missing_ok=True)

    def newest_seq(self) -> int:
        files = self._files()
        return files[-1][0] if files else 0


_HOLDS_LEDGER = re.compile(rb'"' + LEDGER.encode() + rb'"\s*:\s*\{')


def _mentions_ledger(path: Path) -> bool:
    """Whether a file (maybe corrupt) holds a ledger: ``"privacy_ledger": {``, not ``: null``
    (every service checkpoint has the key; a non-private one must still fall back)."""
    try:
        with open(path, "rb") as fh:
            return _HOLDS_LEDGER.search(fh.read(1 << 20)) is not None
    except OSError:
        return False


def continue_ledger(directory: str | Path | None, unit: str, delta: float,
                    accountant: str = "rdp") -> PrivacyLedger:
    """The ledger a DP run checkpointing into ``directory`` must extend: the stored one when the
    directory holds one (same unit and delta, else ValueError), otherwise a new one."""
    stored = CheckpointStore(directory).ledger() if directory is not None else None
    if stored is None:
        return PrivacyLedger(unit, delta, accountant)
    if (stored.unit, stored.delta) != (unit, float(delta)):
        raise ValueError(f"{directory} holds a ledger for unit {stored.unit!r}, delta "
                         f"{stored.delta:g}; this run accounts {unit!r}, {delta:g}: use another directory")
    return stored
