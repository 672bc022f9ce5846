"""Which models a ``SharedBlock`` can hold, and how their state arrays are named and rebound.

A model is shareable when its whole learned state is fixed-size arrays its kernels write in
place: ``SketchMF`` and ``BiasBaseline``, and the combination ``Experts`` (``mix``, the default)
of such members. A combination's arrays are its own (stats, counters, the members' discounted
losses, from which ``weights`` are computed at every read) and each member's, prefixed ``m<j>.``:
a reader's ``Experts`` over the views combines the members' live predictions by the live losses.
Per cell, as for one model: a reader may combine a member's cells written before and after one
step with losses of the step before or after (finite values only, as the learner's).

>>> from sketchrec.models.mix import Experts
>>> model = Experts(capacity=40)
>>> shareable_model(model), sorted(model_arrays(model))[:5]
(True, ['counters', 'losses', 'm0.biases', 'm0.counters', 'm0.counts'])
>>> twin = Experts(capacity=40)
>>> bind_model(twin, model_arrays(model), block=None)
>>> _ = model.learn_many(["ann", "bob"] * 5, ["film", "book"] * 5, [5.0, 2.0] * 5)
>>> twin.n_learned, bool(twin.predict_one("ann", "film") == model.predict_one("ann", "film"))
(10, True)
"""

from __future__ import annotations

import numpy as np

from sketchrec.models.bias_baseline import BiasBaseline
from sketchrec.models.mix import Experts
from sketchrec.models.sketch_mf import SketchMF

SINGLE = (SketchMF, BiasBaseline)   # their _state_arrays are the arrays their kernels write


def shareable_model(model) -> bool:
    """Whether every array of ``model``'s state is written in place (exact types: a subclass may
    keep state beside them)."""
    if type(model) is Experts:
        return all(shareable_model(m) for m in model.members_)
    return type(model) in SINGLE


def model_arrays(model) -> dict[str, np.ndarray]:
    """The model's state arrays by name (a combination's members' prefixed ``m<j>.``)."""
    arrays = {"stats": model.stats, "counters": model.counters}
    if type(model) is Experts:
        arrays["losses"] = model.losses
        for j, member in enumerate(model.members_):
            arrays |= {f"m{j}.{name}": a for name, a in model_arrays(member).items()}
        return arrays
    return arrays | model._state_arrays()


def bind_model(model, views: dict[str, np.ndarray], block) -> None:
    """Make ``model`` use these arrays (named as by ``model_arrays``) as its state, in place of its
    own. The model keeps ``block``, so the mapping lives as long as the model (closing it under
    live views would crash the process)."""
    model._shared_block = block
    views = dict(views)
    model.stats, model.counters = views.pop("stats"), views.pop("counters")
    if type(model) is Experts:
        model.losses = views.pop("losses")
        for j, member in enumerate(model.members_):
            prefix = f"m{j}."
            bind_model(member, {n[len(prefix):]: v for n, v in views.items() if n.startswith(prefix)},
                       block)
        return
    model._load_state_arrays(views)
