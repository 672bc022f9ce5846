"""A learning member's kernels loaded at start-up, before its first batch.

numba loads a compiled kernel from its on-disk cache (or compiles it) at the kernel's first call.
A member calls its learning kernel, and the kernels of a take and an apply (slots admitted, rows
harvested and routed, cells found and added, Bloom filters and the count-min), first inside its
learning loop: the loads then land on its first batches, the learning span whose CPU the fleet
benchmark counts (docs/scaling.md), where a plain learner whose process already ran its kernel
pays none. ``warm`` makes those first calls at start-up instead, on two throwaway replicas restored
from the snapshot the member starts from (the same model class, parameters and dtypes: the same
kernel signatures): a few fake ratings learned by one, taken, applied by the other.

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


def warm(parts: dict, model_cls) -> bool:
    """Call a member's kernels once on two replicas restored from ``parts`` (a snapshot's), then
    drop them; whether it did. Left out: a model in any privacy mode (DP steps draw noise, ids
    may be keyed: nothing is learned outside the member's own accounting) and one over
    ``MAX_BYTES``.
    A failure is logged in one line and changes nothing: the kernels then load where first used."""
    try:
        replicas = [Recommender.from_parts(parts, model_cls)]
        model = replicas[0].model
        if mode_of(model).value != "none" or model.nbytes > MAX_BYTES:
            return False
        replicas.append(Recommender.from_parts(parts, model_cls))
        for rec in replicas:
            restore_operator_parts(rec.model, parts)
        learner, other = (DeltaTracker(rec, member=f"warm-{n}") for n, rec in enumerate(replicas))
        # one user and one item seen often enough to be announced for heavy slots, the rest not
        users = np.repeat(np.arange(1, 5, dtype=np.int64), 16)
        items = np.tile(np.arange(1, 17, dtype=np.int64), 4)
        replicas[0].learn_many(users, items, np.full(len(users), 3.0))
        blob = learner.take()
        if blob is not None:
            other.apply(blob)
        other.settle()
        return True
    except Exception as exc:  # noqa: BLE001 - a warm-up only moves kernel loads earlier
        log_event("warm_failed", logging.WARNING, error=f"{type(exc).__name__}: {exc}")
        return False
