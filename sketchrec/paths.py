"""Where the data sets are: ``$SKETCHREC_DATA`` (default ``../shared/data``, relative to the
current directory, as the README's commands run), so benchmarks and experiments find their
data from a wheel install as well as from a checkout.

>>> str(ml100k_default(env={DATA_ENV: "/data"}))
'/data/ml-100k/u.data'
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

DATA_ENV = "SKETCHREC_DATA"
DEFAULT_DATA_DIR = Path("..") / "shared" / "data"


class MissingData(FileNotFoundError):
    """A data file that is not there; its message is one line naming the path and the variable."""


def data_dir(env: Mapping[str, str] | None = None) -> Path:
    """The directory holding the data sets (``$SKETCHREC_DATA``, default ``../shared/data``).

    ``env`` stands for the process environment (read, never written)."""
    env = os.environ if env is None else env
    return Path(env.get(DATA_ENV) or DEFAULT_DATA_DIR)


def ml100k_default(env: Mapping[str, str] | None = None) -> Path:
    """Where ML-100k's ratings are expected: ``$SKETCHREC_DATA/ml-100k/u.data``."""
    return data_dir(env) / "ml-100k" / "u.data"


def ml100k(path: str | Path | None = None) -> Path:
    """The ratings file to use: ``path`` if given, else ML-100k's; MissingData when absent."""
    found = Path(path) if path is not None else ml100k_default()
    if not found.is_file():
        raise MissingData(f"no ratings file at {found} (give --data PATH, or set ${DATA_ENV} to "
                          f"the directory holding ml-100k/u.data)")
    return found
