"""Rating sources: MovieLens files (auto-detected format) and a seeded synthetic stream.

Every source yields ``Ratings`` batches: aligned numpy columns of users, items, ratings and
timestamps. A malformed line is counted by reason and set aside (the first few are kept with
their line numbers for the report); it never stops the stream.
"""

from __future__ import annotations

import gzip
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np

MAX_ID_LENGTH = 256
FORMATS = {
    "movielens-csv": ",",   # ml-latest(-small)/ml-25m ratings.csv: userId,movieId,rating,timestamp + header
    "ml-100k": "\t",        # u.data: user \t item \t rating \t timestamp, no header
    "ml-1m": "::",          # ml-1m / ml-10m ratings.dat: user::item::rating::timestamp
}
# Each format's declared rating scale (its README's): the default --rating-range of `replay` and the
# declared range of local DP (privacy.ldp). A format not listed has none; nothing guesses one.
FORMAT_RANGES = {"ml-100k": (1.0, 5.0), "ml-1m": (1.0, 5.0), "movielens-csv": (0.5, 5.0)}
LEARN_RANGE_FROM = 1_000   # ratings a range is learned from when the format declares none


@dataclass
class Ratings:
    """A batch of rating tuples as aligned columns."""

    users: np.ndarray
    items: np.ndarray
    ratings: np.ndarray
    timestamps: np.ndarray

    def __len__(self) -> int:
        return int(self.ratings.shape[0])

    def take(self, index) -> "Ratings":
        return Ratings(self.users[index], self.items[index], self.ratings[index], self.timestamps[index])

    def n_ids(self) -> int:
        """Distinct users plus distinct items: the ``capacity`` a sketch is sized for.

        >>> Ratings(np.array([1, 1, 2]), np.array([7, 8, 7]), np.ones(3), np.zeros(3)).n_ids()
        4
        """
        return len(np.unique(self.users)) + len(np.unique(self.items))

    def batches(self, size: int) -> Iterator["Ratings"]:
        for start in range(0, len(self), size):
            yield self.take(slice(start, start + size))

    @staticmethod
    def concat(parts: list["Ratings"]) -> "Ratings":
        return Ratings(*(np.concatenate([getattr(p, f) for p in parts])
                         for f in ("users", "items", "ratings", "timestamps")))


@dataclass
class ParseReport:
    """What a parse set aside: counts by reason and the first few offending lines."""

    lines: int = 0
    accepted: int = 0
    skipped: Counter = field(default_factory=Counter)
    examples: list[tuple[int, str, str]] = field(default_factory=list)  # (line number, reason, text)
    max_examples: int = 5
    fmt: str | None = None   # the format detect_format found
    rating_range: tuple[float, float] | None = None   # the ratings kept; None: any finite rating
    range_source: str = "none"   # where that range came from (given, declared, learned)

    def reject(self, line_no: int, reason: str, text: str) -> None:
        self.skipped[reason] += 1
        if len(self.examples) < self.max_examples:
            self.examples.append((line_no, reason, text[:120]))

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


def _columns(rows: list[tuple]) -> Ratings:
    if not rows:
        return Ratings(np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0), np.empty(0, np.int64))
    users, items, ratings, stamps = zip(*rows)
    return Ratings(_id_array(users), _id_array(items), np.array(ratings, dtype=np.float64),
                   np.array(stamps, dtype=np.int64))


def _id_array(ids: tuple) -> np.ndarray:
    if all(type(x) is int for x in ids):
        return np.array(ids, dtype=np.int64)
    return np.array([str(x) for x in ids], dtype=object)


MOVIELENS_HEADER = "userid,movieid,rating,timestamp"


def open_text(path: str | Path):
    """A ratings file as text (UTF-8, bad bytes replaced); gzip (by its magic bytes) read
    transparently. IsADirectoryError, FileNotFoundError etc. as ``open`` raises them."""
    path = Path(path)
    with path.open("rb") as fh:
        gzipped = fh.read(2) == b"\x1f\x8b"
    opener = gzip.open if gzipped else open
    return opener(path, "rt", encoding="utf-8", errors="replace", newline="")


class RangeCheck:
    """Which ratings are kept: those in [lower, upper]. Without a given range: the format's
    declared scale, else the range of the first ``LEARN_RANGE_FROM`` ratings (1st to 99th
    percentile) widened on each side by its
    span or magnitude, so only ratings far outside it are set aside.
    ``"none"`` keeps every finite rating.

    >>> check = RangeCheck((1.0, 5.0)); check.keeps(5.0), check.keeps(99999.0)
    (True, False)
    """

    def __init__(self, given: tuple[float, float] | str | None = None, fmt: str | None = None):
        self.bounds: tuple[float, float] | None = None
        self.source = "none"
        if isinstance(given, tuple):
            self.bounds, self.source = (float(given[0]), float(given[1])), "given"
        elif given is None and fmt in FORMAT_RANGES:
            self.bounds, self.source = FORMAT_RANGES[fmt], f"declared by the format {fmt}"
        elif given is None:
            self.source = "learning"

    @property
    def learning(self) -> bool:
        return self.source == "learning"

    def learn(self, ratings: list[float]) -> None:
        """Fix the range from the first ratings (a no-op unless still learning)."""
        if not self.learning or not ratings:
            return
        lo, hi = (float(x) for x in np.percentile(ratings, [1, 99]))
        span = max(hi - lo, abs(lo), abs(hi), 1.0)   # generous: only far-off ratings go
        self.bounds = (lo - span, hi + span)
        self.source = f"learned from the first {len(ratings):,} ratings"

    def keeps(self, rating: float) -> bool:
        return self.bounds is None or self.bounds[0] <= rating <= self.bounds[1]


