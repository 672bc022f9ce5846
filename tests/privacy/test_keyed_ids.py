"""Ids in a privacy mode are keyed by a secret PRF: a collision constructed offline against the
public hash (MurmurHash3, invertible) no longer collides; the non-private mode keeps the public hash."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sketchrec.privacy.keys import ID_KEY_PART, IdKey, id_key_for
from sketchrec.privacy.mode import PrivacyMode
from sketchrec.sketches.hashing import key_of, keyed_key_of, keyed_keys_of, keys_of

M64 = (1 << 64) - 1
C1, C2 = 0x87C37B91114253D5, 0x4CF5AD432745937F
F1, F2 = 0xFF51AFD7ED558CCD, 0xC4CEB9FE1A85EC53


def _rotl(x, r):
    return ((x << r) | (x >> (64 - r))) & M64


def _rotr(x, r):
    return _rotl(x, 64 - r)


def _inv(a):
    return pow(a, -1, 1 << 64)


def _fmix_inverse(z):
    z ^= z >> 33
    z = (z * _inv(F2)) & M64
    z ^= z >> 33
    z = (z * _inv(F1)) & M64
    return z ^ (z >> 33)


def forge(target: int, seed: int = 0, split: int = 0x0123456789ABCDEF) -> bytes:
    """The attack, from public code only: a 16-byte id whose public key is ``target``, by running
    MurmurHash3 x64-128 (low half) backwards through its one block (every step is invertible)."""
    h1 = _fmix_inverse(split)
    h2 = _fmix_inverse((target - split) & M64)
    h2 = (h2 - h1) & M64                 # undo h1 += h2; h2 += h1
    h1 = (h1 - h2) & M64
    h1, h2 = h1 ^ 16, h2 ^ 16            # undo the length
    mid2 = _rotr((((h2 - 0x38495AB5) * _inv(5)) - h1) & M64, 31)
    k2 = (_rotr(((mid2 ^ seed) * _inv(C1)) & M64, 33) * _inv(C2)) & M64
    mid1 = _rotr((((h1 - 0x52DCE729) * _inv(5)) - seed) & M64, 27)
    k1 = (_rotr(((mid1 ^ seed) * _inv(C2)) & M64, 31) * _inv(C1)) & M64
    return k1.to_bytes(8, "little") + k2.to_bytes(8, "little")


def test_the_attack_constructs_ids_colliding_under_the_public_hash():
    # the broken variant (the public hash, as every mode used): the forged ids collide with user 405
    for split in (1, 2**63 + 5, 0xDEADBEEF):
        forged = forge(key_of(405), split=split)
        assert forged != b"405" and key_of(forged) == key_of(405)
    assert keys_of([forge(key_of("alice"))]).tolist() == [key_of("alice")]


def test_a_collision_forged_offline_does_not_collide_under_a_privacy_modes_id_key():
    for mode in PrivacyMode:
        id_key = id_key_for(mode)
        if not mode.private:
            assert id_key is None   # the public hash stays: non-private results are bit-identical
            continue
        for split in (1, 2**63 + 5, 0xDEADBEEF):
            forged = forge(key_of(405), split=split)
            assert id_key.key_of(forged) != id_key.key_of(405)
        assert id_key.key_of(405) == id_key.key_of("405")     # one id, whatever its type


def test_id_keys_are_secret_fresh_and_carried_by_checkpoints():
    a, b = IdKey.fresh(), IdKey.fresh()
    assert a.key_of(405) != b.key_of(405)                     # fresh: nothing public predicts it
    back = id_key_for(PrivacyMode.DP_SGD_USER, a.to_bytes())
    ids = np.array([1, 405, 405, 7, 1])
    assert back.keys(ids).tolist() == a.keys(ids).tolist() == [a.key_of(int(v)) for v in ids]
    assert a._secret.hex() not in repr(a) and ID_KEY_PART == "id_key"
    with pytest.raises(ValueError):
        IdKey.from_bytes(b"x" * 40)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(st.integers(), st.text()), min_size=1, max_size=20))
def test_keyed_keys_of_many_ids_match_one_by_one(ids):
    secret = b"k" * 32
    assert keyed_keys_of(ids, secret).tolist() == [keyed_key_of(i, secret) for i in ids]
