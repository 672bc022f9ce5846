"""How a ratings file is laid out: its compression, its separator, whether its first line is a
header, and which column holds the user, the item, the rating and the timestamp.

A header's names are honoured whatever their order (the common spellings below, case and
punctuation ignored); ``--columns user=...,item=...,rating=...[,timestamp=...]`` names them (a
header's names) or numbers them (1-based positions, the file has no header); ``--sep`` gives the
separator. A first line that is neither all numbers nor a header naming the columns is asked
about (``LayoutError``, one line naming ``--columns``), never guessed: a guess either drops a
rating as a header or reads a header as a rating.

>>> layout = sniff("item,user,rating,ts")
>>> layout.header, layout.index
(True, {'user': 1, 'item': 0, 'rating': 2, 'timestamp': 3})
>>> sniff("1::2::3.5::4").fmt, sniff("1\\t2\\t3").index
('ml-1m', {'user': 0, 'item': 1, 'rating': 2})
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

ROLES = ("user", "item", "rating", "timestamp")
REQUIRED = ROLES[:3]
# Spellings of each column's name, compared lower-cased without punctuation ("user_id" = "userid")
SYNONYMS = {
    "user": {"user", "userid", "users", "uid", "u", "customer", "customerid", "reviewer",
             "reviewerid", "visitor", "visitorid", "member", "memberid", "account", "accountid"},
    "item": {"item", "itemid", "items", "iid", "i", "movie", "movieid", "mid", "product",
             "productid", "asin", "film", "filmid", "book", "bookid", "isbn", "track", "trackid",
             "song", "songid", "artist", "artistid", "article", "articleid", "business", "businessid"},
    "rating": {"rating", "ratings", "rate", "score", "stars", "star", "value", "r", "preference",
               "grade", "overall", "feedback"},
    "timestamp": {"timestamp", "time", "ts", "t", "date", "datetime", "unixtime", "epoch",
                  "created", "createdat", "when", "unixreviewtime"},
}
SEPARATORS = ("::", "\t", ",", ";", "|")   # tried in this order on the first line
# MovieLens' own layouts: their formats declare a rating scale (sketchrec.data.FORMAT_RANGES)
MOVIELENS_HEADER = ("userid", "movieid", "rating", "timestamp")
MAGIC = ((b"\x1f\x8b", "gzip"), (b"\x28\xb5\x2f\xfd", "zstd"), (b"BZh", "bz2"), (b"PAR1", "parquet"))
COLUMNS_HELP = "--columns user=NAME,item=NAME,rating=NAME[,timestamp=NAME] (or 1-based positions)"


class LayoutError(ValueError):
    """The file's layout cannot be told without asking; the message is one line naming the fix."""


@dataclass
class Layout:
    """Where each role's field is (0-based) on a line split by ``sep``; ``width`` fields a line."""

    sep: str
    header: bool
    index: dict[str, int]
    width: int
    fmt: str                                  # the format's name (a MovieLens one declares a scale)
    names: list[str] = field(default_factory=list)   # the header's names (Parquet: the schema's)

    @property
    def has_timestamps(self) -> bool:
        return "timestamp" in self.index


def compression_of(path: str | Path) -> str | None:
    """'gzip', 'zstd', 'bz2' or 'parquet' by the file's magic bytes; None for plain text."""
    with Path(path).open("rb") as fh:
        head = fh.read(4)
    return next((name for magic, name in MAGIC if head.startswith(magic)), None)


def normalise(name: str) -> str:
    """A column name compared without case, spaces or punctuation.

    >>> normalise(" User_ID "), normalise('"movieId"')
    ('userid', 'movieid')
    """
    return re.sub(r"[^0-9a-z]", "", name.lower())


