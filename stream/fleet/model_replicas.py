"""Which replica walks which model kind's state (``replica_for``), and the replica of a
combination of learners (``MixReplica``): a fleet runs any kind whose ``state_arrays()`` merge.

- ``SketchMF``: ``deltas.ModelReplica`` (cells and heavy slots tracked by id; its other arrays
  through an ``ArrayReplica``);
- ``Mix`` (``models.mix.Experts``): one replica per member, its deltas named ``m{j}.`` (the
  members are linear sketch structures whose changes add), the combination's statistics and
  counters (``array_replica``), and its members' discounted loss sums as ``LossSums``;
- any other kind whose arrays are all additive or rating statistics (``BiasBaseline``): an
  ``ArrayReplica`` over them; a kind with rows per id (``DenseMF``) is refused in one line.
"""

from __future__ import annotations

import math

import numpy as np

from sketchrec.models._sgd import LEARNED

from sketchrec.stream.fleet.array_replica import ArrayReplica
from sketchrec.stream.fleet.deltas import ModelReplica


def replica_for(model, admit_after: int = 8, precision: str = "float32", tracked: bool = False,
                deferred: bool = False):
    """The replica that publishes and applies ``model``'s deltas (module docstring); the options
    are ``ModelReplica``'s (a combination hands them to its factor members). TypeError (one
    line) for a kind whose state does not merge.

    >>> from sketchrec import Mix
    >>> a, b = Mix(capacity=100), Mix(capacity=100)
    >>> ra, rb = replica_for(a), replica_for(b)
    >>> _ = a.learn_many(["ann", "bob"], ["up", "up"], [4.0, 3.0])
    >>> rb.apply(ra.take())
    >>> b.n_learned, b.predict_one("ann", "up") == a.predict_one("ann", "up"), ra.take()
    (2, True, {})
    """
    if hasattr(model, "members_"):
        return MixReplica(model, admit_after, precision, tracked, deferred)
    if hasattr(model, "heavy") and hasattr(model, "vectors"):
        return ModelReplica(model, admit_after, precision, tracked, deferred)
    return ArrayReplica(model.state_arrays(), type(model).__name__)


class MixReplica:
    """A combination's replica: its members' replicas side by side (deltas named ``m{j}.``) and
    its own loss sums, statistics and counters. The learned keys go to the members that track
    them (the members learn the keys the combination gave them).

    Parameters
    ----------
    model : a ``models.mix.Experts`` (``sketchrec.Mix``).
    admit_after, precision, tracked, deferred : handed to the members' replicas (``replica_for``).
    """

    def __init__(self, model, admit_after: int = 8, precision: str = "float32",
                 tracked: bool = False, deferred: bool = False):
        self.model = model
        self.members = [(f"m{j}.", replica_for(member, admit_after, precision, tracked, deferred))
                        for j, member in enumerate(model.members_)]
        own = {name: state for name, state in model.state_arrays().items()
               if "." not in name and name != "losses"}
        self.own = ArrayReplica(own, type(model).__name__)
        self.losses = LossSums(model)

    def _each(self, method: str, *args) -> None:
        for _, replica in self.members:
            if hasattr(replica, method):
                getattr(replica, method)(*args)

    def touched(self, ukeys: np.ndarray, ikeys: np.ndarray) -> None:
        self._each("touched", ukeys, ikeys)

    def ahead(self, ukeys: np.ndarray, ikeys: np.ndarray) -> None:
        self._each("ahead", ukeys, ikeys)

    def refresh_every(self, ratings: int) -> None:
        self._each("refresh_every", ratings)

    def fleet_size(self, members: int) -> None:
        self._each("fleet_size", members)

    def ready(self, full: bool = False) -> None:
        self._each("ready", full)

    def take(self) -> dict[str, np.ndarray]:
        """Every member's take under its prefix, and the combination's own ({} if nothing)."""
        out = self.own.take()
        out.update(self.losses.take())
        for prefix, replica in self.members:
            out.update({prefix + name: array for name, array in replica.take().items()})
        return out

    def apply(self, arrays: dict[str, np.ndarray]) -> None:
        """Add another replica's ``take``: ValueError (one line) if any part does not fit, and
        then nothing has changed (the array parts are checked first; a ``ModelReplica`` checks
        its own before it changes anything, and at most one member is one)."""
        parts = {prefix: {name[len(prefix):]: array for name, array in arrays.items()
                          if name.startswith(prefix)} for prefix, _ in self.members}
        own = {name: array for name, array in arrays.items()
               if not any(name.startswith(prefix) for prefix in parts)}
        losses = self.losses.check(own)
        checked = [(self.own, own, self.own.check(own))]
        checked += [(replica, parts[prefix], replica.check(parts[prefix]))
                    for prefix, replica in self.members if isinstance(replica, ArrayReplica)]
        for prefix, replica in self.members:
            if not isinstance(replica, ArrayReplica) and parts[prefix]:
                replica.apply(parts[prefix])
        self.losses.absorb()   # this replica's own learning since, before the count moves
        for replica, part, found in checked:
            replica.apply(part, found)
        self.losses.add(*losses)


