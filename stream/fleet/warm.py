"""A learning member's kernels loaded at start-up, before its first batch.

numba loads a compiled kernel from its on-disk cache (or compiles it) at the kernel's first call.
A member calls its learning kernel, and the kernels of a take and an apply (slots admitted, rows
harvested and routed, cells found and added, Bloom filters and the count-min), first inside its
learning loop: the loads then land on its first batches, the learning span whose CPU the fleet
benchmark counts (docs/scaling.md), where a plain learner whose process already ran its kernel
pays none. ``warm`` makes those first calls at start-up instead, on throwaway replicas: a few fake
ratings learned and taken by one restored from the snapshot the member starts from, and learned,
taken and applied by two small fresh models of the same class and parameters but the size (the
same dtypes and array ranks: the same kernel signatures; an apply needs a delta of its own
model's shape, and a second restored copy would cost the model's size again at start-up).

>>> from sketchrec.models import SketchMF
>>> from sketchrec.stream.recommender import Recommender
>>> rec = Recommender(SketchMF(dim=4, capacity=200), pair_capacity=1000)
>>> warm(rec.state_parts(), SketchMF)
True
>>> rec.model.n_learned   # the member's own replica is not touched
0
"""

from __future__ import annotations

import logging

import numpy as np

from sketchrec.privacy.mode import mode_of
from sketchrec.stream.checkpoint import restore_operator_parts
from sketchrec.stream.fleet.tracker import DeltaTracker
from sketchrec.stream.health import log_event
from sketchrec.stream.recommender import Recommender

# a model larger than this is not copied twice to warm its kernels (they load on first use)
MAX_BYTES = 256 << 20
# the apply side's fresh models: the parameters that size a model, small (None: chosen from capacity)
SMALL = {"capacity": 200, "width": None, "heavy_slots": None}


def warm(parts: dict, model_cls) -> bool:
    """Call a member's kernels once on a replica restored from ``parts`` (a snapshot's: learning
    and a take) and on two small fresh ones (an apply), then drop them; whether it did. Left out:
    a model in any privacy mode (DP steps draw noise, ids may be keyed: nothing is learned
    outside the member's own accounting) and one over ``MAX_BYTES``.
    A failure is logged in one line and changes nothing: the kernels then load where first used."""
    try:
        restored = Recommender.from_parts(parts, model_cls)
        model = restored.model
        if mode_of(model).value != "none" or model.nbytes > MAX_BYTES:
            return False
        restore_operator_parts(model, parts)
        _learn_and_take(restored, "warm-0")
        small = {**model.params(), **{key: value for key, value in SMALL.items() if key in model.params()}}
        learner, other = (Recommender(model_cls(**small), pair_capacity=1000) for _ in range(2))
        blob, tracker = _learn_and_take(learner, "warm-1"), DeltaTracker(other, member="warm-2")
        if blob is not None:
            tracker.apply(blob)
        tracker.settle()
        return True
    except Exception as exc:  # noqa: BLE001 - a warm-up only moves kernel loads earlier
        log_event("warm_failed", logging.WARNING, error=f"{type(exc).__name__}: {exc}")
        return False


def _learn_and_take(rec: Recommender, member: str) -> bytes | None:
    """A few fake ratings learned by ``rec``'s replica and taken: one user and one item seen
    often enough to be announced for heavy slots, the rest not."""
    tracker = DeltaTracker(rec, member=member)
    users = np.repeat(np.arange(1, 5, dtype=np.int64), 16)
    items = np.tile(np.arange(1, 17, dtype=np.int64), 4)
    rec.learn_many(users, items, np.full(len(users), 3.0))
    return tracker.take()
