"""A batch of ratings as aligned numpy columns (``Ratings``), and how one rating is read and
checked: the line formats, a line's fields, the report of what was set aside by reason, and the
rating scale a stream is held to (``RangeCheck``). The ground every rating source stands on
(files: sketchrec.reader; the synthetic stream: sketchrec.synthetic)."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np

from sketchrec.chunks import MAX_ID_LENGTH
from sketchrec.text_ids import Coded, count_distinct

FORMATS = {
    "movielens-csv": ",",   # ml-latest(-small)/ml-25m ratings.csv: userId,movieId,rating,timestamp + header
    "ml-100k": "\t",        # u.data: user \t item \t rating \t timestamp, no header
    "ml-1m": "::",          # ml-1m / ml-10m ratings.dat: user::item::rating::timestamp
}
# Each format's declared rating scale (its README's): the default --rating-range of `replay` and the
# declared range of local DP (privacy.ldp). A format not listed has none; nothing guesses one.
FORMAT_RANGES = {"ml-100k": (1.0, 5.0), "ml-1m": (1.0, 5.0), "movielens-csv": (0.5, 5.0)}
LEARN_RANGE_FROM = 1_000   # ratings a range is learned from when the format declares none


class Ratings:
    """A batch of rating tuples as aligned columns.

    A column of text ids may be held as int32 codes into the file's ``Vocabulary``
    (sketchrec.text_ids: ``Coded``): ``users`` and ``items`` are then built from the codes when
    read (an object array of str, each id one object), while taking, sorting, counting and
    hashing work on the codes (``coded``), so a file of text ids costs no Python object per
    rating on the way to the learner.

    Parameters
    ----------
    users, items : numpy arrays of ids, or ``Coded`` columns
    ratings : float64 array
    timestamps : int64 array

    Examples
    --------
    >>> import pyarrow as pa
    >>> from sketchrec.text_ids import Coded, Vocabulary
    >>> vocab = Vocabulary()
    >>> batch = Ratings(Coded(vocab.codes(pa.array(["ann", "bob", "ann"])), vocab), np.array([7, 8, 7]),
    ...                 np.ones(3), np.zeros(3, np.int64))
    >>> batch.take([2, 1]).users.tolist(), batch.n_ids()
    (['ann', 'bob'], 4)
    """

    def __init__(self, users, items, ratings: np.ndarray, timestamps: np.ndarray) -> None:
        self._ids: dict = {"users": users, "items": items}   # ndarray or Coded
        self._plain: dict = {}                                 # a Coded column's ids, once built
        self.ratings, self.timestamps = ratings, timestamps

    def _ids_of(self, name: str) -> np.ndarray:
        column = self._ids[name]
        if not isinstance(column, Coded):
            return column
        if name not in self._plain:
            self._plain[name] = column.ids()
        return self._plain[name]

    def _set(self, name: str, value) -> None:
        self._ids[name] = value
        self._plain.pop(name, None)

    users = property(lambda self: self._ids_of("users"), lambda self, v: self._set("users", v))
    items = property(lambda self: self._ids_of("items"), lambda self, v: self._set("items", v))

    def column(self, name: str):
        """A column as held: an ndarray, or for text ids held as codes their ``Coded``."""
        return self._ids[name] if name in self._ids else getattr(self, name)

    def coded(self, name: str) -> Coded | None:
        """The ``Coded`` column of ``users`` or ``items``, or None when it holds the ids."""
        column = self._ids[name]
        return column if isinstance(column, Coded) else None

    def __len__(self) -> int:
        return int(self.ratings.shape[0])

    def __repr__(self) -> str:
        return f"Ratings({len(self)} ratings)"

    def take(self, index) -> "Ratings":
        return Ratings(*(_take(self.column(name), index) for name in FIELDS))

    def n_ids(self) -> int:
        """Distinct users plus distinct items: the ``capacity`` a sketch is sized for.

        >>> Ratings(np.array([1, 1, 2]), np.array([7, 8, 7]), np.ones(3), np.zeros(3)).n_ids()
        4
        """
        return sum(_n_distinct(self.column(name)) for name in ("users", "items"))

    def batches(self, size: int) -> Iterator["Ratings"]:
        for start in range(0, len(self), size):
            yield self.take(slice(start, start + size))

    @staticmethod
    def concat(parts: list["Ratings"]) -> "Ratings":
        """The parts one after another (a text id column stays coded when every part's column
        is coded in one vocabulary)."""
        return Ratings(*(_concat([p.column(name) for p in parts]) for name in FIELDS))

    def sort_by_time(self) -> None:
        """Order by timestamp (stable), in place, a column at a time: the sort's extra memory is
        the permutation and one column, never a second copy of the data."""
        if len(self) < 2 or bool(np.all(self.timestamps[1:] >= self.timestamps[:-1])):
            return   # already in time order (a file without timestamps stays in file order)
        order = stable_order(self.timestamps)
        for name in ("users", "items"):
            self._set(name, _take(self._ids[name], order))
        self.ratings, self.timestamps = self.ratings[order], self.timestamps[order]


def _take(column, index):
    return Coded(column.codes[index], column.vocab) if isinstance(column, Coded) else column[index]


def _concat(columns: list):
    first = columns[0]
    if isinstance(first, Coded) and all(isinstance(c, Coded) and c.vocab is first.vocab for c in columns):
        return Coded(np.concatenate([c.codes for c in columns]), first.vocab)
    return np.concatenate([c.ids() if isinstance(c, Coded) else c for c in columns])


def _n_distinct(column) -> int:
    if isinstance(column, Coded):
        return count_distinct(column.codes, len(column.vocab))
    return n_distinct(column)


FIELDS = ("users", "items", "ratings", "timestamps")


def n_distinct(ids: np.ndarray) -> int:
    """How many distinct ids (what ``np.unique`` counts): numbers by arrow's hash table (numpy's
    unique takes seconds on 10M ids), objects (text ids, sorted as Python objects by numpy's: for
    minutes) as a Python set, which hashes each str once and needs no copy of their text.

    >>> n_distinct(np.array([3, 1, 3])), n_distinct(np.array(["a", "b", "a"], dtype=object))
    (2, 2)
    """
    import pyarrow as pa
    import pyarrow.compute as pc
    if len(ids) == 0:
        return 0
    if ids.dtype == object:
        return len(set(ids.tolist()))
    try:
        column = pa.array(ids)
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        return len(set(ids.tolist()))
    return int(pc.count_distinct(column, mode="all").as_py())


def stable_order(stamps: np.ndarray) -> np.ndarray:
    """``np.argsort(stamps, kind="stable")``, faster: integers of a span under 2^44 by a radix
    sort (sketchrec.radix); else, when the timestamps' span and the row count fit one int64
    together, each timestamp (less the least) with its row number appended is a
    distinct key, whose unstable sort (numpy's fastest) is that stable order.

    >>> stable_order(np.array([5, 3, 5, 3])).tolist()
    [1, 3, 0, 2]
    """
    n = len(stamps)
    if n < 2 or stamps.dtype.kind not in "iu":
        return np.argsort(stamps, kind="stable")
    from sketchrec.radix import radix_order
    order = radix_order(stamps)   # linear in the rows, when the span is under 2^44
    if order is not None:
        return order
    low, high = int(stamps.min()), int(stamps.max())
    row_bits = max(n - 1, 1).bit_length()
    if (high - low).bit_length() + row_bits > 62:
        return np.argsort(stamps, kind="stable")
    keys = (stamps - stamps.min()).astype(np.int64) << np.int64(row_bits)
    keys |= np.arange(n, dtype=np.int64)
    return np.argsort(keys)


@dataclass
class ParseReport:
    """What a parse set aside: counts by reason and the first few offending lines."""

    lines: int = 0
    accepted: int = 0
    skipped: Counter = field(default_factory=Counter)
    examples: list[tuple[int, str, str]] = field(default_factory=list)  # (line number, reason, text)
    max_examples: int = 5
    fmt: str | None = None   # the file's format (sketchrec.formats.Layout.fmt)
    rating_range: tuple[float, float] | None = None   # the ratings kept; None: any finite rating
    range_source: str = "none"   # where that range came from (given, declared, learned)
    timestamps: bool = True      # False: the file has none (time order is file order)

    def reject(self, line_no: int, reason: str, text: str) -> None:
        self.skipped[reason] += 1
        self.example(line_no, reason, text)

    def example(self, line_no: int, reason: str, text: str) -> None:
        """Keep the line among the examples if it is one of the first ``max_examples`` by line."""
        if len(self.examples) < self.max_examples or line_no < self.examples[-1][0]:
            self.examples.append((line_no, reason, text[:120]))
            self.examples.sort(key=lambda e: e[0])
            del self.examples[self.max_examples:]

    def wants_examples_before(self, line_no: int) -> bool:
        return len(self.examples) < self.max_examples or line_no < self.examples[-1][0]

    @property
    def n_skipped(self) -> int:
        return sum(self.skipped.values())

    def summary(self) -> dict:
        """What a run's result reports of the parse: counts by reason, their total, examples."""
        return {"skipped": dict(self.skipped), "skipped_total": self.n_skipped,
                "skipped_examples": [{"line": n, "reason": r, "text": t} for n, r, t in self.examples]}


def detect_format(first_line: str) -> str:
    """Name of the file format from its first line."""
    if "::" in first_line:
        return "ml-1m"
    if "\t" in first_line:
        return "ml-100k"
    if "," in first_line:
        return "movielens-csv"
    raise ValueError(f"unrecognised ratings format; first line: {first_line[:80]!r}")


def _parse_id(text: str):
    """Ids stay opaque: an all-digit id becomes an int (same key as its text), else a string."""
    text = text.strip()
    if not text:
        raise ValueError("empty id")
    if len(text) > MAX_ID_LENGTH:
        raise ValueError("oversized id")
    return int(text) if text.isdigit() and len(text) < 19 else text


def parse_line(text: str, sep: str) -> tuple:
    """(user, item, rating, timestamp) from one line, or ValueError naming the reason."""
    parts = text.rstrip("\r\n").split(sep)
    if len(parts) < 3:
        raise ValueError("missing fields")
    if len(parts) > 4:
        raise ValueError("too many fields")
    user, item = _parse_id(parts[0]), _parse_id(parts[1])
    try:
        rating = float(parts[2])
    except ValueError:
        raise ValueError("non-numeric rating") from None
    if not math.isfinite(rating):
        raise ValueError("non-finite rating")
    try:
        timestamp = int(parts[3]) if len(parts) == 4 and parts[3].strip() else 0
    except ValueError:
        raise ValueError("bad timestamp") from None
    return user, item, rating, timestamp



class ScaleError(ValueError):
    """Too many ratings lie outside a declared scale: one line naming the share and the fix."""


REFUSE_SHARE = 0.01   # a declared scale more ratings than this share violate is refused


class RangeCheck:
    """Which ratings are kept: those in [lower, upper]. Without a given range: the format's
    declared scale, else the range learned from the first ``LEARN_RANGE_FROM`` ratings by
    quantiles (``learn``). ``"none"`` keeps every finite rating. A given or declared scale that
    more than ``REFUSE_SHARE`` of the ratings violate is refused (``ScaleError``): those ratings
    are on another scale, and learning from the rest would be learning from a fraction.

    >>> check = RangeCheck((1.0, 5.0)); check.keeps(5.0), check.keeps(99999.0)
    (True, False)
    """

    def __init__(self, given: tuple[float, float] | str | None = None, fmt: str | None = None):
        self.bounds: tuple[float, float] | None = None
        self.source = "none"
        self.seen = self.outside = 0
        self.low = self.high = math.nan     # the extreme ratings seen, for the refusal's hint
        if isinstance(given, tuple):
            self.bounds, self.source = (float(given[0]), float(given[1])), "given"
        elif given is None and fmt in FORMAT_RANGES:
            self.bounds, self.source = FORMAT_RANGES[fmt], f"declared by the format {fmt}"
        elif given is None:
            self.source = "learning"

    @property
    def learning(self) -> bool:
        return self.source == "learning"

    def learn(self, ratings) -> None:
        """Fix the range from the first ratings (a no-op unless still learning): the least and
        greatest rating within a fence around the 1st and 99th percentiles, so a scale's own
        ends are its range (-10..10 learns [-10, 10]) and a stray typo far outside is not. A
        scale of many distinct values (a continuous score) is widened by 2 % of its span on each
        side, as a later rating may lie a little beyond the first ones.

        >>> c = RangeCheck(); c.learn(np.r_[np.arange(-10, 11).repeat(50), 1e6]); c.bounds
        (-10.0, 10.0)
        """
        values = np.asarray(ratings, dtype=np.float64)
        if not self.learning or not len(values):
            return
        q1, q99 = np.percentile(values, [1, 99])
        fence = max(q99 - q1, abs(q1), abs(q99), 1.0) / 2
        inside = values[(values >= q1 - fence) & (values <= q99 + fence)]
        lo, hi = float(inside.min()), float(inside.max())
        if len(np.unique(inside)) > 50:
            lo, hi = lo - 0.02 * (hi - lo), hi + 0.02 * (hi - lo)
        self.bounds = (lo, hi)
        self.source = f"learned from the first {len(values):,} ratings"

    def keeps(self, rating: float) -> bool:
        return self.bounds is None or self.bounds[0] <= rating <= self.bounds[1]

    def mask(self, ratings: np.ndarray) -> np.ndarray:
        """Which of ``ratings`` are kept; counts them towards the refusal's share."""
        if self.bounds is None:
            return np.ones(len(ratings), bool)
        keep = (ratings >= self.bounds[0]) & (ratings <= self.bounds[1])
        self.seen += len(ratings)
        self.outside += int(len(ratings) - keep.sum())
        if len(ratings):
            self.low, self.high = np.nanmin([self.low, ratings.min()]), np.nanmax([self.high, ratings.max()])
        return keep

    def refuse_if_violated(self, final: bool) -> None:
        """ScaleError when more than REFUSE_SHARE of the ratings so far lie outside a given or
        declared scale (judged once LEARN_RANGE_FROM ratings are seen, or at the end)."""
        if self.learning or self.bounds is None or self.source.startswith("learned"):
            return
        if not self.seen or (self.seen < LEARN_RANGE_FROM and not final):
            return
        share = self.outside / self.seen
        if share > REFUSE_SHARE:
            lo, hi = self.bounds
            raise ScaleError(f"{share:.1%} of the ratings ({self.outside:,} of {self.seen:,}) lie outside "
                             f"[{lo:g}, {hi:g}] ({self.source}); the ratings run from {self.low:g} to "
                             f"{self.high:g}: give their scale with --rating-range {self.low:g},{self.high:g} "
                             "(or 'none' to keep every finite rating)")
