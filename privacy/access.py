"""Per-user credentials for the serving endpoint.

/recommend never returns an item the user rated, so the catalogue minus one long answer is that
user's history (audit: `GET /recommend?user=405&k=1000` gave user 405's exact 737 rated items).
With access control on, an answer about user U goes only to a caller who proves it may act for U:
a token ``mint(U)`` = HMAC-SHA256 of U under a server key (given to U's device or session by the
operator's login), or the backend/admin token (a trusted backend acting for any user).

>>> tokens = UserTokens(b"k" * 32)
>>> tokens.verify("405", tokens.mint("405")), tokens.verify("406", tokens.mint("405"))
(True, False)
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets

KEY_ENV = "SKETCHREC_USER_TOKEN_KEY"  # hex key shared with whatever mints tokens
_CONTEXT = b"sketchrec user token v1\x00"


class UserTokens:
    """Mints and checks per-user tokens under one secret key (at least 16 bytes)."""

    def __init__(self, key: bytes):
        if len(key) < 16:
            raise ValueError("the user-token key needs at least 16 bytes")
        self._key = bytes(key)

    @classmethod
    def from_env(cls) -> "UserTokens":
        """The key from ``$SKETCHREC_USER_TOKEN_KEY`` (hex), else a fresh random one (then only the
        backend/admin token can ask for per-user answers until a key is configured)."""
        text = os.environ.get(KEY_ENV)
        return cls(bytes.fromhex(text) if text else secrets.token_bytes(32))

    def mint(self, user) -> str:
        """User ``user``'s token (ids are text: 5 and '5' are the same user)."""
        return hmac.new(self._key, _CONTEXT + str(user).encode(), hashlib.sha256).hexdigest()

    def verify(self, user, token: str | None) -> bool:
        return bool(token) and hmac.compare_digest(self.mint(user).encode(), token.encode())


def mint_user_token(key_hex: str, user) -> str:
    """A user's token under a hex key (what a login service runs)."""
    return UserTokens(bytes.fromhex(key_hex)).mint(user)
