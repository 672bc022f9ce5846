"""The spent privacy budget, kept where restoring a checkpoint directory cannot lower it.

A checkpoint directory carries its model's privacy ledger, but a directory can be restored from an
older backup, its newest file deleted, or its ledger edited and its (unkeyed) SHA-256 recomputed:
each of those once lowered the reported epsilon. So the operator keeps two things OUTSIDE every
checkpoint directory, under the state directory (``$SKETCHREC_STATE``, else
``$XDG_STATE_HOME/sketchrec``, else ``~/.local/state/sketchrec``):

- ``ledger.key``: 32 random bytes, created 0600 on first use; the key of every MAC below. It is never
  written into a checkpoint, so whoever can write a checkpoint directory cannot forge a ledger.
- ``ledgers/<ledger id>.jsonl``: an append-only record of that model's ledger, one line per
  growth, each line under an HMAC-SHA256 chained to the previous one (an edited, reordered or
  spliced line does not verify). The newest line is the highest budget ever spent.
- ``dirs/<hash of the directory path>``: which ledger a checkpoint directory holds, so a checkpoint
  whose ledger was removed from it is refused rather than taken for a non-private one.

A checkpoint's ledger carries an HMAC under the key (``sign``): an edited ledger does not verify.
On load (``reconcile``), the ledger continued from is the record's when it extends the checkpoint's
(an older copy, a deleted newest file): the reported epsilon never goes back. A checkpoint ledger
that neither extends nor is extended by the record is refused with one line.

Residual (stated for the docs): whoever can delete or rewrite the state directory itself (not
only a checkpoint directory) can still reset the record; keep it on storage that backups do not
restore. In Kafka mode the analogue is an append-only ledger topic (not implemented here).
"""

from __future__ import annotations

import fcntl
import hashlib
import hmac
import json
import logging
import os
import re
import secrets
import stat
from collections.abc import Mapping
from pathlib import Path

log = logging.getLogger(__name__)
STATE_ENV = "SKETCHREC_STATE"
ADOPT_ENV = "SKETCHREC_ADOPT_LEDGER"   # the id of an unsigned (older) ledger adopted knowingly
KEY_FILE = "ledger.key"
_SAFE_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class LedgerIntegrityError(ValueError):
    """A privacy ledger that does not verify, or would lower the budget already spent."""


def state_dir(env: Mapping[str, str] | None = None) -> Path:
    """Where the operator's ledger state lives (never inside a checkpoint directory)."""
    env = os.environ if env is None else env
    if env.get(STATE_ENV):
        return Path(env[STATE_ENV])
    base = Path(env["XDG_STATE_HOME"]) if env.get("XDG_STATE_HOME") else Path.home() / ".local" / "state"
    return base / "sketchrec"


def _inside(path: Path, directory: Path) -> bool:
    path, directory = path.resolve(), directory.resolve()
    return path == directory or directory in path.parents


def operator_key(checkpoint_dir: str | Path | None = None) -> bytes:
    """The MAC key (created 0600 on first use); refused when it would live inside
    ``checkpoint_dir`` (a restore of that directory would then restore the key and the record)."""
    root = state_dir()
    if checkpoint_dir is not None and _inside(root, Path(checkpoint_dir)):
        raise LedgerIntegrityError(
            f"the ledger state directory {root} is inside the checkpoint directory {checkpoint_dir}: "
            f"a restore of it would restore the spent budget too; set ${STATE_ENV} to a path outside it")
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = root / KEY_FILE
    if not path.exists():
        tmp = root / f".{KEY_FILE}.{os.getpid()}.{secrets.token_hex(4)}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, secrets.token_hex(32).encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)   # atomic, and never over a key another process just created
        except FileExistsError:
            pass
        finally:
            tmp.unlink(missing_ok=True)
    mode = path.stat().st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise LedgerIntegrityError(f"{path} is readable by other users (mode {stat.S_IMODE(mode):o}): "
                                   f"whoever reads it can forge a ledger; chmod 600 {path}")
    text = path.read_text().strip()
    if not re.fullmatch(r"[0-9a-f]{64}", text):
        raise LedgerIntegrityError(f"{path} does not hold a ledger key (64 hex digits)")
    return bytes.fromhex(text)


def _canonical(data) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()


def sign(key: bytes, ledger: dict) -> str:
    """The HMAC-SHA256 of a ledger (its canonical JSON) under the operator key."""
    return hmac.new(key, b"ledger\x00" + _canonical(ledger), hashlib.sha256).hexdigest()


def extends(new: dict | None, old: dict | None) -> bool:
    """Whether ledger ``new`` continues ``old`` (same unit and delta, old's entries as a prefix;
    the last may have grown, since equal consecutive entries merge)."""
    if old is None or not old["steps"]:
        return True
    if new is None or (new["unit"], new["delta"]) != (old["unit"], old["delta"]):
        return False
    if old.get("ledger_id") and new.get("ledger_id") != old["ledger_id"]:
        return False  # another ledger, even one that happens to match entry for entry
    a, b = old["steps"], new["steps"]
    if len(b) < len(a) or a[:-1] != b[:len(a) - 1]:
        return False
    last, same = a[-1], b[len(a) - 1]
    return _kind(last) == _kind(same) and same["count"] >= last["count"]


def _kind(step: dict) -> tuple:
    return step["noise_multiplier"], step["sampling_rate"], step.get("mechanism", "gaussian")


