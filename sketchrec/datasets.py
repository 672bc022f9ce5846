"""Public ratings data sets by name: download once from the publisher, check a pinned SHA-256,
unpack into a cache, and hand back the path of the ratings file.

MovieLens' licence forbids redistributing the data, so the product ships checksums, not data.
A data set already on the machine is used where it is: ``$SKETCHREC_DATA/<its ratings path>``
(e.g. ``$SKETCHREC_DATA/ml-100k/u.data``; sketchrec.paths) before the cache or a download.
The cache is ``--cache DIR``, else ``$SKETCHREC_CACHE``, else ``$XDG_CACHE_HOME/sketchrec``, else
``~/.cache/sketchrec``; a data set lives in ``<cache>/<name>/`` once complete. Writes are atomic:
the archive goes to a temporary file in the cache, is checked, unpacked into a temporary folder
and that folder is renamed into place, so an interrupted download never counts as present.
``$SKETCHREC_DATA_URL`` replaces the publisher's base URL (a mirror, or a local server in tests).

>>> sorted(DATASETS)[:3]
['ml-100k', 'ml-10m', 'ml-1m']
>>> DATASETS["ml-1m"].ratings
'ml-1m/ratings.dat'
>>> resolve(__file__) == Path(__file__)          # an existing path is returned as it is
True
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
import tempfile
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

BASE_URL = "https://files.grouplens.org/datasets/movielens/"
MOVIELENS_LICENCE = ("MovieLens data (GroupLens Research, University of Minnesota): research use only, "
                     "no redistribution or commercial use without permission; cite Harper & Konstan, "
                     "ACM TiiS 5(4) 2015. Full terms: the README inside the archive.")
CHUNK = 1 << 20


@dataclass(frozen=True)
class DataSet:
    """One downloadable archive: where it is, what it must hash to and where its ratings are."""

    archive: str    # file name under the base URL
    sha256: str     # of the whole archive, as published (see the sources beside each entry)
    size: int       # bytes of the archive, for the progress line
    ratings: str    # path of the ratings file inside the archive
    licence: str = MOVIELENS_LICENCE


# Pinned SHA-256 of the GroupLens archives. Each was taken from public code that pins it and agrees
# with at least one other independent pin (none could be computed here: no network to GroupLens):
#  ml-100k, ml-1m, ml-20m, ml-25m, ml-latest-small: tensorflow/datasets,
#    tensorflow_datasets/url_checksums/movielens.txt (with the sizes); ml-100k/ml-1m/ml-20m/ml-25m/
#    ml-latest-small also in ISG-Siegen/OmniRec src/omnirec/data_loaders/movielens_*.py, ml-1m in
#    keras-rs' examples and secretflow, ml-20m and ml-latest-small in a Julia DataDeps registry.
#  ml-10m: ISG-Siegen/OmniRec src/omnirec/data_loaders/movielens_small.py, and several public
#    experiment records giving the same digest with size 65,566,137 and GroupLens' published MD5
#    ce571fd55effeba0271552578f2648bd.
# The ratings file of ml-100k inside the archive hashes to 06416e59...dca490, which matches the
# unmodified copy this project tests on.
DATASETS: dict[str, DataSet] = {
    "ml-100k": DataSet("ml-100k.zip", "50d2a982c66986937beb9ffb3aa76efe955bf3d5c6b761f4e3a7cd717c6a3229",
                       4_924_029, "ml-100k/u.data"),
    "ml-1m": DataSet("ml-1m.zip", "a6898adb50b9ca05aa231689da44c217cb524e7ebd39d264c56e2832f2c54e20",
                     5_917_549, "ml-1m/ratings.dat"),
    "ml-10m": DataSet("ml-10m.zip", "813c411ccb6122564edfe752e7f80c4dcc5aa25fa94c93622f6877a7ba252862",
                      65_566_137, "ml-10M100K/ratings.dat"),
    "ml-20m": DataSet("ml-20m.zip", "96f243c338a8665f6bcc89c53edf6ee39162a846940de6b7c8c48aeada765ff3",
                      198_702_078, "ml-20m/ratings.csv"),
    "ml-25m": DataSet("ml-25m.zip", "8b21cfb7eb1706b4ec0aac894368d90acf26ebdfb6aced3ebd4ad5bd1eb9c6aa",
                      261_978_986, "ml-25m/ratings.csv"),
    # the September 2018 snapshot; GroupLens may replace "latest" files, and the check then says so
    "ml-latest-small": DataSet("ml-latest-small.zip",
                               "696d65a3dfceac7c45750ad32df2c259311949efec81f0f144fdfb91ebc9e436",
                               978_202, "ml-latest-small/ratings.csv"),
}


class FetchError(RuntimeError):
    """A data set could not be fetched; the message is one line with the URL and the checksum."""


def cache_dir(cache: str | Path | None = None) -> Path:
    """Where data sets are kept: ``cache``, else $SKETCHREC_CACHE, else the XDG cache folder."""
    if cache:
        return Path(cache).expanduser()
    if os.environ.get("SKETCHREC_CACHE"):
        return Path(os.environ["SKETCHREC_CACHE"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(xdg) / "sketchrec"


def url_of(name: str) -> str:
    """The archive's URL (under $SKETCHREC_DATA_URL when set)."""
    base = os.environ.get("SKETCHREC_DATA_URL") or BASE_URL
    return base.rstrip("/") + "/" + DATASETS[name].archive


