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

``IdKeys`` is the one place ids become keys for a model: a learner holds one (``model.id_keys``)
and everything that hashes ids for that model (its batch paths, the recommender, the service)
asks it, so the mode decides once which hash is used.

>>> IdKeys.for_mode(PrivacyMode.NONE).key_of(5) == key_of(5)
True
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Hashable, Iterable

import numpy as np

from sketchrec import frame
from sketchrec.privacy.mode import PrivacyMode
from sketchrec.sketches.hashing import KEY_DTYPE, as_keys, key_of, keyed_key_of, keyed_keys_of

ID_KEY_PART = "id_key"   # the checkpoint part holding it (operator state: never released)
MAGIC = b"SKIK"          # a frame (sketchrec.frame) with one part, the secret
_LEGACY = b"SKIDKEY1"    # before the frame: this magic, then the 32 secret bytes


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
        return frame.encode(MAGIC, {}, {"secret": self._secret})

    @classmethod
    def from_bytes(cls, blob: bytes) -> "IdKey":
        """Back from ``to_bytes`` (or the version-1 blob written before it was a frame); anything
        else is one ``FrameError`` line (a ValueError), never a key made of the wrong bytes."""
        if bytes(blob[:len(_LEGACY)]) == _LEGACY:
            if len(blob) != len(_LEGACY) + 32:
                raise frame.FrameError(f"id key: version-1 blob of {len(blob)} bytes, not "
                                       f"{len(_LEGACY) + 32}")
            return cls(bytes(blob[len(_LEGACY):]))
        secret = frame.decode(blob, MAGIC, "id key").parts.get("secret")
        if not isinstance(secret, bytes) or len(secret) != 32:
            raise frame.FrameError("id key: the frame holds no 32-byte secret")
        return cls(secret)

    def __repr__(self) -> str:
        return "IdKey(<secret>)"


def id_key_for(mode: PrivacyMode, stored: bytes | None = None) -> IdKey | None:
    """The id key a model in ``mode`` keys its ids by: None (the public hash) when not private;
    else the one a checkpoint carries (``stored``), or a fresh one."""
    if not mode.private:
        return None
    return IdKey.from_bytes(stored) if stored is not None else IdKey.fresh()


class IdKeys:
    """How one model turns ids into uint64 keys: under its secret ``IdKey`` in a privacy mode,
    by the public hash (``sketches.hashing``) otherwise. A uint64 array is already keys (as is)."""

    def __init__(self, id_key: IdKey | None = None):
        self.id_key = id_key

    @classmethod
    def for_mode(cls, mode: PrivacyMode, stored: bytes | None = None,
                 debug_seed: int | None = None) -> "IdKeys":
        """The keys of a model in ``mode``; with a debug noise seed (tests only: no guarantee,
        like the noise it seeds) a new key is derived from it, so neighbouring runs share it."""
        key = id_key_for(mode, stored)
        if key is not None and stored is None and debug_seed is not None:
            key = IdKey(hashlib.blake2b(str(int(debug_seed)).encode(), digest_size=32,
                                        person=b"sketchrec-dbgkey").digest())
        return cls(key)

    @property
    def keyed(self) -> bool:
        return self.id_key is not None

    def key_of(self, item_id: Hashable) -> int:
        return key_of(item_id) if self.id_key is None else self.id_key.key_of(item_id)

    def as_keys(self, ids_or_keys) -> np.ndarray:
        """``sketches.hashing.as_keys`` under this model's hash."""
        if self.id_key is None:
            return as_keys(ids_or_keys)
        if isinstance(ids_or_keys, np.ndarray) and ids_or_keys.dtype == KEY_DTYPE:
            return np.ascontiguousarray(ids_or_keys)
        if np.isscalar(ids_or_keys) or isinstance(ids_or_keys, (str, bytes)):
            return np.array([self.id_key.key_of(ids_or_keys)], dtype=KEY_DTYPE)
        return self.id_key.keys(ids_or_keys)

    def parts(self) -> dict[str, bytes]:
        """Checkpoint parts (operator state): the key, when there is one."""
        return {} if self.id_key is None else {ID_KEY_PART: self.id_key.to_bytes()}

    def __repr__(self) -> str:
        return "IdKeys(<secret>)" if self.keyed else "IdKeys(public)"


PUBLIC = IdKeys()


def id_keys_of(model) -> IdKeys:
    """The ids-to-keys map of any model: its own, or the public hash (a model from outside the
    package trains non-privately)."""
    keys = getattr(model, "id_keys", None)
    return keys if isinstance(keys, IdKeys) else PUBLIC


def restore_id_key(model, parts: dict[str, bytes]) -> None:
    """Give ``model`` the id key a checkpoint or snapshot carries (``ID_KEY_PART``), if any: a
    restored model must key ids as the one that learned them."""
    if ID_KEY_PART in parts and hasattr(model, "id_keys"):   # a key stored was drawn for a mode
        model.id_keys = IdKeys(IdKey.from_bytes(parts[ID_KEY_PART]))


def key_local_ids(model) -> None:
    """Local DP is a privacy mode of the stream, not of the learner: when perturbed ratings
    arrive for a model that has learned nothing yet under the public hash, it keys ids too (a
    model that already learned keeps its keys: changing them would orphan what it learned)."""
    keys = getattr(model, "id_keys", None)
    if isinstance(keys, IdKeys) and not keys.keyed and getattr(model, "n_learned", 1) == 0:
        key = id_key_for(PrivacyMode.LDP)
        if key is not None:
            model.id_keys = IdKeys(key)