def record_id(ledger: dict, checkpoint_dir: str | Path) -> str:
    """The model identity a ledger's record is kept under: its ``ledger_id`` (older ledgers
    without one: the checkpoint directory's path)."""
    lid = ledger.get("ledger_id")
    if lid is None:
        return "dir-" + _dir_hash(checkpoint_dir)
    if not isinstance(lid, str) or not _SAFE_ID.match(lid):
        raise LedgerIntegrityError(f"ledger id {str(lid)[:80]!r} is not a ledger id")
    return lid


def _dir_hash(checkpoint_dir: str | Path) -> str:
    return hashlib.sha256(str(Path(checkpoint_dir).resolve()).encode()).hexdigest()[:32]


class LedgerRecord:
    """The append-only, MAC-chained record of one model's ledger, outside its checkpoints."""

    def __init__(self, ident: str, key: bytes):
        self.path = state_dir() / "ledgers" / f"{ident}.jsonl"
        self.key = key

    def _mac(self, n: int, prev: str, ledger: dict) -> str:
        return hmac.new(self.key, _canonical([n, prev, ledger]), hashlib.sha256).hexdigest()

    def _entries(self, text: str) -> list[dict]:
        entries, prev = [], ""
        for n, line in enumerate(text.splitlines()):
            try:
                entry = json.loads(line)
                ok = entry["n"] == n and entry["prev"] == prev and hmac.compare_digest(
                    entry["mac"], self._mac(n, prev, entry["ledger"]))
            except (ValueError, KeyError, TypeError):
                ok = False
            if not ok:
                raise LedgerIntegrityError(f"{self.path}: line {n + 1} does not verify (edited or not "
                                           "written under this operator key): refusing the ledger")
            entries.append(entry)
            prev = entry["mac"]
        return entries

    def latest(self) -> dict | None:
        """The highest ledger recorded (the newest entry), or None."""
        try:
            entries = self._entries(self.path.read_text())
        except FileNotFoundError:
            return None
        return entries[-1]["ledger"] if entries else None

    def append(self, ledger: dict) -> None:
        """Record ``ledger`` (durably, before any checkpoint shows it); it must extend the record."""
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)   # two writers must not both chain onto one line
            with os.fdopen(os.dup(fd), "r") as fh:
                entries = self._entries(fh.read())
            last = entries[-1]["ledger"] if entries else None
            if last == ledger:
                return
            if not extends(ledger, last):
                raise LedgerIntegrityError(
                    f"this ledger does not continue the operator's record {self.path} (it would lower "
                    "the budget already spent): continue from the recorded ledger")
            n, prev = len(entries), entries[-1]["mac"] if entries else ""
            line = json.dumps({"n": n, "prev": prev, "ledger": ledger,
                               "mac": self._mac(n, prev, ledger)}, sort_keys=True) + "\n"
            os.write(fd, line.encode())
            os.fsync(fd)
        finally:
            os.close(fd)


def mark_directory(checkpoint_dir: str | Path, ident: str, key: bytes) -> None:
    """Note, outside it, that ``checkpoint_dir`` holds ledger ``ident`` (MAC'd)."""
    path = state_dir() / "dirs" / _dir_hash(checkpoint_dir)
    text = json.dumps({"ledger": ident, "mac": hmac.new(key, ident.encode(), hashlib.sha256).hexdigest()})
    if path.exists() and path.read_text() == text:
        return
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def directory_ledger(checkpoint_dir: str | Path) -> str | None:
    """The ledger the operator's state says ``checkpoint_dir`` holds (None: none recorded)."""
    path = state_dir() / "dirs" / _dir_hash(checkpoint_dir)
    try:
        return json.loads(path.read_text())["ledger"]
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return None


def seal(checkpoint_dir: str | Path, ledger: dict) -> str:
    """Before a checkpoint holding ``ledger`` is written: record it outside the directory and
    return its MAC (stored in the checkpoint)."""
    key = operator_key(checkpoint_dir)
    ident = record_id(ledger, checkpoint_dir)
    LedgerRecord(ident, key).append(ledger)
    mark_directory(checkpoint_dir, ident, key)
    return sign(key, ledger)


def reconcile(checkpoint_dir: str | Path, name: str, ledger: dict | None, mac: str | None) -> dict | None:
    """The ledger to continue from, given the one checkpoint ``name`` holds: the record's when it is
    higher (never lower than anything spent); LedgerIntegrityError when the checkpoint's does not
    verify or contradicts the record."""
    if ledger is None:
        held = directory_ledger(checkpoint_dir)
        if held is not None:
            raise LedgerIntegrityError(
                f"{name}: holds no privacy ledger, but this directory's checkpoints held ledger {held} "
                "(operator record): the ledger was removed; refusing it")
        return None
    key = operator_key(checkpoint_dir)
    ident = record_id(ledger, checkpoint_dir)
    if mac is None and os.environ.get(ADOPT_ENV) == ident:
        log.warning("adopting the unsigned privacy ledger %s of %s (%s set)", ident, name, ADOPT_ENV)
    elif not isinstance(mac, str) or not hmac.compare_digest(mac, sign(key, ledger)):
        why = "carries no operator MAC" if mac is None else "does not match its operator MAC"
        raise LedgerIntegrityError(
            f"{name}: its privacy ledger {why} (edited, or written under another key): refusing it"
            + (f"; to adopt a ledger written before ledgers were signed, set {ADOPT_ENV}={ident}"
               if mac is None else ""))
    record = LedgerRecord(ident, key)
    stored = record.latest()
    if stored is not None and stored != ledger and extends(stored, ledger):
        log.warning("%s: its privacy ledger is behind the operator's record (restored or deleted "
                    "checkpoint): continuing from the record's higher spent budget", name)
        return stored
    record.append(ledger)   # refuses a ledger the record does not lead to
    mark_directory(checkpoint_dir, ident, key)
    return ledger
