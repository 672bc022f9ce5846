"""Compiled, chunked parsing of ratings files with pyarrow: a file is read a block at a time
(plain, gzip, zstd, bz2 or Parquet), each block's lines are split and converted to numpy columns
in compiled code, and only the lines that fail go through Python (to find their reason).

Why pyarrow: its CSV reader streams a file block by block in C++ with the codecs built in, its
compute kernels split lines and cast text to numbers, and it reads Parquet; memory is a block
and its columns, never the whole file as Python objects. Each line is read as one field and
split by the separator afterwards, so every physical line is one row: line numbers stay exact,
empty and short lines are counted by reason rather than dropped, a two-character separator
("::") works, and undecodable bytes never reach a Python callback.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sketchrec.formats import Layout
from sketchrec.line_fields import decimal_block
from sketchrec.text_ids import Coded, Vocabulary, all_decimal, utf8_buffers

MAX_ID_LENGTH = 256
BLOCK_BYTES = 2 << 20        # bytes of text per block a parse converts at once
PARQUET_ROWS = 262_144       # rows per Parquet batch
# a line is one field, split by the layout's separator afterwards; a line holding this control
# character is set aside as such (pyarrow refuses NUL as a delimiter)
_NO_DELIMITER = "\x1f"


class Block:
    """One block's converted columns and what it set aside (row positions in the block)."""

    def __init__(self, users: np.ndarray, items: np.ndarray, ratings: np.ndarray,
                 timestamps: np.ndarray, rejected: list[tuple[str, np.ndarray]], texts) -> None:
        self.users, self.items, self.ratings, self.timestamps = users, items, ratings, timestamps
        self.rejected = rejected     # (reason, row positions), positions into the block's lines
        self.texts = texts           # row position -> the line's text (for the examples)


def text_blocks(path: str | Path, codec: str | None, skip: int, dropped: list[int]) -> Iterator[pa.Array]:
    """The file's lines, a block at a time, as binary arrays (one row per physical line but those
    holding the unit-separator control character: their line numbers go to ``dropped``)."""
    import pyarrow.csv as csv

    def control(row) -> str:
        dropped.append(row.number)
        return "skip"
    stream = pa.input_stream(str(path), compression=codec)
    reader = csv.open_csv(
        stream,
        read_options=csv.ReadOptions(column_names=["line"], skip_rows=skip, block_size=BLOCK_BYTES,
                                   use_threads=False),
        parse_options=csv.ParseOptions(delimiter=_NO_DELIMITER, quote_char=False,
                                       ignore_empty_lines=False, invalid_row_handler=control),
        convert_options=csv.ConvertOptions(column_types={"line": pa.binary()}))
    for batch in reader:
        yield batch.column(0)


def split_block(lines: pa.Array, layout: Layout, vocab: Vocabulary | None = None) -> Block:
    """A block of lines: split, fields converted, bad rows set aside by reason (text ids as
    codes into ``vocab``: see ``settle_ids``)."""
    fast = decimal_block(lines, layout.sep, layout.width, layout.index)
    if fast is not None:   # plain decimal lines: one compiled pass (sketchrec.line_fields)
        return Block(*fast, [], lambda r: _text(lines, r))
    parts = pc.split_pattern(lines, pattern=layout.sep)
    counts = pc.list_value_length(parts).to_numpy(zero_copy_only=False)
    rejected: list[tuple[str, np.ndarray]] = []
    keep = counts == layout.width
    if not keep.all():
        rejected += _shape_reasons(lines, counts, layout.width)
        parts = parts.filter(pa.array(keep))
    fields = {role: pc.list_element(parts, i) for role, i in layout.index.items()}
    rows = np.flatnonzero(keep) if not keep.all() else None
    return _convert(fields, len(parts), rows, rejected, lambda r: _text(lines, r), vocab)


def parquet_block(batch: pa.RecordBatch, layout: Layout, vocab: Vocabulary | None = None) -> Block:
    """A Parquet batch's columns converted (a row's text is its values joined by commas)."""
    fields = {role: batch.column(i) for role, i in layout.index.items()}
    texts = lambda r: ",".join(str(batch.column(i)[int(r)].as_py()) for i in layout.index.values())
    return _convert(fields, batch.num_rows, None, [], texts, vocab)


