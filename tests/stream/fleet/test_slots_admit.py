"""Admitting announced ids into fleet-mode slots (``stream.fleet.slots.FleetSlots.admit``)."""

import numpy as np

from sketchrec.models import SketchMF
from sketchrec.models.base import USER
from sketchrec.models.heavy_filter import WAYS
from sketchrec.stream.fleet.slots import FREE, FleetSlots


def test_admitted_ids_read_their_estimates_at_once_in_their_sorted_buckets():
    model = SketchMF(dim=4, width=512, heavy_slots=16)
    rng = np.random.default_rng(0)
    users = rng.integers(0, 40, 400)
    model.learn_many(users, rng.integers(0, 40, 400), rng.integers(1, 6, 400).astype(float))
    slots = FleetSlots(model)
    h = model.heavy
    before = set(zip(h.keys[slots.held()].tolist(), h.families[slots.held()].tolist()))
    keys = model.id_keys.as_keys(np.arange(40))[::-1].copy()   # more ids than ways, unsorted
    slots.admit(keys, np.full(len(keys), USER, np.uint8), (model.vectors.cells.copy(),
                                                           model.biases.cells.copy()))
    held = slots.held()
    assert len(held) == len(h.families) and set(h.keys[held]) <= set(keys.tolist())
    for start in range(0, len(h.keys), WAYS):   # each bucket in (key, family) order
        bucket = list(zip(h.keys[start:start + WAYS].tolist(), h.families[start:start + WAYS].tolist()))
        assert bucket == sorted(set(bucket))
    # S = 0 at admission: each row is its id's sketch estimate, even before a full refresh
    held = np.array([s for s in held if (int(h.keys[s]), int(h.families[s])) not in before])
    assert len(held) >= WAYS
    estimates = slots._estimates(held).astype(np.float32)
    assert np.abs(estimates).max() > 0
    np.testing.assert_allclose(h.cells[held], estimates, rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(slots.view[held], h.cells[held])
    assert (h.families != FREE).all()
