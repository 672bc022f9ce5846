"""Rating sources: ratings files (any layout: sketchrec.formats; parsed in compiled chunks:
sketchrec.chunks) and a seeded synthetic stream (sketchrec.synthetic).

Every source yields ``Ratings`` batches: aligned numpy columns of users, items, ratings and
timestamps. A malformed line is counted by reason and set aside (the first few are kept with
their line numbers for the report); it never stops the stream. A file is read a block at a time:
``RatingFile.chunks()`` streams it in bounded memory, ``read_ratings`` gathers it into columns.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import numpy as np

from sketchrec.chunks import MAX_ID_LENGTH
from sketchrec.ratings import (FIELDS, FORMAT_RANGES, FORMATS, LEARN_RANGE_FROM, ParseReport, RangeCheck,
                               Ratings, ScaleError, detect_format, parse_line)
from sketchrec.reader import RatingFile
from sketchrec.synthetic import SyntheticStream
from sketchrec.text_ids import Coded


def read_ratings(path: str | Path, report: ParseReport | None = None,
                 rating_range: tuple[float, float] | str | None = None, columns: dict | None = None,
                 sep: str | None = None) -> tuple[Ratings, ParseReport]:
    """Read a whole ratings file (any layout and compression: RatingFile) into columns. A rating
    outside ``rating_range`` (see ``RangeCheck``) is set aside as "rating out of range". A file
    without MovieLens's layout declares no scale, so its range is learned. ValueError: a layout
    that must be asked about, or a declared scale too many ratings violate (ScaleError)."""
    source = RatingFile(path, rating_range, columns, sep, report)
    return gather(source.chunks()), source.report


def gather(chunks) -> Ratings:
    """The chunks as one batch, in the memory of the result and one chunk: each chunk is copied
    into columns that grow in place (numpy's resize reallocates a large array by remapping its
    pages, without a second copy). Ids that are ints in one chunk and text in another all
    become text (one id, one key: sketches.hashing); text ids held as codes stay codes."""
    columns: list = []
    n = 0
    for chunk in chunks:
        parts = [chunk.column(name) for name in FIELDS]
        if not columns:
            columns = [_Column(p) for p in parts]
        for column, part in zip(columns, parts):
            column.put(n, part)
        n += len(chunk)
    _release_arrow_memory()
    if not columns:
        return Ratings(np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0), np.empty(0, np.int64))
    return Ratings(*(column.done(n) for column in columns))


class _Column:
    """A column filled chunk by chunk, grown in place: numbers, or text ids' codes into one
    vocabulary (``Coded``), or text ids as object arrays kept as pieces."""

    def __init__(self, first) -> None:
        dtype = np.int32 if isinstance(first, Coded) else first.dtype
        self.array = np.empty(1 << 16, dtype) if dtype != object else None
        self.vocab = first.vocab if isinstance(first, Coded) else None
        self.pieces: list[np.ndarray] = []

    def put(self, at: int, part) -> None:
        if isinstance(part, Coded) and self.vocab is None and self.array is not None:
            # codes after int ids: the ints become the codes of their text
            self.array, self.vocab = part.vocab.int_codes(self.array[:at]), part.vocab
        if self.vocab is not None:
            if isinstance(part, Coded) and part.vocab is self.vocab:
                part = part.codes
            elif isinstance(part, np.ndarray) and part.dtype.kind in "iu":
                part = self.vocab.int_codes(part)
            else:   # ids of another kind: every id an object from here on
                self.pieces, self.array = [Coded(self.array[:at], self.vocab).ids()], None
                self.vocab = None
        if isinstance(part, Coded):
            part = part.ids()
        if self.array is not None and part.dtype == object:   # text ids after int ones: all text
            self.pieces, self.array = [self.array[:at].astype(str).astype(object)], None
        if self.array is None:
            self.pieces.append(part.astype(str).astype(object) if part.dtype != object else part)
            return
        if at + len(part) > len(self.array):
            self.array.resize(max(at + len(part), int(len(self.array) * 1.5)), refcheck=False)
        self.array[at:at + len(part)] = part

    def done(self, n: int):
        if self.array is None:
            return np.concatenate(self.pieces) if self.pieces else np.empty(0, object)
        self.array.resize(n, refcheck=False)
        return self.array if self.vocab is None else Coded(self.array, self.vocab)


def _release_arrow_memory() -> None:
    """Give the memory pyarrow's pool kept from parsing back to the system."""
    try:
        import pyarrow as pa
        pa.default_memory_pool().release_unused()
    except (ImportError, AttributeError):
        pass


def order_ratings(ratings: Ratings, order: str, seed: int = 0) -> Ratings:
    """Replay order: by timestamp (stable), as in the file, or shuffled."""
    if order == "time":
        return ratings.take(np.argsort(ratings.timestamps, kind="stable"))
    if order == "file":
        return ratings
    if order == "shuffle":
        return ratings.take(np.random.default_rng(seed).permutation(len(ratings)))
    raise ValueError(f"unknown order {order!r}; use time, file or shuffle")


def rebatch(chunks, size: int) -> Iterator[Ratings]:
    """Chunks of any length as batches of ``size`` (the last may be shorter), in order."""
    held: list[Ratings] = []
    count = 0
    for chunk in chunks:
        held.append(chunk)
        count += len(chunk)
        if count < size:
            continue
        whole = Ratings.concat(held) if len(held) > 1 else held[0]
        cut = count - count % size
        yield from whole.take(slice(0, cut)).batches(size)
        held, count = ([whole.take(slice(cut, None))], count - cut) if cut < count else ([], 0)
    if count:
        yield Ratings.concat(held) if len(held) > 1 else held[0]


__all__ = ["FIELDS", "FORMATS", "FORMAT_RANGES", "LEARN_RANGE_FROM", "MAX_ID_LENGTH", "ParseReport",
           "RangeCheck", "Ratings", "ScaleError", "SyntheticStream", "detect_format",
           "gather", "order_ratings", "parse_line", "read_ratings", "rebatch"]
