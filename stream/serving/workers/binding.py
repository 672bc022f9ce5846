"""Which models a ``SharedBlock`` can hold, and how their state arrays are named and rebound.

A model is shareable when its whole learned state is fixed-size arrays its kernels write in
place: ``SketchMF`` and ``BiasBaseline``, the combination ``Experts`` (``mix``, the default)
of such members, and a DP-SGD ``SketchMF`` wrapped with its private fallback (``DPSGDFallback``). A combination's arrays are its own (stats, counters, the members' discounted
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

The private fallback's served state is its *released* baseline (DP mean, DP item biases per
bucket) and the DP choice between it and the factor model: releases the fallback replaces
wholesale every window, so they cannot be rebound in place. They go into one array of the block
(``RELEASED``: [mu, chose factors, item biases...]) that the learner rewrites when a release
changes (``publish_release``, from the pool's publisher: at most ``PUBLISH_S`` late, as the
catalogue); a reader's ``ReleasedFallback`` answers from it with the fallback's own code. Per
cell, as the model's cells: a reader may catch a rewrite halfway (the bias of one bucket from
the release before); every value is a released one, so the guarantee is unchanged.

>>> from sketchrec.models.private.dp_sgd import DPConfig
>>> from sketchrec.models.private.fallback import DPSGDFallback
>>> dp = DPSGDFallback(SketchMF(dim=4, capacity=50, dp=DPConfig(1.0, batch_size=10)), width=16)
>>> arrays = model_arrays(dp)
>>> shareable_model(dp), arrays[RELEASED].shape
(True, (18,))
>>> twin = reader_model(SketchMF(**dp.params()), header_of(dp), arrays[RELEASED])
>>> from sketchrec.privacy.keys import id_keys_of, restore_id_key
>>> restore_id_key(twin, id_keys_of(dp).parts())   # the block's header carries the learner's key
>>> bool(twin.predict_one("ann", "film") == dp.predict_one("ann", "film")), twin.chose_factors
(True, True)
"""

from __future__ import annotations

import numpy as np

from sketchrec.models.bias_baseline import BiasBaseline
from sketchrec.models.mix import Experts
from sketchrec.models.private.joint_baseline import BiasRelease
from sketchrec.models.private.fallback import DPSGDFallback
from sketchrec.models.sketch_mf import SketchMF

SINGLE = (SketchMF, BiasBaseline)   # their _state_arrays are the arrays their kernels write
RELEASED = "fallback.released"      # the private fallback's releases (module docstring)
_MU, _CHOICE, _BIASES = 0, 1, 2     # where they lie in it


def shareable_model(model) -> bool:
    """Whether every array of ``model``'s state is written in place (exact types: a subclass may
    keep state beside them)."""
    if type(model) is Experts:
        return all(shareable_model(m) for m in model.members_)
    if type(model) is DPSGDFallback:
        return type(model.model) is SketchMF
    return type(model) in SINGLE


def model_arrays(model) -> dict[str, np.ndarray]:
    """The model's state arrays by name, as its ``state_arrays()`` walks them (a combination's
    members' prefixed ``m<j>.``); a private fallback's releases as ``RELEASED``."""
    if type(model) is DPSGDFallback:
        return model_arrays(model.model) | {RELEASED: released(model)}
    return {name: state.array for name, state in model.state_arrays().items()}


def bind_model(model, views: dict[str, np.ndarray], block) -> None:
    """Make ``model`` use these arrays (named as by ``model_arrays``) as its state, in place of its
    own. The model keeps ``block``, so the mapping lives as long as the model (closing it under
    live views would crash the process)."""
    if type(model) is DPSGDFallback:   # the learner's: its releases are copied (publish_release)
        views = dict(views)
        model._released_view, model._released_from = views.pop(RELEASED), _stamp(model)
        return bind_model(model.model, views, block)
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


def header_of(model) -> dict:
    """What a reader needs to build ``model`` over the block's arrays: its class and parameters
    (a private fallback's: the wrapped model's, and the fallback's public bucket count)."""
    if type(model) is DPSGDFallback:
        return {**header_of(model.model), "fallback": {"width": model.width}}
    return {"model_class": type(model).__name__, "params": model.params()}


def released(fallback: DPSGDFallback) -> np.ndarray:
    """The fallback's served releases as one array (layout: module docstring)."""
    out = np.empty(_BIASES + fallback.width, np.float64)
    _write_release(fallback, out)
    return out


def _write_release(fallback: DPSGDFallback, out: np.ndarray) -> None:
    out[_BIASES:] = fallback.release.item_bias   # the biases first, the scalars that pick them last
    out[_MU] = fallback.release.mu
    out[_CHOICE] = float(fallback.chose_factors)


def _stamp(fallback: DPSGDFallback) -> tuple:
    return id(fallback.release), bool(fallback.chose_factors)


def publish_release(model) -> bool:
    """Learner: copy a bound private fallback's releases into the block when they changed since
    the last copy (a new window's release or choice); whether it did. Other models: nothing."""
    view = getattr(model, "_released_view", None) if type(model) is DPSGDFallback else None
    if view is None or model._released_from == _stamp(model):
        return False
    model._released_from = _stamp(model)
    _write_release(model, view)
    return True


def reader_model(model, header: dict, released_view: np.ndarray | None = None):
    """A reader's model: ``model`` (bound to the block), wrapped as the learner's is."""
    if "fallback" not in header:
        return model
    return ReleasedFallback(model, header["fallback"]["width"], released_view)


class ReleasedFallback(DPSGDFallback):
    """A reader's private fallback: the learner's answers (the factor model or the released
    baseline, by the released choice) read from the block's ``RELEASED`` array; it never learns.

    Parameters
    ----------
    model : the DP-SGD ``SketchMF`` over the block's arrays.
    width : the fallback's public bucket count.
    view : the block's ``RELEASED`` array.

    Examples
    --------
    See the module docstring.
    """

    def __init__(self, model, width: int, view: np.ndarray):   # noqa: D107 - no release of its own
        self.__dict__["model"] = model
        self.width, self._view = int(width), view

    @property
    def release(self) -> BiasRelease:
        view = self._view
        return BiasRelease(float(view[_MU]), view[_BIASES:], np.empty(0), np.empty(0))

    @property
    def chose_factors(self) -> bool:
        return bool(self._view[_CHOICE])

    def learn_many(self, *args, **kw):
        raise TypeError("a serving reader's model only answers; its learner learns")
