"""`sketchrec fetch NAME`: download a public ratings data set, check its pinned SHA-256, cache it
(``sketchrec.datasets``), and `resolve_data`, which lets every command take a name for a path."""

from __future__ import annotations

import sys
from pathlib import Path

from sketchrec.datasets import fetch_main

__all__ = ["fetch_main", "resolve_data"]


def resolve_data(name_or_path: str | None, prog: str, cache: Path | None = None) -> str | None:
    """A ratings path as given; a data-set name (``ml-1m``) fetched on first use and cached; a
    failed fetch ends the command with its one-line message."""
    if name_or_path is None:
        return None
    from sketchrec.datasets import FetchError, resolve
    try:
        return str(resolve(name_or_path, cache, log=lambda line: print(f"{prog}: {line}", file=sys.stderr)))
    except FetchError as exc:
        raise SystemExit(f"{prog}: {exc}") from None
