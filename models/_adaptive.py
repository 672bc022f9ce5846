"""Per-coordinate adaptive step sizes (AdaGrad) for the sketch learner, kept in sketches.

AdaGrad scales each parameter's step by 1 / sqrt(G), G the running sum of that parameter's squared
gradients: often-rated ids and busy coordinates take small, averaging steps; a new id takes large
ones. On a count sketch of vectors, G of component l of id e lives in a count-min sketch of the
SAME shape and addresses as the vectors' cells (the address buffers ``locate`` filled for the
vectors are reused; signs are ignored): G is read as the smallest of its k cells and written by
conservative update (each cell raised to at least the new estimate), so collisions can only
over-estimate G, i.e. shrink a step, never blow one up. Ids holding a heavy-filter slot keep exact
accumulators in a row beside the slot; an id admitted to a slot starts from its sketch estimate
(an evicted id goes back to its sketch estimate, which missed its time in the slot: a larger step,
for an id that is then rarely seen).

The learner's ``lr`` is AdaGrad's eta: the step of a parameter is eta g / sqrt(ACC0 + G), ACC0
the accumulators' start (a damping that keeps a new id's first steps at most eta / sqrt(ACC0)).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

SGD, ADAGRAD, ADAGRAD_ID = 0, 1, 2
OPTIMIZERS = {"sgd": SGD, "adagrad": ADAGRAD, "adagrad-id": ADAGRAD_ID}


class Accumulators(NamedTuple):
    """AdaGrad's squared-gradient sums beside a ``FactorStore`` (empty arrays with plain SGD)."""

    cells: np.ndarray        # like FactorStore.cells: (depth, width) float32
    bias_cells: np.ndarray   # like FactorStore.bias_cells
    heavy: np.ndarray        # (slots, dim + 1) float32: the heavy ids' exact sums

    @classmethod
    def empty(cls) -> "Accumulators":
        none = np.zeros((0, 0), dtype=np.float32)
        return cls(none, none, none)

    @classmethod
    def like(cls, cells: np.ndarray, bias_cells: np.ndarray, heavy_rows: int, dim: int,
             per_id: bool = False) -> "Accumulators":
        """Per coordinate: sketches shaped like the vectors' and the biases'; ``per_id``: two
        shaped like the biases' (one sum for an id's vector, one for its bias)."""
        if per_id:
            return cls(np.zeros_like(bias_cells), np.zeros_like(bias_cells),
                       np.zeros((heavy_rows, 2), dtype=np.float32))
        return cls(np.zeros_like(cells), np.zeros_like(bias_cells),
                   np.zeros((heavy_rows, dim + 1), dtype=np.float32))


@njit(inline="always", cache=True)
def sum_squares(x):
    """sum of x[l]^2 in four interleaved partial sums: one running sum is a chain of dependent
    adds the CPU cannot overlap (at d = 64 it cost a tenth of a rating's step); four can be.

    >>> float(sum_squares(np.arange(7.0)))
    91.0
    """
    a0 = a1 = a2 = a3 = 0.0
    n = x.shape[0]
    top = n - n % 4
    for l in range(0, top, 4):
        a0 += x[l] * x[l]
        a1 += x[l + 1] * x[l + 1]
        a2 += x[l + 2] * x[l + 2]
        a3 += x[l + 3] * x[l + 3]
    for l in range(top, n):
        a0 += x[l] * x[l]
    return (a0 + a1) + (a2 + a3)


@njit(inline="always", cache=True)
def cm_read(cells, addr, l):
    """Count-min estimate of component l at addr: the least of its k cells."""
    g = cells[0, addr[0, l]]
    for j in range(1, addr.shape[0]):
        g = min(g, cells[j, addr[j, l]])
    return g


@njit(inline="always", cache=True)
def adagrad_scale(acc_cells, acc_heavy, slot, offset, addr, delta, lr, acc0):
    """Turn plain SGD deltas (-lr g) into AdaGrad's (-lr g / sqrt(acc0 + G)), G updated first:
    in the slot's row from column ``offset`` when slot >= 0, else in the count-min cells at addr
    (the first addr.shape[1] components: the others are not learned)."""
    n = delta.shape[0] if slot >= 0 else addr.shape[1]
    inv_lr = 1.0 / lr
    for l in range(n):
        g = delta[l] * inv_lr
        if slot >= 0:
            total = acc_heavy[slot, offset + l] + g * g
            acc_heavy[slot, offset + l] = total
        else:
            total = cm_read(acc_cells, addr, l) + g * g
            for j in range(addr.shape[0]):  # conservative update
                if acc_cells[j, addr[j, l]] < total:
                    acc_cells[j, addr[j, l]] = total
        delta[l] /= np.sqrt(acc0 + total)


@njit(inline="always", cache=True)
def adagrad_id_scale(acc_cells, acc_heavy, slot, column, baddr, delta, lr, acc0):
    """adagrad_scale with ONE sum per id and parameter group (the mean squared gradient of its
    components): in the slot's row at ``column``, else in the count-min cells at the id's bias
    addresses baddr. k cells per id instead of k per component: no slower than plain SGD."""
    inv_lr = 1.0 / lr
    g2 = sum_squares(delta) * inv_lr * inv_lr / delta.shape[0]
    if slot >= 0:
        total = acc_heavy[slot, column] + g2
        acc_heavy[slot, column] = total
    else:
        total = cm_read(acc_cells, baddr, 0) + g2
        for j in range(baddr.shape[0]):
            if acc_cells[j, baddr[j, 0]] < total:
                acc_cells[j, baddr[j, 0]] = total
    scale = 1.0 / np.sqrt(acc0 + total)
    for l in range(delta.shape[0]):
        delta[l] *= scale


@njit(cache=True)   # rare (an admission): a call, not IR-inlined (kernels compile faster)
def adopt(acc, mode, slot, addr, baddr):
    """An id has just been admitted to ``slot``: its exact accumulators start from its sketch
    estimates (addr/baddr: its vector and bias addresses)."""
    row = acc.heavy[slot]
    if mode == ADAGRAD_ID:
        row[0] = cm_read(acc.cells, baddr, 0)
        row[1] = cm_read(acc.bias_cells, baddr, 0)
        return
    for l in range(row.shape[0]):
        row[l] = 0.0
    for l in range(addr.shape[1]):
        row[l] = cm_read(acc.cells, addr, l)
    row[row.shape[0] - 1] = cm_read(acc.bias_cells, baddr, 0)