def fetched_path(name: str, cache: str | Path | None = None) -> Path:
    """Where the ratings file of ``name`` is once fetched (it may not exist yet)."""
    return cache_dir(cache) / name / DATASETS[name].ratings


def local_path(name: str) -> Path:
    """Where the ratings file of ``name`` is under ``$SKETCHREC_DATA`` (it may not exist)."""
    from sketchrec.paths import data_dir
    return data_dir() / DATASETS[name].ratings


def fetch(name: str, cache: str | Path | None = None,
          log: Callable[[str], None] | None = None) -> Path:
    """The path of the ratings file of data set ``name``: the copy under ``$SKETCHREC_DATA`` or
    in the cache when there is one, else downloaded (once).

    Raises ``KeyError`` for an unknown name and ``FetchError`` when the download fails or its
    checksum differs (nothing is left in the cache then)."""
    if name not in DATASETS:
        raise KeyError(f"unknown data set {name!r}; known: {', '.join(sorted(DATASETS))}")
    spec, target = DATASETS[name], fetched_path(name, cache)
    if target.is_file():
        return target
    if local_path(name).is_file():   # already on the machine: no download
        return local_path(name)
    log = log or (lambda text: print(text, file=sys.stderr))
    root = cache_dir(cache)
    root.mkdir(parents=True, exist_ok=True)
    url = url_of(name)
    log(f"downloading {name} from {url} ({spec.size / 1e6:.1f} MB) into {root}")
    log(spec.licence)
    fd, part = tempfile.mkstemp(prefix=f".{name}-", suffix=".zip.part", dir=root)
    try:
        with os.fdopen(fd, "wb") as out:
            digest = _download(url, out, spec.sha256)
        if digest != spec.sha256:
            raise FetchError(f"checksum mismatch for {url}: got sha256 {digest}, expected {spec.sha256}; "
                             "the download was discarded")
        _unpack(Path(part), root / name, spec.ratings, url)
    finally:
        Path(part).unlink(missing_ok=True)
    return target


def _download(url: str, out, expected: str) -> str:
    """Stream ``url`` into ``out``; the SHA-256 of what arrived. One-line errors name the URL."""
    hint = f"(expected sha256 {expected})"
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            length = response.headers.get("Content-Length")
            digest, got = hashlib.sha256(), 0
            while chunk := response.read(CHUNK):
                digest.update(chunk)
                out.write(chunk)
                got += len(chunk)
    except urllib.error.HTTPError as exc:
        raise FetchError(f"HTTP {exc.code} {exc.reason} from {url} {hint}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise FetchError(f"cannot download {url}: {reason} {hint}; with no network, download it "
                         "elsewhere and pass the ratings file's path instead of the name") from None
    if length is not None and got != int(length):
        raise FetchError(f"truncated download from {url}: {got} of {int(length)} bytes {hint}")
    return digest.hexdigest()


def _unpack(archive: Path, dest: Path, ratings: str, url: str) -> None:
    """Unpack into a temporary folder beside ``dest``, then rename it into place (atomic)."""
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
    try:
        with zipfile.ZipFile(archive) as zf:
            if ratings not in zf.namelist():
                raise FetchError(f"{url} has no {ratings}")
            zf.extractall(staging)  # zipfile strips absolute paths and '..' from member names
        if dest.exists():  # a stale, incomplete copy from an older layout: replace it
            shutil.rmtree(dest)
        staging.rename(dest)
    except zipfile.BadZipFile as exc:
        raise FetchError(f"{url} is not a valid zip archive: {exc}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def resolve(name_or_path: str | Path, cache: str | Path | None = None,
            log: Callable[[str], None] | None = None) -> Path:
    """An existing path as it is; a data-set name (``ml-1m``) as its fetched ratings file."""
    path = Path(name_or_path).expanduser()
    if path.exists() or str(name_or_path) not in DATASETS:
        return path
    return fetch(str(name_or_path), cache, log)


def fetch_main(argv: list[str] | None = None) -> int:
    """``sketchrec fetch NAME [--cache DIR]``: fetch a data set and print its ratings file's path."""
    ap = argparse.ArgumentParser(prog="sketchrec fetch", description="Download a public ratings data "
                                 "set, check its pinned SHA-256 and cache it; prints the ratings path.")
    ap.add_argument("name", nargs="?", choices=sorted(DATASETS), metavar="NAME",
                    help="one of: " + ", ".join(sorted(DATASETS)))
    ap.add_argument("--cache", type=Path, help="cache folder (default: $SKETCHREC_CACHE, else "
                    "$XDG_CACHE_HOME/sketchrec, else ~/.cache/sketchrec)")
    ap.add_argument("--list", action="store_true", help="list the data sets and whether each is cached")
    args = ap.parse_args(argv)
    if args.list or not args.name:
        for name, spec in sorted(DATASETS.items()):
            here = ("cached" if fetched_path(name, args.cache).is_file()
                    else "local" if local_path(name).is_file() else "-")
            print(f"{name:16s} {spec.size / 1e6:7.1f} MB  {here:6s} {url_of(name)}")
        return 0
    cached = fetched_path(args.name, args.cache).is_file() or local_path(args.name).is_file()
    try:
        path = fetch(args.name, args.cache)
    except FetchError as exc:
        print(f"sketchrec fetch: {exc}", file=sys.stderr)
        return 1
    if cached:  # a download has printed the licence already
        print(DATASETS[args.name].licence, file=sys.stderr)
    print(path)
    return 0
