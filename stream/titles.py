"""Item titles for what the service shows (``--items FILE``): MovieLens' ``u.item`` (``|``
separated, Latin-1) or ``movies.csv`` (``movieId,title,genres``, UTF-8, quoted titles).

Titles are display data only: they never reach the model. Memory holds the titles of the items in
the file and nothing else (no entry is made for an item the file does not name), keyed by the id's
text, since ids are opaque text everywhere ('5' and 5 are the same item).

>>> import tempfile, pathlib
>>> path = pathlib.Path(tempfile.mkdtemp()) / "movies.csv"
>>> _ = path.write_text('movieId,title,genres\\n1,Toy Story (1995),Animation\\n2,"Heat, The (1995)",Crime\\n')
>>> titles = Titles.load(path)
>>> titles.get(1), titles.get("2"), titles.get(3), len(titles)
('Toy Story (1995)', 'Heat, The (1995)', None, 2)
"""

from __future__ import annotations

import csv
from pathlib import Path

MAX_TITLE = 300   # characters of a title kept (a line is display text, not a document)


class BadItemsFile(ValueError):
    """The file is not a u.item or movies.csv file; the message is one line."""


class Titles:
    """Titles by item id (text), read from a MovieLens item file (see the module docstring).

    Parameters
    ----------
    titles: item id (text) -> title.
    path: the file they were read from, if any (``load`` sets it).

    Examples
    --------
    >>> Titles({"1": "Toy Story (1995)"}).get(1)
    'Toy Story (1995)'
    """

    def __init__(self, titles: dict[str, str], path: Path | None = None):
        self._titles = titles
        self.path = path   # the file they were read from (reader processes read it too)

    def __len__(self) -> int:
        return len(self._titles)

    def get(self, item) -> str | None:
        """The title of ``item`` (any id type), None when the file does not name it."""
        return self._titles.get(str(item))

    @classmethod
    def load(cls, path: str | Path) -> "Titles":
        """The titles of a ``u.item`` or ``movies.csv`` file (by its first line); BadItemsFile
        when it is neither or holds no title."""
        path = Path(path)
        try:
            with open(path, "rb") as f:
                head = f.readline()
            titles = (_movies_csv(path) if head.lower().startswith(b"movieid,")
                      else _u_item(path) if b"|" in head else None)
        except OSError as exc:
            raise BadItemsFile(f"cannot read {path}: {exc.strerror or exc}") from None
        if not titles:
            raise BadItemsFile(f"{path} is neither a MovieLens u.item (id|title|...) nor a movies.csv "
                               "(movieId,title,genres) file with titles")
        return cls(titles, path.resolve())


def _u_item(path: Path) -> dict[str, str]:
    out = {}
    with open(path, encoding="latin-1", newline="") as f:
        for line in f:
            fields = line.rstrip("\r\n").split("|")
            if len(fields) >= 2 and fields[0].strip() and fields[1].strip():
                out[fields[0].strip()] = fields[1].strip()[:MAX_TITLE]
    return out


def _movies_csv(path: Path) -> dict[str, str]:
    out = {}
    with open(path, encoding="utf-8", errors="replace", newline="") as f:
        rows = csv.reader(f)
        next(rows, None)   # the header
        for row in rows:
            if len(row) >= 2 and row[0].strip() and row[1].strip():
                out[row[0].strip()] = row[1].strip()[:MAX_TITLE]
    return out
