"""Deltas of any model's additive state, walked from ``state_arrays()`` (``models.base``): what
a replica learned since its last report, as changes every other replica adds to its own.

``ArrayReplica`` keeps a copy of the arrays it last published (its *base*); ``take`` returns the
entries that moved (``now - base``, ``delta_codec.publish``) and moves the base to now; ``apply``
adds another replica's take to the arrays and to the base alike, so it is not published again.
At a take a replica's arrays are therefore exactly its base, the sum of everything it took and
applied: replicas that applied the same deltas hold the same state (up to the order of float
additions), whatever the arrays mean, so this holds for discounted sums too (a ``Mix``'s loss
sums). Rules: ``ADD`` arrays by their changed entries; ``RANGE`` (rating statistics) as count and
sum changes plus the range. Other rules (a heavy filter's slots, rows per id, one learner's own
history) are refused in one line: ``stream.fleet.deltas.ModelReplica`` walks the slots.
"""

from __future__ import annotations

import numpy as np

from sketchrec.models.base import ADD, MERGES, RANGE, StateArray
from sketchrec.stream.fleet.compose import Composer
from sketchrec.stream.fleet.delta_codec import add_entries, entries_of, publish

_COUNT, _TOTAL, _MIN, _MAX = range(4)   # a RANGE array: count, sum, min, max of the ratings


class ArrayReplica:
    """The published state of additive arrays and the delta arithmetic on them (module doc).

    Parameters
    ----------
    arrays : name -> ``StateArray`` (e.g. ``model.state_arrays()``), every rule ADD or RANGE.
    what : names the model in the refusal of another rule.

    Examples
    --------
    >>> from sketchrec import BiasBaseline
    >>> a, b = BiasBaseline(capacity=100), BiasBaseline(capacity=100)
    >>> ra, rb = ArrayReplica(a.state_arrays()), ArrayReplica(b.state_arrays())
    >>> _ = a.learn_many(["ann", "bob"], ["up", "up"], [4.0, 3.0])
    >>> rb.apply(ra.take())
    >>> b.n_learned, b.predict_one("ann", "up") == a.predict_one("ann", "up"), ra.take()
    (2, True, {})
    """

    def __init__(self, arrays: dict[str, StateArray], what: str = "this model"):
        other = {name: state.merge for name, state in arrays.items() if state.merge not in (ADD, RANGE)}
        if other:
            name, rule = next(iter(other.items()))
            raise TypeError(f"replicas add state changes; {what}'s {name} is {MERGES.get(rule, rule)}")
        for name, state in arrays.items():
            if state.merge == RANGE and state.array.shape != (4,):
                raise TypeError(f"{what}'s {name} is not rating statistics [count, sum, min, max]")
        self.arrays = {name: state.array for name, state in arrays.items()}
        self.rules = {name: state.merge for name, state in arrays.items()}
        self.base = {name: array.copy() for name, array in self.arrays.items()}
        self.composer = Composer(arrays)   # count-weighted arrays: composed at a take (compose)

    def touched(self, ukeys: np.ndarray, ikeys: np.ndarray) -> None:
        """A learned batch's keys, for the composer of count-weighted arrays (a take compares
        every entry anyway: the arrays are small beside a factor model's cells)."""
        if self.composer:
            self.composer.touched(ukeys, ikeys)

    def ahead(self, ukeys: np.ndarray, ikeys: np.ndarray) -> None:
        """Nothing to count before a batch (no heavy slots)."""

    def fleet_size(self, members: int) -> None:
        """Members learning concurrently, whose count-weighted moves a take composes (compose)."""
        self.composer.fleet_size(members)

    def refresh_every(self, ratings: int) -> None:
        """Nothing held apart to refresh (no heavy slots)."""

    def ready(self, full: bool = False) -> None:
        """Nothing held apart to refresh (no heavy slots)."""

    def take(self) -> dict[str, np.ndarray]:
        """The changes since the base ({} if none); the base moves to now. Count-weighted
        arrays' changes are composed first (``compose``: the arrays keep what is published)."""
        if self.composer:
            self.composer.scale(self.arrays, self.base)
        out: dict[str, np.ndarray] = {}
        for name, now in self.arrays.items():
            base = self.base[name]
            if self.rules[name] == ADD:
                out.update(publish(now, base, name))
            elif now[_COUNT] != base[_COUNT] or now[_TOTAL] != base[_TOTAL]:
                out[name] = np.array([now[_COUNT] - base[_COUNT], now[_TOTAL] - base[_TOTAL],
                                      now[_MIN], now[_MAX]])
                base[...] = now
        return out

    def check(self, delta: dict[str, np.ndarray]) -> dict:
        """Each array's entries in ``delta`` (``entries_of``), checked against this replica's
        arrays: ValueError (one line) if one does not fit, before anything changes."""
        found = {}
        for name, now in self.arrays.items():
            if self.rules[name] == ADD:
                found[name] = entries_of(delta, name, now)
            elif name in delta:
                if delta[name].shape != (4,) or delta[name].dtype.kind != "f":
                    raise ValueError(f"delta's {name} does not fit this model")
                found[name] = delta[name]
        return found

    def apply(self, delta: dict[str, np.ndarray], found: dict | None = None) -> None:
        """Add another replica's ``take`` to the arrays and to the base (``found``: what
        ``check`` returned for it, if it was checked already)."""
        found = self.check(delta) if found is None else found
        for name, entries in found.items():
            for target in (self.arrays[name], self.base[name]):
                if self.rules[name] == ADD:
                    add_entries(target, entries)
                else:
                    merge_stats(target, entries)


def merge_stats(stats: np.ndarray, delta: np.ndarray) -> None:
    """Add a delta's rating count and sum; the range becomes the union of both ranges."""
    count, total, low, high = delta
    if stats[_COUNT] > 0:
        low, high = min(low, stats[_MIN]), max(high, stats[_MAX])
    stats[_COUNT] += count
    stats[_TOTAL] += total
    stats[_MIN], stats[_MAX] = low, high
