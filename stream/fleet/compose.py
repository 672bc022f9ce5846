"""Composed merges: a fleet member scales its own count-weighted changes at a take, so that the M
members' concurrent moves add up to about what one learner would have made of the same ratings.

A damped running mean (``models.base.CountWeighted``: the bias baseline's biases) moves an id by a
fraction a = 1 / (min(n, horizon) + 1 + damping) of its error at each rating, n its count. One
learner that steps an item M k times moves it by f(M k) of its error, f(x) = 1 - (1 - a)^x; M members
that step it k times each from the same stale copy move it by f(k) each, and replicas add the
members' changes: M f(k), which passes 2 (an overshoot larger than the error, growing every round)
once k is large enough. So the sender multiplies its change of such an entry by
s = f(M k) / (M f(k)) (in [1 / M, 1]): the M changes then sum to f(M k), as if the ratings had been
learned in sequence. The scaled state is what the member keeps and publishes (its arrays become
base + s x change before the take compares them), so a replica's state is still its base plus the
deltas published, and every replica that applied the same deltas holds the same state: nothing
changes at the receivers, and exactness does not depend on s.

What s assumes: the other M - 1 members stepped the item about as often (k each) in the same
interval, true of items when the topic is keyed by user (a member gets whole users, and with them
a 1 / M share of every item's ratings). With shares that differ, M is 1 / this member's share (a
member with a third of the partitions: 3): its scaled change is then its share of one learner's
move over all the members' steps, whatever the others' shares. Users are left unscaled: keyed by user, one member learns
all of a user's ratings, in sequence. An entry (a hashed cell) that users and items share is
scaled by the item steps' share of its steps. k and n are per cell: k counts this member's item
steps that wrote the cell since its last take (``touched``), n is the base's count there (the
count-min cell, an upper bound of the id's count).

>>> import numpy as np
>>> from sketchrec import BiasBaseline
>>> a = BiasBaseline(capacity=100)
>>> composer = Composer(a.state_arrays())
>>> composer.fleet_size(4)
>>> base = {name: state.array.copy() for name, state in a.state_arrays().items()}
>>> users, items = [f"u{n // 2}" for n in range(80)], ["up", "down"] * 40
>>> _ = a.learn_many(users, items, [5.0, 1.0] * 40)
>>> composer.touched(a.id_keys.as_keys(users), a.id_keys.as_keys(items))
>>> moved = a.factors(["up"], 1)[1][0]
>>> composer.scale({name: state.array for name, state in a.state_arrays().items()}, base)
>>> bool(0 < a.factors(["up"], 1)[1][0] < moved)   # the item's move, shrunk
True
"""

from __future__ import annotations

import numpy as np

from sketchrec.models.base import ITEM, USER, StateArray


def share(k: np.ndarray, a: np.ndarray, members: float) -> np.ndarray:
    """s = f(M k) / (M f(k)), f(x) = 1 - (1 - a)^x: the factor that makes M concurrent moves of k
    steps each add up to one learner's M k steps (1 where k = 0).

    >>> share(np.array([0.0, 1.0, 10.0, 1000.0]), np.full(4, 1 / 31), 4).round(3).tolist()
    [1.0, 0.953, 0.653, 0.25]
    """
    step = np.log1p(-a)
    with np.errstate(divide="ignore", invalid="ignore"):
        s = np.expm1(members * k * step) / (members * np.expm1(k * step))
    return np.where(k > 0, s, 1.0)


class Composer:
    """Scales a replica's changes of its count-weighted arrays before a take (module docstring).

    Parameters
    ----------
    arrays : name -> ``StateArray`` (``model.state_arrays()``); those with ``weighted`` metadata
        are composed, the others left alone.

    Examples
    --------
    See the module docstring.
    """

    def __init__(self, arrays: dict[str, StateArray]):
        self.weighted = {name: state.weighted for name, state in arrays.items()
                         if state.weighted is not None}
        self.members = 1.0
        self._keys: list[tuple[np.ndarray, np.ndarray]] = []

    def __bool__(self) -> bool:
        return bool(self.weighted)

    def fleet_size(self, members: float) -> None:
        """The number of members learning concurrently, or 1 / this member's share of the ratings
        (a member holding 2 of 6 partitions: 3); at most 1: nothing is scaled."""
        self.members = max(1.0, float(members))

    def touched(self, ukeys: np.ndarray, ikeys: np.ndarray) -> None:
        """A learned batch's keys (every row: each stepped its user and item once)."""
        if self.members > 1:
            self._keys.append((ukeys, ikeys))

    def scale(self, arrays: dict[str, np.ndarray], base: dict[str, np.ndarray]) -> None:
        """Set each weighted array to base + s x (now - base), per cell (module docstring)."""
        keys, self._keys = self._keys, []
        if self.members <= 1 or not keys:
            return
        ukeys, ikeys = (np.concatenate(k) for k in zip(*keys))
        for name, weighted in self.weighted.items():
            now, was = arrays[name].reshape(-1), base[name].reshape(-1)
            # per cell the items wrote (O(ratings), not O(cells): a take per interval)
            cells, k_item = np.unique(weighted.cells(ikeys, ITEM), return_counts=True)
            if not len(cells):
                continue
            users = weighted.cells(ukeys, USER)
            at = np.minimum(np.searchsorted(cells, users), len(cells) - 1)
            k_user = np.bincount(at[cells[at] == users], minlength=len(cells))
            n = np.minimum(base[weighted.counts].reshape(-1)[cells], weighted.horizon)
            s = share(k_item.astype(float), 1.0 / (n + 1.0 + weighted.damping[ITEM]), self.members)
            s = (k_item * s + k_user) / (k_item + k_user)   # a user's steps there: unscaled
            now[cells] = (was[cells] + s * (now[cells] - was[cells])).astype(now.dtype)
