"""The spent privacy budget never goes back: restoring an older copy of a checkpoint directory,
deleting its newest checkpoint, or editing its ledger and recomputing the checksum leaves the
reported epsilon at least as high (or is refused with one line). Each attack is also shown to
succeed against a deliberately broken store that keeps no record outside the directory."""

import json
import os
import shutil
import stat
import struct

import pytest

from sketchrec.privacy import ledger as operator
from sketchrec.privacy.accounting import PrivacyLedger
from sketchrec.privacy.ledger import LedgerIntegrityError, LedgerRecord, operator_key, state_dir
from sketchrec.stream.checkpoint import LEDGER, LEDGER_MAC, CheckpointStore, _digest, continue_ledger


@pytest.fixture
def no_outside_record(monkeypatch):
    """The broken variant: the checkpoint directory is the only place the ledger is kept (no
    operator record, no MAC check), as before the ledger was kept outside it."""
    monkeypatch.setattr("sketchrec.stream.checkpoint.seal", lambda directory, ledger: "unchecked")
    monkeypatch.setattr("sketchrec.stream.checkpoint.reconcile",
                        lambda directory, name, ledger, mac: ledger)


def _grow(directory, passes: int, ledger: PrivacyLedger | None = None) -> list[float]:
    """``passes`` DP passes, each checkpointed; the epsilon reported after each."""
    ledger = ledger or continue_ledger(directory, "rating", 1e-5)
    spent = []
    for _ in range(passes):
        ledger.begin_pass(1.2)
        CheckpointStore(directory, keep=3).save({"model": b"m" * 10}, {LEDGER: ledger.to_dict()})
        spent.append(ledger.epsilon())
    return spent


def _reported(directory) -> float:
    return continue_ledger(directory, "rating", 1e-5).epsilon()


def _restore_old_copy(tmp_path) -> tuple[float, float]:
    ckpt = tmp_path / "ckpt"
    _grow(ckpt, 1)
    backup = tmp_path / "backup"
    shutil.copytree(ckpt, backup)
    highest = _grow(ckpt, 3)[-1]
    shutil.rmtree(ckpt)
    shutil.copytree(backup, ckpt)          # an everyday backup restore
    return highest, _reported(ckpt)


def _delete_newest(tmp_path) -> tuple[float, float]:
    ckpt = tmp_path / "ckpt"
    highest = _grow(ckpt, 3)[-1]
    sorted(ckpt.glob("ckpt-*.skc"))[-1].unlink()
    return highest, _reported(ckpt)


def _rewrite(path, edit) -> None:
    """Edit a checkpoint's header and recompute its (unkeyed) SHA-256, as anyone can."""
    blob = path.read_bytes()
    (hlen,) = struct.unpack("<I", blob[4:8])
    header, body = json.loads(blob[8:8 + hlen]), blob[8 + hlen:]
    edit(header)
    header["sha256_all"] = _digest(header["seq"], header["meta"], header["parts"], body)
    text = json.dumps(header).encode()
    path.write_bytes(blob[:4] + struct.pack("<I", len(text)) + text + body)


def _drop_a_pass(header) -> None:
    steps = header["meta"][LEDGER]["steps"]
    steps[-1]["count"] -= 1


def test_restoring_an_older_copy_never_lowers_epsilon(tmp_path):
    highest, after = _restore_old_copy(tmp_path)
    assert after >= highest


def test_restoring_an_older_copy_lowers_epsilon_without_the_outside_record(tmp_path, no_outside_record):
    highest, after = _restore_old_copy(tmp_path)
    assert after < highest


def test_deleting_the_newest_checkpoint_never_lowers_epsilon(tmp_path):
    highest, after = _delete_newest(tmp_path)
    assert after >= highest


def test_deleting_the_newest_checkpoint_lowers_epsilon_without_the_outside_record(tmp_path, no_outside_record):
    highest, after = _delete_newest(tmp_path)
    assert after < highest


def test_an_edited_and_rehashed_ledger_is_refused(tmp_path):
    ckpt = tmp_path / "ckpt"
    _grow(ckpt, 3)
    _rewrite(sorted(ckpt.glob("ckpt-*.skc"))[-1], _drop_a_pass)
    with pytest.raises(LedgerIntegrityError, match="MAC") as refused:
        _reported(ckpt)
    assert "\n" not in str(refused.value)


