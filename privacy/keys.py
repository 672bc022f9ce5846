"""The secret id key of a privacy mode: users and items are keyed by a PRF under operator state.

In the non-private mode ids keep today's public hash (``sketches.hashing.key_of``: MurmurHash3,
results bit-identical). That hash is public and invertible: whoever reads the code constructs an
id whose key equals user 405's and, wherever users choose their own ids, is served 405's history
under its own legitimately issued token. In every privacy mode ids are keyed instead by
``keyed_key_of`` (BLAKE2b under a 256-bit secret): operator state, drawn from the OS CSPRNG, carried
by checkpoints (the ``ID_KEY_PART`` part, never in a released snapshot or route), so a colliding id
cannot be constructed from public code.

>>> key = IdKey.fresh()
>>> IdKey.from_bytes(key.to_bytes()).keys([5, "5", "alice"]).tolist() == key.keys([5, "5", "alice"]).tolist()
True
>>> id_key_for(PrivacyMode.NONE) is None, id_key_for(PrivacyMode.DP_SGD_USER) is not None
(True, True)
"""

from __future__ import annotations

import secrets
from collections.abc import Hashable, Iterable

import numpy as np

from sketchrec.privacy.mode import PrivacyMode
from sketchrec.sketches.hashing import keyed_key_of, keyed_keys_of

ID_KEY_PART = "id_key"   # the checkpoint part holding it (operator state: never released)
_MAGIC = b"SKIDKEY1"


class IdKey:
    """A secret key for ids (32 bytes). Its repr never shows the key."""

    def __init__(self, secret: bytes):
        if len(secret) != 32:
            raise ValueError("an id key is 32 bytes")
        self._secret = bytes(secret)

    @classmethod
    def fresh(cls) -> "IdKey":
        return cls(secrets.token_bytes(32))

    def key_of(self, item_id: Hashable) -> int:
        return keyed_key_of(item_id, self._secret)

    def keys(self, ids: Iterable[Hashable] | np.ndarray) -> np.ndarray:
        """The uint64 keys of ``ids`` (a uint64 array is what the learners take as keys as is)."""
        return keyed_keys_of(ids, self._secret)

    def to_bytes(self) -> bytes:
        """For a checkpoint's operator parts only."""
        return _MAGIC + self._secret

    @classmethod
    def from_bytes(cls, blob: bytes) -> "IdKey":
        if blob[:len(_MAGIC)] != _MAGIC:
            raise ValueError("not an id key")
        return cls(blob[len(_MAGIC):])

    def __repr__(self) -> str:
        return "IdKey(<secret>)"


def id_key_for(mode: PrivacyMode, stored: bytes | None = None) -> IdKey | None:
    """The id key a model in ``mode`` keys its ids by: None (the public hash) when not private;
    else the one a checkpoint carries (``stored``), or a fresh one."""
    if not mode.private:
        return None
    return IdKey.from_bytes(stored) if stored is not None else IdKey.fresh()
