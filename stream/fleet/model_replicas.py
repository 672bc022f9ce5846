"""Which replica walks which model kind's state (``replica_for``), and the replica of a
combination of learners (``MixReplica``): a fleet runs any kind whose ``state_arrays()`` merge.

- ``SketchMF``: ``deltas.ModelReplica`` (cells and heavy slots tracked by id; its other arrays
  through an ``ArrayReplica``);
- ``Mix`` (``models.mix.Experts``): one replica per member, its deltas named ``m{j}.`` (the
  members are linear sketch structures whose changes add), and the combination's own loss sums,
  statistics and counters (additive too: ``array_replica``);
- any other kind whose arrays are all additive or rating statistics (``BiasBaseline``): an
  ``ArrayReplica`` over them; a kind with rows per id (``DenseMF``) is refused in one line.
"""

from __future__ import annotations

import numpy as np

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
        own = {name: state for name, state in model.state_arrays().items() if "." not in name}
        self.own = ArrayReplica(own, type(model).__name__)

    def _each(self, method: str, *args) -> None:
        for _, replica in self.members:
            if hasattr(replica, method):
                getattr(replica, method)(*args)

    def touched(self, ukeys: np.ndarray, ikeys: np.ndarray) -> None:
        self._each("touched", ukeys, ikeys)

    def observe(self, ukeys: np.ndarray, ikeys: np.ndarray) -> None:
        self._each("observe", ukeys, ikeys)

    def ready(self, full: bool = False) -> None:
        self._each("ready", full)

    def take(self) -> dict[str, np.ndarray]:
        """Every member's take under its prefix, and the combination's own ({} if nothing)."""
        out = self.own.take()
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
        checked = [(self.own, own, self.own.check(own))]
        checked += [(replica, parts[prefix], replica.check(parts[prefix]))
                    for prefix, replica in self.members if isinstance(replica, ArrayReplica)]
        for prefix, replica in self.members:
            if not isinstance(replica, ArrayReplica) and parts[prefix]:
                replica.apply(parts[prefix])
        for replica, part, found in checked:
            replica.apply(part, found)
