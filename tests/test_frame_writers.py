"""The writers that used to keep their own binary layout are frames now (``sketchrec.frame``): the
secret id key and the operator-state blobs inside checkpoints (the user unit's cap counts, the DP
fallback, the joint-DP model and its users' rated items). Each round-trips, still reads the blob
it wrote before (``SKIDKEY1`` + secret; an ``np.savez`` archive), and refuses a truncated or
garbled blob of either kind in one line instead of loading wrong state."""

import dataclasses
import io
import json

import numpy as np
import pytest

from sketchrec.data import Ratings
from sketchrec.frame import FrameError, encode
from sketchrec.models import SketchMF
from sketchrec.models.private.dp_sgd import DPConfig
from sketchrec.models.private.fallback import DPSGDFallback
from sketchrec.models.private.joint_als import JointDPConfig, PrivateALS
from sketchrec.privacy.keys import MAGIC as KEY_MAGIC, IdKey
from sketchrec.stream.serving.joint import JointRecommender

SECRET = bytes(range(32))
RNG = np.random.default_rng(5)
ITEMS = np.array([f"item-{j}" for j in range(12)])   # string ids: fixed-width text arrays
DATA = Ratings(RNG.integers(0, 20, 400), RNG.choice(ITEMS, 400), RNG.integers(1, 6, 400).astype(np.float64),
               np.arange(400))


def _npz(**arrays) -> bytes:
    """A blob as the writers stored it before the frame."""
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def _meta(meta: dict) -> np.ndarray:
    return np.frombuffer(json.dumps(meta).encode(), np.uint8)


def _caps():
    model = SketchMF(dim=2, capacity=50)
    model.user_counts = {3: 7, 2**63 + 1: 2}
    users = np.array(list(model.user_counts), np.uint64)
    old = _npz(capped_users=users, capped_counts=np.array([7, 2], np.int64))

    def load(blob):
        fresh = SketchMF(dim=2, capacity=50)
        fresh.load_operator_state(blob)
        return fresh.operator_state()
    return model.operator_state(), old, load


def _fallback():
    model = DPSGDFallback(SketchMF(dim=2, capacity=50, dp=DPConfig(1.0, batch_size=50)), width=64)
    model._totals = [3.5, 4, RNG.normal(size=64), RNG.integers(0, 9, 64).astype(np.float64)]
    blob = model.to_bytes()
    meta = {"width": 64, "window": model.window, "total": 3.5, "n": 4, "chose_factors": bool(model.chose_factors),
            "choice_sum": model.choice_sum, "choice_std": model.choice_std, "windows": model.windows}
    old = _npz(model=np.frombuffer(model.model.to_bytes(), np.uint8), sums=model._totals[2],
               counts=model._totals[3], meta=_meta(meta))
    return blob, old, lambda b: DPSGDFallback.from_bytes(b).to_bytes()


@pytest.fixture(scope="module")
def joint() -> PrivateALS:
    return PrivateALS(JointDPConfig(epsilon=4.0, rank=2, iterations=1, cap=20), ITEMS).fit(
        DATA.users, DATA.items, DATA.ratings)


def _joint(model):
    meta = {"config": dataclasses.asdict(model.config),
            "chose_factors": bool(model.chose_factors), "choice_sum": model.choice_sum,
            "mu": model.release.mu, "ledger": model.ledger.to_dict() if model.ledger else None}
    old = _npz(catalogue=model.catalogue, item_bias=model.release.item_bias, counts=model.release.counts,
               sums=model.release.sums, factors=model.factors, coef=model.coef, user_ids=model.user_ids,
               meta=_meta(meta))
    return model.to_bytes(), old, lambda b: PrivateALS.from_bytes(b).to_bytes()


def _rated(model):
    rec = JointRecommender(model, DATA)
    parts = rec.state_parts()
    old = _npz(rated=rec._rated, starts=rec._starts)

    def load(blob):
        return JointRecommender.from_parts({**parts, "rated": blob}).state_parts()["rated"]
    return parts["rated"], old, load


def _key():
    return IdKey(SECRET).to_bytes(), b"SKIDKEY1" + SECRET, lambda b: IdKey.from_bytes(b).to_bytes()


@pytest.fixture(params=["id key", "cap counts", "DP fallback", "joint-DP model", "joint rated items"])
def writer(request, joint):
    return {"id key": _key, "cap counts": _caps, "DP fallback": _fallback,
            "joint-DP model": lambda: _joint(joint), "joint rated items": lambda: _rated(joint)}[request.param]()


def _refused(load, blob) -> str:
    with pytest.raises(FrameError) as refused:
        load(blob)
    assert "\n" not in str(refused.value)
    return str(refused.value)


def test_each_writer_round_trips_and_still_reads_its_old_blob(writer):
    blob, old, load = writer
    assert blob[:4] != old[:4] and b"frame" in blob[:64]   # a frame, not the old layout
    assert load(blob) == blob                             # every field back, bit for bit
    assert load(old) == blob                              # the old blob means the same state


def test_truncated_or_garbled_blobs_of_both_kinds_are_refused_in_one_line(writer):
    blob, old, load = writer
    for cut in sorted({*range(0, 80), *range(80, len(blob), max(1, len(blob) // 40))}):
        _refused(load, blob[:cut])
    for at in range(0, len(blob), max(1, len(blob) // 60)):
        garbled = bytearray(blob)
        garbled[at] ^= 0x20
        _refused(load, bytes(garbled))
    for cut in (10, len(old) // 2, len(old) - 1):
        assert "version-1" in _refused(load, old[:cut]) or "id key" in _refused(load, old[:cut])


def test_without_the_frames_checksum_a_flipped_secret_byte_is_a_different_key():
    """The broken variant: the old key blob had no check, so one flipped byte of the secret loaded
    as another key (every id keyed anew: users served someone else's history). The frame's CRC
    refuses it."""
    ids = [405, "alice"]
    unchecked = bytearray(encode(KEY_MAGIC, {}, {"secret": SECRET}, checksum=False))
    unchecked[-1] ^= 1
    assert IdKey.from_bytes(bytes(unchecked)).keys(ids).tolist() != IdKey(SECRET).keys(ids).tolist()
    checked = bytearray(IdKey(SECRET).to_bytes())
    checked[-1] ^= 1
    assert "checksum mismatch" in _refused(IdKey.from_bytes, bytes(checked))
    old = bytearray(b"SKIDKEY1" + SECRET)   # the old layout cannot tell: why it had to go
    old[-1] ^= 1
    assert IdKey.from_bytes(bytes(old)).keys(ids).tolist() != IdKey(SECRET).keys(ids).tolist()