class LossSums:
    """A combination's discounted loss sums in a fleet, merged exactly. Its kernel keeps
    L_j = sum over learned ratings of forget^(age) e_j^2, age counted in the ratings this replica
    learned since; adding deltas of L itself would subtract every member's decay of the shared
    sum (M members: a factor 1 - M(1 - forget^n) per round of n ratings each, negative, and
    growing for M > 2). Here each rating's term is kept once, against the fleet's count C (the
    combination's learned counter, itself additive): S = sum forget^-(c - R) e^2 over the
    ratings (c: the count when learned), which adds across replicas; L = forget^(C - R) S. R, a
    multiple of ``span`` at most C, keeps the powers in range (a delta says its R; the receiver
    rescales). Replicas with the same count and sums hold the same L, whatever the order."""

    def __init__(self, model):
        self.model, self.forget = model, float(model.forget)
        # forget^span = e^-200: R steps by span, so the powers stay far inside float64's range
        self.span = (1 << 62) if self.forget >= 1.0 else max(1, int(200 / -math.log(self.forget)))
        count = int(model.counters[LEARNED])
        self.ref = count // self.span * self.span
        self.sums = model.losses / self._power(count - self.ref)
        self.pending = np.zeros_like(self.sums)   # absorbed, not yet published
        self.count, self.at_sync = count, model.losses.copy()

    def _power(self, n: int) -> float:
        return self.forget ** n

    def absorb(self) -> None:
        """Move this replica's learning since the last sync into the sums (and ``pending``)."""
        count = int(self.model.counters[LEARNED])
        if count == self.count and np.array_equal(self.model.losses, self.at_sync):
            return
        local = self.model.losses - self._power(count - self.count) * self.at_sync
        change = local / self._power(count - self.ref)
        self.sums += change
        self.pending += change
        self._sync(count)

    def _sync(self, count: int) -> None:
        """L from the sums at ``count`` (the reference moved up when the count passed it)."""
        ref = count // self.span * self.span
        if ref != self.ref:
            scale = self._power(ref - self.ref)
            self.sums *= scale
            self.pending *= scale
            self.ref = ref
        self.model.losses[:] = self._power(count - self.ref) * self.sums
        self.count, self.at_sync = count, self.model.losses.copy()

    def take(self) -> dict[str, np.ndarray]:
        self.absorb()
        if not self.pending.any():
            return {}
        out = {"loss_sums": self.pending.copy(), "loss_ref": np.array([self.ref], np.int64)}
        self.pending[:] = 0.0
        return out

    def check(self, delta: dict[str, np.ndarray]) -> tuple:
        """(sums, reference) of a delta, checked (None, 0: it has none)."""
        if "loss_sums" not in delta:
            return None, 0
        sums, ref = delta["loss_sums"], delta.get("loss_ref")
        if (sums.shape != self.sums.shape or sums.dtype != np.float64 or ref is None
                or ref.shape != (1,) or ref.dtype != np.int64):
            raise ValueError("delta's loss sums do not fit this model")
        return sums, int(ref[0])

    def add(self, sums, ref: int) -> None:
        """Add a delta's sums (rescaled to this replica's reference) after its counters moved."""
        if sums is not None:
            self.sums += sums * self._power(self.ref - ref)
        self._sync(int(self.model.counters[LEARNED]))