def _convert(fields: dict, n: int, rows, rejected: list, texts, vocab: Vocabulary | None) -> Block:
    """Each role's column converted; a row any column refuses is set aside by the first reason
    (UTF-8 first, then user, item, rating and timestamp, as a line is read left to right)."""
    problems: list[tuple[str, np.ndarray]] = []
    users, p_user = ids(fields["user"])
    items, p_item = ids(fields["item"])
    ratings, p_rating = numbers(fields["rating"])
    stamps, p_stamp = (timestamps(fields["timestamp"]) if "timestamp" in fields
                       else (np.zeros(n, np.int64), []))
    for group in (p_user, p_item, p_rating, p_stamp):
        problems += [(r, m) for r, m in group if r == "not UTF-8"]
    for group in (p_user, p_item, p_rating, p_stamp):
        problems += [(r, m) for r, m in group if r != "not UTF-8"]
    good = None
    if problems:
        taken = np.zeros(n, bool)
        for reason, mask in problems:
            mine = mask & ~taken
            taken |= mine
            if mine.any():
                at = np.flatnonzero(mine)
                rejected.append((reason, at if rows is None else rows[at]))
        good = ~taken
        ratings, stamps = ratings[good], stamps[good]
    users, items = settle_ids(users, good, vocab), settle_ids(items, good, vocab)
    return Block(users, items, ratings, stamps, rejected, texts)


def _shape_reasons(lines: pa.Array, counts: np.ndarray, width: int) -> list[tuple[str, np.ndarray]]:
    """Rows with the wrong number of fields: empty (or blank) lines, missing or extra fields."""
    wrong = np.flatnonzero(counts != width)
    raw = [bytes(lines[int(r)].as_py()) for r in wrong]
    blank = np.array([not line.strip() for line in raw], bool)
    undecodable = np.array([not _decodes(line) for line in raw], bool) & ~blank
    rest = ~blank & ~undecodable
    out = [("empty line", wrong[blank]), ("not UTF-8", wrong[undecodable]),
           ("missing fields", wrong[rest & (counts[wrong] < width)]),
           ("too many fields", wrong[rest & (counts[wrong] > width)])]
    return [(reason, at) for reason, at in out if len(at)]


def _decodes(line: bytes) -> bool:
    try:
        line.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def _text(lines: pa.Array, row: int) -> str:
    return bytes(lines[int(row)].as_py()).decode("utf-8", "replace")


def _as_text(column: pa.Array) -> tuple[pa.Array, list]:
    """A binary column as UTF-8 text; the rows that are not UTF-8 (as empty text) and their mask."""
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        return column, []
    try:
        return column.cast(pa.string()), []
    except pa.ArrowInvalid:
        values = column.to_pylist()
        bad = np.zeros(len(values), bool)
        texts = []
        for k, raw in enumerate(values):
            try:
                texts.append(raw.decode("utf-8"))
            except UnicodeDecodeError:
                bad[k] = True
                texts.append("")
        return pa.array(texts, pa.string()), [("not UTF-8", bad)]


def ids(column: pa.Array) -> tuple[np.ndarray | pa.Array, list]:
    """Ids stay opaque: a column of integers becomes int64 (an int and its decimal text are the
    same key: sketches.hashing); other text stays an arrow array (``settle_ids`` makes it numpy
    once the bad rows are gone). Problems: "empty id", "oversized id" (over MAX_ID_LENGTH
    characters), "not UTF-8"."""
    if pa.types.is_integer(column.type):
        return column.to_numpy(zero_copy_only=False).astype(np.int64, copy=False), []
    text, problems = _as_text(column)
    try:   # the common case: decimal ids, converted without Python objects; a failing cast costs
        # as much as a whole one, so text ids (a UUID) are recognised by the block's first rows
        if not pc.any(pc.starts_with(text, "+")).as_py():
            pc.cast(text.slice(0, 64), pa.int64())
            return pc.cast(text, pa.int64()).to_numpy(zero_copy_only=False), problems
    except pa.ArrowInvalid:
        pass
    text = pc.utf8_trim_whitespace(text)
    length = pc.utf8_length(text).to_numpy(zero_copy_only=False)
    problems += [(r, m) for r, m in (("empty id", length == 0), ("oversized id", length > MAX_ID_LENGTH))
                 if m.any()]
    return text, problems


