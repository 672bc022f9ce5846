"""Where a ``SketchMF`` keeps its parameters, as ONE object its compiled kernels take.

numba passes a ``typing.NamedTuple`` of arrays to an ``@njit`` function as a single typed argument
(fields read by name, arrays by reference, ``cache=True`` works), so the kernels take one
``FactorStore`` instead of a dozen arrays in an order fixed elsewhere. The store holds no copies:
its arrays are the sketches' and the filter's own, so a write through it is a write to the model.

Salts are stacked by hash family (``USER`` = 0, ``ITEM`` = 1): ``store.salts[family]`` is that
family's (depth x light_dim) table, a contiguous view.

The kernels read the store's fields once, before their loops, into plain local arrays
(``models._sgd.unpack``): a tuple field or view read per rating made predictions much slower.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from sketchrec.models.implicit import Implicit

USER, ITEM = 0, 1  # hash families: the first index of the salt stacks


class HeavySlots(NamedTuple):
    """The heavy-hitter filter's slots (``models.heavy_filter``): count 0 marks a free slot;
    ``vectors[s, :dim]`` is the learned part of the id's latent vector, ``vectors[s, dim]`` its bias."""

    keys: np.ndarray       # (slots,) uint64
    families: np.ndarray   # (slots,) uint8: USER or ITEM
    counts: np.ndarray     # (slots,) int64
    vectors: np.ndarray    # (slots, dim + 1) float32


class FactorStore(NamedTuple):
    """A ``SketchMF``'s parameters: the vector and bias count sketches, their salts, the start
    vectors' salts and the heavy slots.

    >>> from sketchrec.models import SketchMF
    >>> store = SketchMF(dim=8, depth=4, width=256, heavy_slots=16, light_dim=4).store
    >>> store.salts.shape, store.bias_salts.shape, store.init_salts.shape, store.heavy.vectors.shape
    ((2, 4, 4), (2, 4, 1), (2, 8), (16, 9))
    """

    cells: np.ndarray        # (depth, width) float32: the latent vectors' count sketch
    bias_cells: np.ndarray   # (depth, bias_width) float32: the biases' count sketch
    salts: np.ndarray        # (2, depth, light_dim) uint64: addressing salts of the sketched components
    bias_salts: np.ndarray   # (2, depth, 1) uint64
    init_salts: np.ndarray   # (2, dim) uint64: salts of the start vectors
    heavy: HeavySlots
    implicit: Implicit       # users' rated items and the items' implicit vectors (empty: off)