def read_ratings(path: str | Path, report: ParseReport | None = None,
                 rating_range: tuple[float, float] | str | None = None) -> tuple[Ratings, ParseReport]:
    """Read a whole ratings file in any supported format (plain or gzip). A rating outside
    ``rating_range`` (see ``RangeCheck``) is set aside as "rating out of range". A CSV without
    MovieLens's header declares no scale, so its range is learned. ValueError: unknown format."""
    report = report or ParseReport()
    rows: list[tuple] = []
    with open_text(path) as fh:
        first = fh.readline()
        if not first:
            return _columns(rows), report
        fmt = report.fmt = detect_format(first)
        sep = FORMATS[fmt]
        header = fmt == "movielens-csv" and not first.split(",")[0].strip().isdigit()
        generic_csv = fmt == "movielens-csv" and first.strip().lower() != MOVIELENS_HEADER
        check = RangeCheck(rating_range, None if generic_csv else fmt)
        pending: list[tuple[int, str, tuple]] = []   # read while the range is being learned
        lines = ((1, first),) if not header else ()
        for line_no, text in _chain(lines, enumerate(fh, start=2)):
            report.lines += 1
            if not text.strip():
                report.reject(line_no, "empty line", text)
                continue
            if "\ufffd" in text:
                report.reject(line_no, "not UTF-8", text)
                continue
            try:
                row = parse_line(text, sep)
            except ValueError as exc:
                report.reject(line_no, str(exc), text)
                continue
            if check.learning:
                pending.append((line_no, text, row))
                if len(pending) >= LEARN_RANGE_FROM:
                    _keep_in_range(pending, check, rows, report)
            elif check.keeps(row[2]):
                rows.append(row)
            else:
                report.reject(line_no, "rating out of range", text)
        _keep_in_range(pending, check, rows, report)
    report.accepted = len(rows)
    report.rating_range, report.range_source = check.bounds, check.source
    return _columns(rows), report


def _keep_in_range(pending: list, check: RangeCheck, rows: list, report: ParseReport) -> None:
    """Learn the range from the pending rows, then keep those inside it (in file order)."""
    check.learn([row[2] for _, _, row in pending])
    for line_no, text, row in pending:
        if check.keeps(row[2]):
            rows.append(row)
        else:
            report.reject(line_no, "rating out of range", text)
    pending.clear()


def _chain(*iterables):
    for it in iterables:
        yield from it


def order_ratings(ratings: Ratings, order: str, seed: int = 0) -> Ratings:
    """Replay order: by timestamp (stable), as in the file, or shuffled."""
    if order == "time":
        return ratings.take(np.argsort(ratings.timestamps, kind="stable"))
    if order == "file":
        return ratings
    if order == "shuffle":
        return ratings.take(np.random.default_rng(seed).permutation(len(ratings)))
    raise ValueError(f"unknown order {order!r}; use time, file or shuffle")