def settle_ids(values: np.ndarray | pa.Array, good: np.ndarray | None,
               vocab: Vocabulary | None = None) -> np.ndarray | Coded:
    """The kept rows' ids: int64 when every one is decimal digits (fewer than 19); else, with
    ``vocab`` (kept across a file's blocks), their codes in it (``Coded``: each distinct id's
    text held once for the whole file, no Python object per row); else an object array of str,
    one object per distinct id of the block. A decimal id among text ones is its int's text
    (leading zeros dropped), in either form."""
    if isinstance(values, np.ndarray):
        return values if good is None else values[good]
    text = values if good is None else values.filter(pa.array(good))
    if vocab is not None and not text.null_count:
        offsets, data = utf8_buffers(text)
        if not all_decimal(offsets, data):
            return Coded(vocab.codes(text), vocab)
        return pc.cast(text, pa.int64()).to_numpy(zero_copy_only=False)
    # one Python str per distinct id, shared by its rows (not one per row)
    encoded = pc.dictionary_encode(text, null_encoding="encode")
    pattern = pc.match_substring_regex(encoded.dictionary, r"^[0-9]{1,18}$")
    digits = pc.fill_null(pattern, False).to_numpy(zero_copy_only=False)
    if digits.all():
        return pc.cast(text, pa.int64()).to_numpy(zero_copy_only=False)
    names = encoded.dictionary.to_numpy(zero_copy_only=False)
    if digits.any():
        names[digits] = [str(int(v)) for v in names[digits]]
    return names[encoded.indices.to_numpy(zero_copy_only=False)]


def numbers(column: pa.Array) -> tuple[np.ndarray, list]:
    """Ratings as float64; "non-numeric rating" and "non-finite rating" rows marked."""
    if pa.types.is_floating(column.type) or pa.types.is_integer(column.type):
        values = column.to_numpy(zero_copy_only=False).astype(np.float64)
        bad: list = []
    else:
        text, bad = _as_text(column)
        try:
            values = pc.cast(text, pa.float64()).to_numpy(zero_copy_only=False)
        except pa.ArrowInvalid:
            values, wrong = _each(text.to_pylist(), float)
            bad = bad + [("non-numeric rating", wrong)]
    infinite = ~np.isfinite(values)
    if infinite.any():
        bad = bad + [("non-finite rating", infinite)]
    return values, bad


def timestamps(column: pa.Array) -> tuple[np.ndarray, list]:
    """Timestamps as int64 seconds: integers, or ISO dates (UTC); an empty field is 0."""
    if pa.types.is_integer(column.type):
        return column.to_numpy(zero_copy_only=False).astype(np.int64, copy=False), []
    if pa.types.is_timestamp(column.type):
        return pc.cast(column, pa.timestamp("s")).cast(pa.int64()).to_numpy(zero_copy_only=False), []
    text, bad = _as_text(column)
    try:
        return pc.cast(text, pa.int64()).to_numpy(zero_copy_only=False), bad
    except pa.ArrowInvalid:
        values, wrong = _each(text.to_pylist(), _stamp, np.int64)
        return values, bad + [("bad timestamp", wrong)]


def _stamp(text: str) -> int:
    text = text.strip()
    if not text:
        return 0
    try:
        return int(text)
    except ValueError:
        when = dt.datetime.fromisoformat(text)
        return int((when if when.tzinfo else when.replace(tzinfo=dt.timezone.utc)).timestamp())


def _each(values: list, convert, dtype=np.float64) -> tuple[np.ndarray, np.ndarray]:
    """Convert value by value (the slow path of a block with a bad value): values and a mask of
    the ones that failed (their value 0)."""
    out = np.zeros(len(values), dtype)
    wrong = np.zeros(len(values), bool)
    for k, value in enumerate(values):
        try:
            out[k] = convert(value)
        except (ValueError, TypeError, OverflowError):
            wrong[k] = True
    return out, wrong
