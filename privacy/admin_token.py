"""The admin (backend) token of every serving command: from a file, the environment or the command
line, never empty.

>>> ap = argparse.ArgumentParser(); add_admin_token_args(ap, env={"SKETCHREC_ADMIN_TOKEN": "  "})
>>> ap.parse_args([]).admin_token is None          # an empty or blank token enables nothing
True
>>> ap.parse_args(["--admin-token", " s3cret "]).admin_token
's3cret'
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

ENV = "SKETCHREC_ADMIN_TOKEN"


def admin_token(text: str | None) -> str | None:
    """The token without surrounding blanks; None (admin disabled) when nothing is left."""
    return (text or "").strip() or None


def read_token_file(path: str) -> str | None:
    """The token held by a file (its first line); argparse error if it cannot be read."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise argparse.ArgumentTypeError(f"cannot read the admin token from {path}: {exc}") from None
    token = admin_token(lines[0] if lines else "")
    if token is None:
        raise argparse.ArgumentTypeError(f"{path} holds no admin token (empty)")
    return token


def add_admin_token_args(ap: argparse.ArgumentParser, env=None) -> None:
    """--admin-token and --admin-token-file (one ``admin_token``; default: $SKETCHREC_ADMIN_TOKEN)."""
    env = os.environ if env is None else env
    ap.add_argument("--admin-token", type=admin_token, default=env.get(ENV),
                    help=f"bearer token of the backend: POST /checkpoint, /pause, /resume, GET "
                    f"/admin/privacy, and any user's answers (default: ${ENV}; none or blank: admin "
                    "endpoints disabled). NOTE: a token given here is visible to other local users "
                    "in `ps`; prefer --admin-token-file or the environment variable")
    ap.add_argument("--admin-token-file", dest="admin_token", type=read_token_file, metavar="PATH",
                    help="read the admin token from the first line of PATH (not visible in `ps`)")