class SyntheticStream:
    """Ratings from a low-rank ground truth with Zipf-skewed users and items (seeded).

    r = clip(round_half(mu + b_u + b_i + u . v + noise), 1, 5), with users and items drawn with
    probability proportional to 1 / rank^skew, and timestamps increasing by exponential gaps.
    The ground truth is fixed at construction, so memory does not grow with the stream length.

    ``taste`` is the std of the taste term u . v (default 1 / sqrt(rank)); ``noise`` the std of
    the Gaussian noise before rounding. With ``change_point`` F in (0, 1) every user's taste
    vector u is redrawn (seeded, from its own generator: the stream before the point is the one
    without a change-point) for the ratings from position ``change_at`` = round(F * n_ratings)
    on: what was learned of the tastes before it is wrong after it (``drifting()`` is the
    benchmark stream of that kind). ``noise_floor()`` is the RMSE of the best possible
    predictor (the exact mean of the rounded, clipped rating given user, item and position).
    Deterministic by ``seed``:

    >>> s = SyntheticStream(1000, 50, 40, change_point=0.5, seed=3)
    >>> s.change_at, bool((s.all().ratings == SyntheticStream(1000, 50, 40, seed=3, change_point=0.5).all().ratings).all())
    (500, True)
    >>> bool((s.all().ratings[:500] == SyntheticStream(1000, 50, 40, seed=3).all().ratings[:500]).all())
    True
    >>> round(s.noise_floor(), 2)   # noise 0.5, widened by the rounding, narrowed by the clip
    0.51
    """

    def __init__(self, n_ratings: int = 500_000, n_users: int = 10_000, n_items: int = 3_000,
                 rank: int = 8, skew: float = 0.8, noise: float = 0.5, seed: int = 0,
                 change_point: float | None = None, taste: float | None = None):
        if min(n_ratings, n_users, n_items, rank) < 1:
            raise ValueError("sizes must be positive")
        if change_point is not None and not 0 < change_point < 1:
            raise ValueError("change_point must be a fraction strictly between 0 and 1")
        self.n_ratings, self.n_users, self.n_items = int(n_ratings), int(n_users), int(n_items)
        self.rank, self.skew, self.noise, self.seed = int(rank), float(skew), float(noise), int(seed)
        self.change_point, self.taste = change_point, taste
        rng = np.random.default_rng(seed)
        # per component: std(u . v) = taste (default 1 / sqrt(rank), the historical streams)
        scale = 1.0 / math.sqrt(rank) if taste is None else math.sqrt(taste / math.sqrt(rank))
        self._u = rng.normal(0, scale, (n_users, rank)).astype(np.float32)
        self._v = rng.normal(0, scale, (n_items, rank)).astype(np.float32)
        self._bu = rng.normal(0, 0.4, n_users).astype(np.float32)
        self._bi = rng.normal(0, 0.4, n_items).astype(np.float32)
        self._user_cdf = self._zipf_cdf(n_users)
        self._item_cdf = self._zipf_cdf(n_items)
        self.change_at = self.n_ratings if change_point is None else int(round(change_point * n_ratings))
        self._u_after = self._u if change_point is None else np.random.default_rng(
            [seed, 5]).normal(0, scale, (n_users, rank)).astype(np.float32)

    @classmethod
    def drifting(cls, n_ratings: int = 500_000, seed: int = 0) -> "SyntheticStream":
        """The change-point benchmark stream: 1,000 users and 1,000 items, strong tastes (std 1),
        noise 0.35 (noise floor 0.35), every taste redrawn halfway. On it the default sketch
        learner ends at windowed RMSE 0.67 (1/20 windows) and lr 0.05 / reg 0.02 at 0.50.
        ``replay --synthetic-users 1000 --synthetic-items 1000 --synthetic-taste 1
        --synthetic-noise 0.35 --change-point 0.5`` replays it."""
        return cls(n_ratings, 1_000, 1_000, noise=0.35, seed=seed, change_point=0.5, taste=1.0)

    def _zipf_cdf(self, n: int) -> np.ndarray:
        weights = 1.0 / np.arange(1, n + 1, dtype=np.float64) ** self.skew
        return np.cumsum(weights) / weights.sum()

    def _draws(self, size: int) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
        """(users, items, noiseless raw rating, noise, timestamps) of each batch."""
        rng = np.random.default_rng(self.seed + 1)
        clock = 1_500_000_000
        for start in range(0, self.n_ratings, size):
            n = min(size, self.n_ratings - start)
            u = np.minimum(np.searchsorted(self._user_cdf, rng.random(n)), self.n_users - 1)
            i = np.minimum(np.searchsorted(self._item_cdf, rng.random(n)), self.n_items - 1)
            after = (start + np.arange(n) >= self.change_at)[:, None]
            taste = np.where(after, self._u_after[u], self._u[u]) if self.change_point else self._u[u]
            mean = 3.6 + self._bu[u] + self._bi[i] + np.einsum("nr,nr->n", taste, self._v[i])
            noise = rng.normal(0, self.noise, n)
            stamps = clock + np.cumsum(rng.exponential(2.0, n)).astype(np.int64)
            clock = int(stamps[-1])
            yield u, i, mean, noise, stamps

    def batches(self, size: int = 10_000) -> Iterator[Ratings]:
        for u, i, mean, noise, stamps in self._draws(size):
            ratings = np.clip(np.round((mean + noise) * 2) / 2, 1.0, 5.0)
            yield Ratings(u.astype(np.int64) + 1, i.astype(np.int64) + 1, ratings, stamps)

    def all(self) -> Ratings:
        return Ratings.concat(list(self.batches(100_000)))

    def noise_floor(self) -> float:
        """RMSE of the best possible predictor over this stream: sqrt of the mean variance of
        clip(round_half(mean + noise), 1, 5) given each rating's mean (exact, by the normal CDF)."""
        from scipy.special import ndtr
        if self.noise == 0:
            return 0.0   # each rating is its mean, rounded: nothing left to predict
        grid = np.arange(1.0, 5.01, 0.5)                 # the values a rating takes
        edges = np.r_[-np.inf, grid[:-1] + 0.25, np.inf]  # rounding half-way points
        total = 0.0
        for _, _, mean, _, _ in self._draws(100_000):
            cdf = ndtr((edges[None, :] - mean[:, None]) / self.noise)
            p = np.diff(cdf, axis=1)
            first, second = p @ grid, p @ grid ** 2
            total += float(np.sum(second - first ** 2))
        return math.sqrt(total / self.n_ratings)
