"""Where numba keeps the compiled kernels: one directory per state of the package's sources.

numba's cache (``@njit(cache=True)``) is invalidated by a change to the file that defines a kernel
only, but our kernels inline helpers from other modules (the heavy filter, AdaGrad's sums and the
implicit term all compile into ``models/_sgd.py``'s loops): after an edit of a helper alone, or a
``git pull`` that touches only it, numba would go on running the old helper, silently. Keying the
cache directory by the size and modification time of every source file of the compiled
subpackages makes any such change start from a fresh cache (the first run compiles again).
Of ``sketchrec.stream`` and ``sketchrec.privacy`` only the modules that use numba count: an edit of
the HTTP routes or the Kafka loop cannot change a kernel, and must not cost a recompile. The
learner tiers (``sketches``, ``models``) count whole, since a kernel there may also freeze a
module-level constant of a plain module at compile time.

The directory is ``$NUMBA_CACHE_DIR/<stamp>`` when that variable is set, else
``~/.cache/sketchrec/numba/<stamp>`` (there the three most recent stamps are kept, and older
ones once a day unused); where neither
can be written numba keeps its own default. It must be chosen before any kernel module is
imported: numba fixes a kernel's cache location when the decorator runs.

>>> len(sources_stamp([Path(__file__).parent]))
16
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from importlib.util import find_spec
from pathlib import Path

from sketchrec import _fast_inline

COMPILED = ("sketchrec.sketches", "sketchrec.models", "sketchrec.privacy", "sketchrec.stream")
NUMBA_ONLY = ("sketchrec.privacy", "sketchrec.stream")   # of these, the modules using numba only
KEEP = 3


def sources_stamp(roots: list[Path], numba_only: tuple[Path, ...] = ()) -> str:
    """A digest of the names and contents of the .py files under ``roots`` (under a root in
    ``numba_only``, of the files that mention numba only)."""
    digest = hashlib.blake2b(digest_size=8)
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            text = path.read_bytes()
            if root in numba_only and b"numba" not in text:
                continue
            digest.update(f"{path}:{len(text)};".encode())
            digest.update(text)
    return digest.hexdigest()


def _roots(names: tuple[str, ...] = COMPILED) -> list[Path]:
    roots = []
    for name in names:
        spec = find_spec(name)
        roots += [Path(p) for p in (spec.submodule_search_locations or [])] if spec else []
    return roots


def choose() -> str | None:
    """Point numba's cache at this source state's directory; returns it (None: numba's default)."""
    import numba
    _fast_inline.install()   # compile time only; before any kernel compiles
    given = os.environ.get("NUMBA_CACHE_DIR")
    try:
        base = Path(given) if given else Path.home() / ".cache" / "sketchrec" / "numba"
        target = base / sources_stamp(_roots(), tuple(_roots(NUMBA_ONLY)))
        target.mkdir(parents=True, exist_ok=True)
    except (OSError, RuntimeError):   # RuntimeError: no home directory to be found
        return None
    if not given:   # ours alone: older source states' kernels go, once a day old (not in use)
        states = sorted((p for p in base.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime)
        day_ago = time.time() - 86_400
        for old in [p for p in states if p != target][:max(0, len(states) - KEEP)]:
            if old.stat().st_mtime < day_ago:
                shutil.rmtree(old, ignore_errors=True)
    os.utime(target)
    numba.config.CACHE_DIR = str(target)
    return str(target)
