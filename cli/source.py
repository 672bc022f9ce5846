"""What `replay` learns from: a ratings file (plain or gzip, any supported format, ratings
outside the range set aside by reason) or the built-in synthetic stream, as batches."""

from __future__ import annotations

import gzip
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from sketchrec.data import ParseReport, Ratings, SyntheticStream, order_ratings, read_ratings
from sketchrec.cli.config import ReplayConfig


@dataclass
class Source:
    """The ratings to replay: the whole file (None for the synthetic stream), as batches."""

    data: Ratings | None
    batches: Iterable[Ratings]
    capacity: int      # distinct users + items: sizes the sketch (public in the DP modes)
    total: int
    name: str
    report: ParseReport
    fmt: str | None = None   # the file's format (sketchrec.data.detect_format); None: synthetic
    synthetic: SyntheticStream | None = None   # the synthetic stream's generator (its ground truth)


def path_problem(path: str) -> str | None:
    """Why ``path`` is not a ratings file to read, or None."""
    p = Path(path)
    if p.is_dir():
        return f"{path} is a directory; give a ratings file"
    if not p.is_file():
        return f"no such file: {path}"
    return None


def open_source(config: ReplayConfig, prog: str = "replay") -> Source:
    if not config.path:
        n_ratings, n_users, n_items = config.synthetic
        truth = config.evaluation
        synth = SyntheticStream(n_ratings, n_users, n_items, noise=truth.noise, seed=config.seed,
                                change_point=truth.change_point, taste=truth.taste)
        return Source(None, synth.batches(config.batch_size),
                      _capacity(config, synth.n_users + synth.n_items, prog), synth.n_ratings,
                      "synthetic", ParseReport(), synthetic=synth)
    try:
        data, report = read_ratings(config.path, rating_range=config.rating_range)
    except (OSError, EOFError, zlib.error, gzip.BadGzipFile, ValueError) as exc:
        raise SystemExit(f"{prog}: cannot read {config.path}: {exc}") from None
    if len(data) == 0:
        raise SystemExit(no_ratings_message(config.path, report, prog))
    if config.holdout is None:  # a holdout split depends on the data set and seed only
        data = order_ratings(data, config.order, config.seed)
    batches = data.batches(config.batch_size if config.speed is None else 100)
    return Source(data, batches, _capacity(config, data.n_ids(), prog), len(data), str(config.path),
                  report, report.fmt)


def no_ratings_message(path: str, report: ParseReport, prog: str) -> str:
    """Why a file gave nothing to learn: the reasons with their counts, and the first lines."""
    if not report.n_skipped:
        return f"{prog}: no ratings in {path} (the file is empty)"
    reasons = ", ".join(f"{r}: {c:,}" for r, c in report.skipped.most_common())
    lines = [f"{prog}: no valid ratings in {path}: all {report.n_skipped:,} lines set aside ({reasons})"]
    if report.rating_range is not None and "rating out of range" in report.skipped:
        lo, hi = report.rating_range
        lines.append(f"  rating range [{lo:g}, {hi:g}] ({report.range_source}); "
                     "--rating-range L,U or 'none' changes it")
    lines += [f"  line {n}: {r}: {t!r}" for n, r, t in report.examples]
    return "\n".join(lines)


def _capacity(config: ReplayConfig, counted: int, prog: str) -> int:
    """--capacity, else the data's count; in the DP modes never the count (it would make the
    released model's shape depend on single ratings: privacy.release)."""
    from sketchrec.privacy.release import public_capacity
    try:
        return public_capacity(config.dp.enabled, config.capacity, counted)
    except ValueError as exc:
        raise SystemExit(f"{prog}: --capacity: {exc}") from None
