"""Composed item biases of a factor model: a fleet member scales its own change of each item's
bias at a take, as ``compose`` does for the bias baseline's count-weighted moves.

An item's bias moves by a fraction a of its rating's error at every SGD step (a = lr (1 + bias_reg):
the step ``-lr (e + bias_reg b)``; an AdaGrad step divides lr by sqrt(acc0 + G), G the id's
squared-gradient sum). M members stepping an item k times each from the same stale copy move it
by f(k) = 1 - (1 - a)^k each, and the replicas add the M moves: past M f(k) = 2 the item
overshoots by more than its error, and the overshoot grows every round. It did: four members of
``--model sketch`` unpaced at a fixed interval on a skewed stream ran away from one learner, and
the hot-item pacing bound (``pace``) had to cut the interval to keep them in check. Scaled by
s = f(M k) / (M f(k)) (``compose.share``) the M moves sum to what one learner's M k steps would
make. The vectors are not scaled: their moves are small against a bias's, and scaling them did
not bring a fleet closer to one learner (measured on ``sketchrec bench fleet --accuracy``'s streams).

Where the change is: a held item (a heavy slot) in its slot row's bias column, beside the view
the last refresh left (row - view is the local learning not yet published); any other item in
its bias cells, against the published base. A bias cell that users wrote too is scaled by the
item steps' share of its steps (users are unscaled: with a topic keyed by user one member learns
all of a user's ratings, in sequence). The member keeps the scaled state, which is what it
publishes, so every replica that applied the same deltas holds the same state whatever s was.

>>> from sketchrec.models import SketchMF
>>> model = SketchMF(dim=4, width=256, heavy_slots=0)
>>> biases = ItemBiases(model)
>>> biases.fleet_size(4)
>>> base = model.biases.cells.copy()
>>> users, items = np.arange(200) % 50, np.zeros(200, dtype=np.int64)   # one item, rated 200 times
>>> _ = model.learn_many(users, items, np.full(200, 5.0))
>>> biases.touched(model.id_keys.as_keys(users), model.id_keys.as_keys(items))
>>> moved = float(model.factors([0], 1)[1][0])
>>> biases.scale(None, base)
>>> bool(0 < model.factors([0], 1)[1][0] < moved)   # the item's move, shrunk
True
"""

from __future__ import annotations

import numpy as np

from sketchrec.models.base import ITEM, USER
from sketchrec.sketches.count_sketch import cell_indices
from sketchrec.stream.fleet.compose import share

# the largest per-step fraction taken as a bias's rate (share() needs a < 1)
_MAX_RATE = 0.999


class ItemBiases:
    """Scales a ``SketchMF`` replica's own item-bias changes before a take (module docstring).

    Parameters
    ----------
    model : the ``SketchMF`` the replica walks.

    Examples
    --------
    See the module docstring.
    """

    def __init__(self, model):
        self.model = model
        self.members = 1.0
        self._keys: list[tuple[np.ndarray, np.ndarray]] = []

    def fleet_size(self, members: float) -> None:
        """Members learning concurrently (or 1 / this member's share of the ratings); at most 1:
        nothing is scaled."""
        self.members = max(1.0, float(members))

    def touched(self, ukeys: np.ndarray, ikeys: np.ndarray) -> None:
        """A learned batch's keys (every row stepped its user and its item once)."""
        if self.members > 1:
            self._keys.append((ukeys, ikeys))

    def scale(self, slots, base_bias: np.ndarray) -> None:
        """Set each item's bias to its published value + s x this member's change since
        (``slots``: the replica's ``FleetSlots`` or None; ``base_bias``: its published copy of
        the bias cells)."""
        keys, self._keys = self._keys, []
        if self.members <= 1 or not keys:
            return
        ukeys, ikeys = (np.concatenate(k) for k in zip(*keys))
        items, k_items = np.unique(ikeys, return_counts=True)
        held = _held(slots, items, ITEM)
        inside = held >= 0
        s = share(k_items.astype(np.float64), self._rates(items, held), self.members)
        if inside.any():
            self._scale_held(slots, held[inside], s[inside])
        if not inside.all():
            users, k_users = np.unique(ukeys, return_counts=True)
            light_users = _held(slots, users, USER) < 0
            self._scale_cells(items[~inside], k_items[~inside], s[~inside],
                              users[light_users], k_users[light_users], base_bias)

    def _scale_held(self, slots, rows: np.ndarray, s: np.ndarray) -> None:
        cells, view, col = self.model.heavy.cells, slots.view, self.model.dim
        local = cells[rows, col].astype(np.float64) - view[rows, col]
        cells[rows, col] = (view[rows, col] + s * local).astype(cells.dtype)

    def _scale_cells(self, items, k_items, s, users, k_users, base_bias) -> None:
        """Each bias cell the items wrote: base + (its items' k-weighted s, users' steps at 1) x
        its change."""
        m = self.model
        now, was = m.biases.cells.reshape(-1), base_bias.reshape(-1)
        width, depth = m.biases.cells.shape[1], m.store.bias_salts.shape[1]
        at = cell_indices(m.store.bias_salts[ITEM], items, width)
        weight = np.repeat(k_items.astype(np.float64), depth)
        cells, where = np.unique(at, return_inverse=True)
        steps = np.bincount(where, weights=weight, minlength=len(cells))
        scaled = np.bincount(where, weights=weight * np.repeat(s, depth), minlength=len(cells))
        if len(users):   # users' steps in the same cells: unscaled
            uat = cell_indices(m.store.bias_salts[USER], users, width)
            pos = np.minimum(np.searchsorted(cells, uat), len(cells) - 1)
            hit = cells[pos] == uat
            k_user = np.bincount(pos[hit], weights=np.repeat(k_users.astype(np.float64), depth)[hit],
                                 minlength=len(cells))
            steps, scaled = steps + k_user, scaled + k_user
        factor = scaled / steps
        now[cells] = (was[cells] + factor * (now[cells].astype(np.float64) - was[cells])).astype(now.dtype)

    def _rates(self, items: np.ndarray, held: np.ndarray) -> np.ndarray:
        """Each item's bias step as a fraction of its error: lr (1 + bias_reg) for SGD; AdaGrad's
        lr / sqrt(acc0 + G), G the item's bias sum (its slot's, or the least of its cells')."""
        m = self.model
        if m.optimizer == "sgd":
            return np.full(len(items), min(_MAX_RATE, m.lr * (1.0 + m.bias_reg)))
        sums = np.empty(len(items))
        inside = held >= 0
        column = m.dim if m.optimizer == "adagrad" else 1
        sums[inside] = m.acc.heavy[held[inside], column]
        if not inside.all():
            depth = m.store.bias_salts.shape[1]
            at = cell_indices(m.store.bias_salts[ITEM], items[~inside], m.biases.cells.shape[1])
            sums[~inside] = m.acc.bias_cells.reshape(-1)[at].reshape(-1, depth).min(axis=1)
        return np.minimum(_MAX_RATE, m.lr / np.sqrt(m.acc0 + sums))


def _held(slots, keys: np.ndarray, family: int) -> np.ndarray:
    """Slot of each id, -1 where not held (no slots: none held)."""
    if slots is None:
        return np.full(len(keys), -1, np.int64)
    return slots.locate(keys, np.full(len(keys), family, np.uint8))
