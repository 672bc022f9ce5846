"""A ratings file read a block at a time: its layout told from its first line (sketchrec.formats),
each block parsed in compiled code (sketchrec.chunks), its ratings kept or set aside by reason
(sketchrec.ratings.RangeCheck), so a file of any size streams in the memory of a block."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import numpy as np

from sketchrec.chunks import PARQUET_ROWS, parquet_block, split_block, text_blocks
from sketchrec.ratings import LEARN_RANGE_FROM, ParseReport, RangeCheck, Ratings
from sketchrec.text_ids import Coded, Vocabulary


class RatingFile:
    """A ratings file read a block at a time (``chunks``), its layout told by sketchrec.formats.

    ``rating_range`` as ``RangeCheck`` takes it; ``columns`` (``formats.parse_columns``) and
    ``sep`` as ``--columns`` and ``--sep`` give them; ``intern=False`` for a file streamed block
    by block (see ``vocab``). Opening reads the first line only; LayoutError (a ValueError)
    when it cannot be told without asking."""

    def __init__(self, path: str | Path, rating_range: tuple[float, float] | str | None = None,
                 columns: dict | None = None, sep: str | None = None, report: ParseReport | None = None,
                 intern: bool = True):
        from sketchrec.formats import compression_of, parquet_layout, sniff
        self.path, self.report = Path(path), report or ParseReport()
        # each distinct text id's text held once across blocks, the rows as codes into it
        # (chunks.settle_ids): for a file gathered whole; a streamed file's blocks die as they
        # are learned, and a table across them would keep every distinct id alive
        # (intern=False: one str object per id per block)
        self.vocab: Vocabulary | None = Vocabulary() if intern else None
        self.codec = compression_of(path)
        self.rating_range, self.columns, self.sep = rating_range, columns, sep
        if self.codec == "parquet":
            import pyarrow.parquet as pq
            self.layout = parquet_layout(pq.ParquetFile(self.path).schema_arrow.names, columns)
        else:
            first = self._first_line()
            self.layout = sniff(first, sep, columns) if first.strip() else None
        self.report.fmt = self.layout.fmt if self.layout else None
        self.report.timestamps = bool(self.layout and self.layout.has_timestamps)

    def _first_line(self) -> str:
        import pyarrow as pa
        with pa.input_stream(str(self.path), compression=self.codec) as stream:
            head = b""
            while b"\n" not in head and len(head) < 1 << 20:
                more = stream.read(1 << 16)
                if not more:
                    break
                head += more
        return head.split(b"\n", 1)[0].decode("utf-8", "replace")

    def again(self, report: ParseReport | None = None, intern: bool | None = None) -> "RatingFile":
        """The same file, to read once more (a fresh report unless one is given; interning as
        this one unless ``intern`` says)."""
        intern = self.vocab is not None if intern is None else intern
        return RatingFile(self.path, self.rating_range, self.columns, self.sep, report, intern)

    def chunks(self) -> Iterator[Ratings]:
        """The kept ratings, a block at a time, in file order; the report counts as it goes.
        ScaleError as soon as a given or declared scale is violated by too many ratings."""
        report = self.report
        if self.layout is None:
            return
        check = RangeCheck(self.rating_range, self.layout.fmt)
        pending: list[tuple[Ratings, np.ndarray, object]] = []   # blocks read while learning the range
        for ratings, lines, texts in self._blocks():
            if check.learning:
                pending.append((ratings, lines, texts))
                if sum(len(p[0]) for p in pending) < LEARN_RANGE_FROM:
                    continue
                check.learn(np.concatenate([p[0].ratings for p in pending])[:LEARN_RANGE_FROM])
            for block in (pending or [(ratings, lines, texts)]):
                kept = self._in_range(check, *block)
                check.refuse_if_violated(final=False)
                if len(kept):
                    yield kept
            pending.clear()
        if pending:
            check.learn(np.concatenate([p[0].ratings for p in pending])[:LEARN_RANGE_FROM])
            for block in pending:
                kept = self._in_range(check, *block)
                if len(kept):
                    yield kept
        check.refuse_if_violated(final=True)
        report.rating_range, report.range_source = check.bounds, check.source

    def _in_range(self, check: RangeCheck, ratings: Ratings, lines: np.ndarray, texts) -> Ratings:
        keep = check.mask(ratings.ratings)
        if not keep.all():
            out = np.flatnonzero(~keep)
            self._reject("rating out of range", lines[out], texts)
            ratings = ratings.take(keep)
        self.report.accepted += len(ratings)
        self.report.rating_range, self.report.range_source = check.bounds, check.source
        return ratings

    def _reject(self, reason: str, line_numbers: np.ndarray, texts) -> None:
        self.report.skipped[reason] += len(line_numbers)
        for line_no, row in line_numbers[:self.report.max_examples]:
            if not self.report.wants_examples_before(int(line_no)):
                break
            self.report.example(int(line_no), reason, texts(row))

    def _blocks(self) -> Iterator[tuple[Ratings, np.ndarray, object]]:
        """Each block's parsed ratings with their (line number, row) pairs and texts."""
        header = 1 if self.layout.header and self.codec != "parquet" else 0
        dropped: list[int] = []   # lines the reader set aside (a control character), in order
        if self.codec == "parquet":
            import pyarrow.parquet as pq
            names = self.layout.names
            source = ((b, parquet_block) for b in pq.ParquetFile(self.path).iter_batches(
                PARQUET_ROWS, columns=[names[i] for i in self.layout.index.values()]))
            layout = _reindexed(self.layout)
        else:
            source = ((b, split_block) for b in text_blocks(self.path, self.codec, header, dropped))
            layout = self.layout
        rows_before, dropped_seen = 0, 0
        for raw, convert in source:
            block = convert(raw, layout, self.vocab)
            n = len(raw)
            self.report.lines += n
            where = np.arange(header + 1 + rows_before, header + 1 + rows_before + n)
            rows_before += n
            for line in sorted(dropped):   # rows after a line set aside are one line further on
                where[where >= line] += 1
            for line in dropped[dropped_seen:]:
                self.report.lines += 1
                self.report.reject(int(line), "control character", "")
            dropped_seen = len(dropped)
            good = np.ones(n, bool)
            for reason, rows in block.rejected:
                good[rows] = False
                self._reject(reason, np.c_[where[rows], rows], block.texts)
            lines = np.c_[where[good], np.flatnonzero(good)]
            # writable columns: arrow's zero-copy arrays are read-only, and to numba a read-only
            # array is another type, so a block streamed to a learner as it is (--order file)
            # would compile every kernel a second time, inside the learning loop
            columns = [writable(c) for c in (block.users, block.items, block.ratings, block.timestamps)]
            yield Ratings(*columns), lines, block.texts
        for line in dropped[dropped_seen:]:
            self.report.lines += 1
            self.report.reject(int(line), "control character", "")


def writable(column):
    """``column``, copied only when it is read-only (a column of codes as it is: its codes are
    never handed to a kernel)."""
    return column if isinstance(column, Coded) else np.require(column, requirements="W")


def _reindexed(layout):
    """A Parquet layout over the columns read (in the order they were asked for)."""
    from dataclasses import replace
    return replace(layout, index={role: k for k, role in enumerate(layout.index)})
