"""What reaches the learner of a prequential replay, batch by batch: the audit canaries
inserted, the ids hashed once per distinct id where that is the learner's own hashing, and the
process's resident memory sampled as the stream goes."""

from __future__ import annotations

import os
from typing import Callable, Iterable, Iterator

import numpy as np

from sketchrec.data import Ratings

RSS_EVERY = 1_000_000  # ratings between two samples of the process's resident memory
MAX_TABLE = 1 << 22    # ids a table of keys may span (32 MB)


def hashed_once(batches: Iterable[Ratings], data: Ratings | None) -> Iterator[Ratings]:
    """The batches with their ids replaced by their public 64-bit keys
    (``sketches.hashing.keys_of``), each distinct id hashed once instead of once per rating:
    integer ids through a table over the ids' span, text ids held as codes (``Ratings.coded``)
    through their vocabulary's keys. The batches unchanged when a column is neither, or spans
    more than MAX_TABLE ids or more ids than it has rows, or its vocabulary holds an audit
    canary's id (``privacy.audit.real_rows`` must still see those). For a learner that hashes
    ids with the public hash and takes keys as they are (``models.wrapped.Wrapped``): the same
    keys.

    >>> from sketchrec.sketches.hashing import keys_of
    >>> data = Ratings(np.array([7, 5, 7]), np.array([1, 2, 3]), np.ones(3), np.zeros(3, np.int64))
    >>> batch = next(hashed_once(data.batches(3), data))
    >>> bool((batch.users == keys_of(data.users)).all() and (batch.items == keys_of(data.items)).all())
    True
    """
    tables = [None, None] if data is None else [_table(data, "users"), _table(data, "items")]
    if None in tables:
        yield from batches
        return
    users, items = tables
    for batch in batches:
        yield Ratings(users(batch), items(batch), batch.ratings, batch.timestamps)


def _table(data: Ratings, name: str) -> Callable[[Ratings], np.ndarray] | None:
    """The map from a batch to its column's keys (see hashed_once), or None."""
    from sketchrec.sketches.hashing import keys_of
    coded = data.coded(name)
    if coded is not None:
        from sketchrec.privacy.audit import is_canary
        names = coded.vocab.names()
        if is_canary(names).any():
            return None
        keys = keys_of(names)

        def lookup(batch: Ratings) -> np.ndarray:
            mine = batch.coded(name)
            return keys[mine.codes] if mine is not None and mine.vocab is coded.vocab else keys_of(getattr(batch, name))
        return lookup
    ids = data.column(name)
    if ids.dtype.kind != "i" or len(ids) == 0:
        return None
    low, high = int(ids.min()), int(ids.max())
    if high - low >= min(MAX_TABLE, len(ids)):
        return None
    keys = keys_of(np.arange(low, high + 1, dtype=np.int64))
    return lambda batch: keys[batch.column(name) - low]


def with_canaries(batches: Iterable[Ratings], canaries, total: int, seed: int) -> Iterator[Ratings]:
    """The stream with the included audit canaries inserted at random positions."""
    users, items, ratings = canaries.training_part()
    at = np.sort(np.random.default_rng(seed + 11).integers(0, max(total, 1), len(ratings)))
    seen, c = 0, 0
    for batch in batches:
        end = seen + len(batch)
        take = np.flatnonzero((at >= seen) & (at < end)) if c < len(at) else np.empty(0, dtype=np.int64)
        if len(take):
            pos = at[take] - seen  # insert each canary at its position; the stream keeps its order
            stamp = batch.timestamps[np.minimum(pos, len(batch) - 1)] if len(batch) else np.zeros(len(take))
            batch = Ratings(np.insert(batch.users.astype(object), pos, users[take]),
                            np.insert(batch.items.astype(object), pos, items[take]),
                            np.insert(batch.ratings, pos, ratings[take]),
                            np.insert(batch.timestamps, pos, stamp))
            c += len(take)
        seen = end
        yield batch


def sample_rss(batches: Iterable[Ratings], total: int, into: list) -> Iterator[Ratings]:
    """The batches unchanged; appends (ratings seen, resident MB) to ``into`` every RSS_EVERY
    ratings and at the end."""
    seen = 0
    for batch in batches:
        yield batch
        before, seen = seen, seen + len(batch)
        if seen // RSS_EVERY > before // RSS_EVERY or seen == total:
            into.append((seen, round(rss_mb(), 1)))


def rss_mb() -> float:
    """The process's resident memory in MB (NaN where /proc is missing)."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        return float("nan")