def test_an_edited_and_rehashed_ledger_lowers_epsilon_without_the_mac(tmp_path, no_outside_record):
    ckpt = tmp_path / "ckpt"
    highest = _grow(ckpt, 3)[-1]
    _rewrite(sorted(ckpt.glob("ckpt-*.skc"))[-1], _drop_a_pass)
    assert _reported(ckpt) < highest


def test_a_ledger_removed_from_the_checkpoint_is_refused(tmp_path):
    ckpt = tmp_path / "ckpt"
    _grow(ckpt, 2)
    _rewrite(sorted(ckpt.glob("ckpt-*.skc"))[-1],
             lambda h: [h["meta"].pop(LEDGER), h["meta"].pop(LEDGER_MAC)])
    with pytest.raises(LedgerIntegrityError, match="removed"):
        CheckpointStore(ckpt).latest()


def test_a_ledger_with_another_id_and_its_mac_stripped_is_refused(tmp_path):
    ckpt = tmp_path / "ckpt"
    _grow(ckpt, 2)

    def forge(header):
        header["meta"][LEDGER]["ledger_id"] = "0123456789abcdef"
        header["meta"][LEDGER]["steps"] = []
        header["meta"].pop(LEDGER_MAC)
    _rewrite(sorted(ckpt.glob("ckpt-*.skc"))[-1], forge)
    with pytest.raises(LedgerIntegrityError, match="no operator MAC"):
        CheckpointStore(ckpt).latest()


def test_a_restored_checkpoint_continues_from_the_higher_spent_budget(tmp_path):
    highest, _ = _restore_old_copy(tmp_path)
    ckpt = tmp_path / "ckpt"
    again = _grow(ckpt, 1)[-1]                 # the next pass is charged on top of the record
    assert again > highest
    assert CheckpointStore(ckpt).ledger().epsilon() == pytest.approx(again)


def test_the_record_is_append_only_and_an_edited_line_is_refused(tmp_path):
    ckpt = tmp_path / "ckpt"
    _grow(ckpt, 2)
    ident = CheckpointStore(ckpt).latest().meta[LEDGER]["ledger_id"]
    record = LedgerRecord(ident, operator_key())
    lines = record.path.read_text().splitlines()
    assert len(lines) == 2
    entry = json.loads(lines[-1])
    entry["ledger"]["steps"][-1]["count"] = 1          # edit the newest line, keep its MAC
    record.path.write_text(lines[0] + "\n" + json.dumps(entry) + "\n")
    with pytest.raises(LedgerIntegrityError, match="does not verify"):
        _reported(ckpt)
    fresh = PrivacyLedger("rating", 1e-5, ledger_id=ident)
    fresh.begin_pass(1.2)
    record.path.write_text("\n".join(lines) + "\n")
    with pytest.raises(LedgerIntegrityError, match="lower"):
        record.append(fresh.to_dict())                  # a shorter ledger never joins the record


def test_the_key_is_created_private_outside_the_checkpoint_directory(tmp_path, monkeypatch):
    monkeypatch.setenv(operator.STATE_ENV, str(tmp_path / "state"))
    key = operator_key(tmp_path / "ckpt")
    path = state_dir() / operator.KEY_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and len(key) == 32
    assert operator_key() == key                        # created once, then read
    _grow(tmp_path / "ckpt", 1)
    assert not any(key.hex() in p.read_bytes().decode("latin-1") for p in (tmp_path / "ckpt").iterdir())
    os.chmod(path, 0o644)
    with pytest.raises(LedgerIntegrityError, match="chmod 600"):
        operator_key()


def test_a_state_directory_inside_the_checkpoint_directory_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv(operator.STATE_ENV, str(tmp_path / "ckpt" / "state"))
    with pytest.raises(LedgerIntegrityError, match="inside the checkpoint directory"):
        _grow(tmp_path / "ckpt", 1)


def test_an_unsigned_ledger_is_adopted_only_knowingly(tmp_path, monkeypatch):
    ckpt = tmp_path / "ckpt"
    _grow(ckpt, 1)
    _rewrite(sorted(ckpt.glob("ckpt-*.skc"))[-1], lambda h: h["meta"].pop(LEDGER_MAC))
    with pytest.raises(LedgerIntegrityError, match=operator.ADOPT_ENV):
        CheckpointStore(ckpt).latest()
    ident = json.loads(json.dumps(CheckpointStore.read(sorted(ckpt.glob("ckpt-*.skc"))[-1]).meta))[LEDGER]
    monkeypatch.setenv(operator.ADOPT_ENV, ident["ledger_id"])
    assert CheckpointStore(ckpt).ledger().n_releases == 1
