"""What `replay` learns from: a ratings file (any layout and compression: sketchrec.reader;
ratings outside the range set aside by reason) or the built-in synthetic stream, as batches.

With ``--order file`` a file streams: one pass counts its ids and ratings (the sketch is sized
before the first rating is learned) keeping no ratings, the second learns a block at a time, so
memory is a block and the model whatever the file's size. Time order needs the whole file: its
columns are read into numpy arrays and sorted there, a column at a time."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import numpy as np

from sketchrec.data import ParseReport, Ratings, ScaleError, SyntheticStream, gather, order_ratings, rebatch
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


def add_data_args(ap: argparse.ArgumentParser) -> None:
    """The options that say how a ratings file is laid out (besides --rating-range)."""
    ap.add_argument("--columns", type=columns_option, metavar="user=A,item=B,rating=C[,timestamp=D]",
                    help="which column holds what: header names (any order), or 1-based positions "
                    "for a file without a header (default: a header's common names, e.g. userId, "
                    "movieId, item_id, rating, score, timestamp, ts; a file of numbers is read "
                    "as user, item, rating[, timestamp])")
    ap.add_argument("--sep", type=separator_option, metavar="S", help="field separator, e.g. ';' "
                    "or '\\t' (default: the first of '::', tab, ',', ';', '|' on the first line)")


def columns_option(text: str) -> dict:
    from sketchrec.formats import parse_columns
    try:
        return parse_columns(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def separator_option(text: str) -> str:
    sep = {"\\t": "\t", "tab": "\t", "space": " "}.get(text, text)
    if not sep or "\n" in sep or "\r" in sep:
        raise argparse.ArgumentTypeError(f"expected a separator such as ',' ';' '\\t', got {text!r}")
    return sep


def open_source(config: ReplayConfig, prog: str = "replay") -> Source:
    if not config.path:
        n_ratings, n_users, n_items = config.synthetic
        truth = config.evaluation
        synth = SyntheticStream(n_ratings, n_users, n_items, noise=truth.noise, seed=config.seed,
                                change_point=truth.change_point, taste=truth.taste)
        return Source(None, synth.batches(config.batch_size),
                      _capacity(config, synth.n_users + synth.n_items, prog), synth.n_ratings,
                      "synthetic", ParseReport(), synthetic=synth)
    batch = config.batch_size if config.speed is None else 100
    try:
        from sketchrec.reader import RatingFile
        source = RatingFile(config.path, config.rating_range, getattr(config, "columns", None),
                            getattr(config, "sep", None))
        if config.order == "file" and config.holdout is None:
            return _streamed(config, source, batch, prog)
        data = gather(source.chunks())
    except ScaleError as exc:   # nothing kept at all: the reasons, as for any file without ratings
        if source.report.accepted == 0:
            raise SystemExit(no_ratings_message(config.path, source.report, prog)) from None
        raise SystemExit(f"{prog}: {config.path}: {exc}") from None
    except (OSError, EOFError, ValueError, ArithmeticError) as exc:   # pyarrow's errors included
        raise SystemExit(f"{prog}: cannot read {config.path}: {_one_line(exc)}") from None
    report = source.report
    if len(data) == 0:
        raise SystemExit(no_ratings_message(config.path, report, prog))
    if config.holdout is None:  # a holdout split depends on the data set and seed only
        if config.order == "time":
            data.sort_by_time()   # in place, a column at a time
        else:
            data = order_ratings(data, config.order, config.seed)
    return Source(data, data.batches(batch), _capacity(config, data.n_ids(), prog), len(data),
                  str(config.path), report, report.fmt)


def _streamed(config: ReplayConfig, source, batch: int, prog: str) -> Source:
    """A file in file order: a counting pass (ids, ratings, what is set aside: the report is
    complete before learning), then the learning pass streams block by block."""
    source = source.again(source.report, intern=False)
    users, items = DistinctIds(), DistinctIds()
    for chunk in source.chunks():
        users.add(chunk.users)
        items.add(chunk.items)
    report = source.report
    if report.accepted == 0:
        raise SystemExit(no_ratings_message(config.path, report, prog))
    batches = rebatch(source.again(intern=False).chunks(), batch)
    return Source(None, batches, _capacity(config, len(users) + len(items), prog), report.accepted,
                  str(config.path), report, report.fmt)


class DistinctIds:
    """How many distinct ids a stream holds, by their 64-bit keys (``sketches.hashing.keys_of``,
    under which an int and its decimal text are one id, as for the model): 8 bytes per distinct
    id in one sorted array, never a Python object per id, whatever the ids' text.

    Examples
    --------
    >>> ids = DistinctIds()
    >>> ids.add(np.array([5, 7, 5]))
    >>> ids.add(np.array(["5", "alice", "alice"], dtype=object))
    >>> len(ids), ids.keys.nbytes
    (3, 24)
    """

    def __init__(self) -> None:
        self.keys = np.empty(0, np.uint64)
        self.pending: list[np.ndarray] = []   # blocks' keys, merged once they outgrow ``keys``

    def add(self, ids: np.ndarray) -> None:
        from sketchrec.sketches.hashing import keys_of
        if ids.dtype == object:   # a block's rows share one str per id: hash each id once
            ids = np.array(list(set(ids.tolist())), dtype=object)
        self.pending.append(np.unique(keys_of(ids)))
        # merging every block re-sorted all keys each time (most of the counting pass's time);
        # merging when the pending keys outnumber the merged ones costs a sort per doubling,
        # and holds at most twice the keys
        if sum(map(len, self.pending)) > max(len(self.keys), 1 << 16):
            self._merge()

    def _merge(self) -> None:
        self.keys = np.unique(np.concatenate([self.keys, *self.pending]))
        self.pending = []

    def __len__(self) -> int:
        self._merge()
        return len(self.keys)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


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


def scale_free(learner, source: Source, config: ReplayConfig):
    """The learner seen through the file's scale (sketchrec.scale): ratings on another scale than
    MovieLens' are learned as if on 1..5, so the default settings work the same; a MovieLens
    scale, the synthetic stream, the privacy modes (their ranges are declared to the mechanism)
    and a served model (it answers on the scale it learned) are left as they are."""
    from sketchrec.scale import ScaleFree, ScaleMap
    scale = ScaleMap.for_range(source.report.rating_range) if config.path else None
    if scale is None or config.dp.enabled or config.ldp_epsilon is not None \
            or config.serving.listen or config.serving.checkpoint:
        return learner
    return ScaleFree(learner, scale)
