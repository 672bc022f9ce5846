"""The sketch learner's writes: a step added to an id's sketch cells or heavy-filter slot, with
SGLD's noise when its temperature is set (``models._sgd`` has the model and the noise's scale).

The noisy writes are calls, not IR-inlined: a normal draw per cell dwarfs a call, and a run
without SGLD then compiles less.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from sketchrec.sketches.count_sketch import scatter_add


@njit(inline="always", cache=True)
def scatter_noisy(cells, addr, sign, delta, noise_std):
    """scatter_add plus N(0, noise_std^2) per touched cell; the noiseless case keeps the plain
    loop (no branch or RNG call per cell in the hot path)."""
    if noise_std <= 0.0:
        scatter_add(cells, addr, sign, delta)
    else:
        _scatter_with_noise(cells, addr, sign, delta, noise_std)


@njit(cache=True)   # SGLD only, and a normal draw per cell: a call costs nothing beside them
def _scatter_with_noise(cells, addr, sign, delta, noise_std):
    k, d = addr.shape
    for l in range(d):
        for j in range(k):
            cells[j, addr[j, l]] += sign[j, l] * delta[l] + noise_std * np.random.standard_normal()


@njit(inline="always", cache=True)
def write_slot_or_cells(cells, fvectors, slot, offset, addr, sign, delta, cell_noise_std,
                        slot_noise_std):
    """Add delta to an id's parameters: its filter slot's columns from ``offset`` on (0: the
    vector, dim: the bias), or its sketch cells when it holds no slot (slot < 0)."""
    if slot < 0:
        scatter_noisy(cells, addr, sign, delta, cell_noise_std)
        return
    if slot_noise_std > 0.0:
        # np.int64: the callers' constant offset 0 would otherwise compile a copy of its own
        _add_with_noise(fvectors[slot], np.int64(offset), delta, slot_noise_std)
        return
    write_plain(cells, fvectors, slot, offset, addr, sign, delta)


@njit(inline="always", cache=True)
def write_plain(cells, fvectors, slot, offset, addr, sign, delta):
    """``write_slot_or_cells`` without noise: all a learner without SGLD compiles."""
    if slot < 0:
        scatter_add(cells, addr, sign, delta)
        return
    row = fvectors[slot]
    for l in range(delta.shape[0]):
        row[offset + l] += delta[l] + 0.0   # + 0.0: as the noisy sum, a -0.0 step stores +0.0


@njit(cache=True)   # SGLD only (see _scatter_with_noise)
def _add_with_noise(row, offset, delta, noise_std):
    for l in range(delta.shape[0]):
        row[offset + l] += delta[l] + noise_std * np.random.standard_normal()