def parse_columns(text: str) -> dict[str, str | int]:
    """``--columns``: "user=A,item=B,rating=C[,timestamp=D]", each a header name or a 1-based
    position (a position is kept 0-based). ValueError: a one-line message.

    >>> parse_columns("user=uid,item=sku,rating=stars"), parse_columns("item=1,user=2,rating=3")
    ({'user': 'uid', 'item': 'sku', 'rating': 'stars'}, {'item': 0, 'user': 1, 'rating': 2})
    """
    out: dict[str, str | int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        role, eq, value = part.partition("=")
        role, value = role.strip().lower(), value.strip()
        if not eq or role not in ROLES or not value or role in out:
            raise ValueError(f"expected {COLUMNS_HELP}, got {text!r}")
        out[role] = int(value) - 1 if value.isdigit() else value
    missing = [r for r in REQUIRED if r not in out]
    kinds = {type(v) for v in out.values()}
    if missing or len(kinds) > 1 or any(isinstance(v, int) and v < 0 for v in out.values()):
        raise ValueError(f"expected {COLUMNS_HELP} (all names or all positions), got {text!r}")
    return out


def named_roles(names: list[str]) -> dict[str, int]:
    """The role of each header name that spells one (the first of each role)."""
    found: dict[str, int] = {}
    for pos, name in enumerate(names):
        key = normalise(name)
        for role, spellings in SYNONYMS.items():
            if key in spellings and role not in found:
                found[role] = pos
    return found


def separator_of(first_line: str, sep: str | None = None) -> str:
    """``sep`` if given, else the first of SEPARATORS the line holds."""
    if sep:
        return sep
    found = next((s for s in SEPARATORS if s in first_line), None)
    if found is None:
        raise LayoutError(f"unrecognised ratings format: no separator on the first line "
                          f"{first_line[:80]!r}; give it with --sep (e.g. --sep ';' or --sep ' ')")
    return found


def _is_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def sniff(first_line: str, sep: str | None = None, columns: dict | None = None) -> Layout:
    """The layout of a text file from its first line (and the options ``--sep``, ``--columns``)."""
    first_line = first_line.rstrip("\r\n").lstrip("\ufeff")
    sep = separator_of(first_line, sep)
    fields = [f.strip() for f in first_line.split(sep)]
    if columns:
        return _given(fields, sep, columns)
    roles = named_roles(fields)
    if all(r in roles for r in REQUIRED):
        movielens = tuple(normalise(f) for f in fields) == MOVIELENS_HEADER and sep == ","
        return Layout(sep, True, _ordered(roles), len(fields), "movielens-csv" if movielens else "csv",
                      fields)
    if all(_is_number(f) for f in fields) and 3 <= len(fields) <= 4:
        fmt = {"\t": "ml-100k", "::": "ml-1m"}.get(sep, "csv")
        return Layout(sep, False, {r: i for i, r in enumerate(ROLES[:len(fields)])}, len(fields), fmt)
    if all(_is_number(f) for f in fields):
        raise LayoutError(f"the first line has {len(fields)} fields, not user, item, rating[, "
                          f"timestamp]; say which is which: {COLUMNS_HELP}")
    raise LayoutError(f"the first line {first_line[:80]!r} is neither numbers nor a header naming "
                      f"the user, item and rating columns; if it is a header say which is which, if "
                      f"it is data give the positions: {COLUMNS_HELP}")


def _ordered(roles: dict[str, int]) -> dict[str, int]:
    return {r: roles[r] for r in ROLES if r in roles}


def _given(fields: list[str], sep: str, columns: dict) -> Layout:
    """The layout ``--columns`` gives: names (the first line is their header) or positions."""
    if all(isinstance(v, int) for v in columns.values()):
        width = max(len(fields), max(columns.values()) + 1)
        return Layout(sep, False, _ordered(columns), width, "csv")
    lookup = {normalise(f): i for i, f in reversed(list(enumerate(fields)))}
    missing = [f"{r}={n}" for r, n in columns.items() if normalise(n) not in lookup]
    if missing:
        raise LayoutError(f"--columns names {', '.join(missing)}, but the header is "
                          f"{sep.join(fields)[:80]!r}")
    return Layout(sep, True, _ordered({r: lookup[normalise(n)] for r, n in columns.items()}),
                  len(fields), "csv", fields)


def parquet_layout(names: list[str], columns: dict | None = None) -> Layout:
    """The roles of a Parquet file's columns, by its schema's names (or ``--columns``)."""
    if columns and all(isinstance(v, int) for v in columns.values()):
        if max(columns.values()) >= len(names):
            raise LayoutError(f"--columns: the file has {len(names)} columns ({', '.join(names)})")
        return Layout("", True, _ordered(columns), len(names), "parquet", names)
    if columns:
        layout = _given(names, ",", columns)
        layout.sep, layout.fmt = "", "parquet"
        return layout
    roles = named_roles(names)
    if not all(r in roles for r in REQUIRED):
        raise LayoutError(f"cannot tell the user, item and rating columns of {', '.join(names)[:80]}; "
                          f"say which is which: {COLUMNS_HELP}")
    return Layout("", True, _ordered(roles), len(names), "parquet", names)
