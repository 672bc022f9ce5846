"""Count sketch of d-dimensional vectors (thesis §2.3.2.5 and §4.1.1, eq. 4.1-4.4).

Component ``l`` of the vector of id ``e`` lives in ``k`` cells, one per row ``j``, at address
``h_j(e, l)`` with sign ``s_j(e, l)``. Reading averages (or takes the median of) ``s_j * C[j, h_j]``;
writing adds ``s_j * delta`` to every one of the k cells, so that without collisions the mean
estimate moves by exactly ``delta``. Several hash families (e.g. users and items, thesis §4.1.1) can
share one sketch: each family has its own salts.

The numba kernels below are module functions so that learners (``models/``) call them from
inside their own compiled loops; they release the GIL.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from sketchrec.sketches.base import Sketch
from sketchrec.sketches.hashing import as_keys, mix64, reduce32, salt_table

ESTIMATORS = ("mean", "median")


_ONE = np.uint64(1)
_S31 = np.uint64(31)


@njit(inline="always", cache=True)
def locate(salts, key, width, addr, sign):
    """Fill addr[j, l] and sign[j, l] for one key; salts has shape (k, d).

    One full mix per (key, row); each component then takes multiply-shift hashing of that row hash
    with its own odd multiplier (salts[j, l] | 1): the address from the product's top 32 bits
    (Dietzfelbinger's 2-universal family), the sign from bit 31. This is what makes the learner's
    2kd address computations per rating cheap.
    """
    for j in range(salts.shape[0]):
        row_hash = mix64(key ^ salts[j, 0])
        for l in range(salts.shape[1]):
            h = row_hash * (salts[j, l] | _ONE)
            addr[j, l] = reduce32(h, width)
            sign[j, l] = 1.0 if (h >> _S31) & _ONE else -1.0


@njit(inline="always", cache=True)
def gather_mean(cells, addr, sign, out):
    """out[l] = mean_j sign[j,l] * cells[j, addr[j,l]] (eq. 4.1/4.2)."""
    # row by row, components inner: the k*d loads are independent within a row, so the CPU keeps
    # many in flight (faster per rating than components outer; same sums in the same order)
    k, d = addr.shape
    for l in range(d):
        out[l] = 0.0
    for j in range(k):
        row, row_addr, row_sign = cells[j], addr[j], sign[j]
        for l in range(d):
            out[l] += row_sign[l] * row[row_addr[l]]
    for l in range(d):
        out[l] /= k


@njit(inline="always", cache=True)
def scatter_add(cells, addr, sign, delta):
    """cells[j, addr[j,l]] += sign[j,l] * delta[l] for every row (eq. 4.3/4.4)."""
    k, d = addr.shape
    for j in range(k):  # row by row, as in gather_mean
        row, row_addr, row_sign = cells[j], addr[j], sign[j]
        for l in range(d):
            row[row_addr[l]] += row_sign[l] * delta[l]


@njit(nogil=True, cache=True)
def _read_many(cells, salts, keys, median, out):
    k, d = salts.shape
    width = cells.shape[1]
    addr = np.empty((k, d), dtype=np.int64)
    sign = np.empty((k, d), dtype=np.float64)
    vals = np.empty(k, dtype=np.float64)
    for n in range(keys.shape[0]):
        locate(salts, keys[n], width, addr, sign)
        if median:
            for l in range(d):
                for j in range(k):
                    vals[j] = sign[j, l] * cells[j, addr[j, l]]
                out[n, l] = np.median(vals)
        else:
            gather_mean(cells, addr, sign, out[n])


@njit(nogil=True, cache=True)
def _update_many(cells, salts, keys, deltas):
    k, d = salts.shape
    width = cells.shape[1]
    addr = np.empty((k, d), dtype=np.int64)
    sign = np.empty((k, d), dtype=np.float64)
    for n in range(keys.shape[0]):
        locate(salts, keys[n], width, addr, sign)
        scatter_add(cells, addr, sign, deltas[n])


def scatter_rows(cells: np.ndarray, salts: np.ndarray, keys: np.ndarray, deltas: np.ndarray) -> None:
    """Add ``deltas[n]`` to the vector of ``keys[n]`` in raw ``cells`` (any float dtype, e.g. a
    float64 copy) addressed by ``salts`` (depth x components): what ``update_many`` does to a
    sketch's own cells, for holders of cell arrays (model replicas, see ``models.replica``)."""
    if len(keys):
        _update_many(cells, np.ascontiguousarray(salts), np.ascontiguousarray(keys, dtype=np.uint64),
                     np.ascontiguousarray(deltas, dtype=np.float64))


@njit(nogil=True, cache=True)
def _cell_indices(salts, keys, width, out):
    k, d = salts.shape
    addr = np.empty((k, d), dtype=np.int64)
    sign = np.empty((k, d), dtype=np.float64)
    for n in range(keys.shape[0]):
        locate(salts, keys[n], width, addr, sign)
        for j in range(k):
            for l in range(d):
                out[n, j * d + l] = j * width + addr[j, l]


def cell_indices(salts: np.ndarray, keys: np.ndarray, width: int) -> np.ndarray:
    """Flat indices (into ``depth x width`` cells) of the cells that hold the keys' components
    under ``salts``: where an update of those keys can have written (with repeats)."""
    out = np.empty((len(keys), salts.shape[0] * salts.shape[1]), dtype=np.int64)
    _cell_indices(np.ascontiguousarray(salts), np.ascontiguousarray(keys, dtype=np.uint64), width, out)
    return out.reshape(-1)


def gather_rows(cells: np.ndarray, salts: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """The mean estimates (n, components) of ``keys`` in raw ``cells`` addressed by ``salts``."""
    out = np.zeros((len(keys), salts.shape[1]), dtype=np.float64)
    if len(keys):
        _read_many(cells, np.ascontiguousarray(salts), np.ascontiguousarray(keys, dtype=np.uint64),
                   False, out)
    return out


class CountSketch(Sketch):
    """A ``depth x width`` float32 count sketch holding d-dimensional vectors per id.

    >>> cs = CountSketch(width=1024, depth=4, dim=3, seed=1)
    >>> cs.update("alice", [1.0, 2.0, 3.0])
    >>> cs.read("alice").round(3).tolist()
    [1.0, 2.0, 3.0]
    """

    kind = "CountSketch"

    def __init__(self, width: int, depth: int, dim: int = 1, seed: int = 0):
        if width < 1 or depth < 1 or dim < 1:
            raise ValueError("width, depth and dim must be positive")
        if width >= 2**32:
            raise ValueError("width must be below 2**32 (addresses are 32-bit)")
        self.width, self.depth, self.dim, self.seed = int(width), int(depth), int(dim), int(seed)
        self.cells = np.zeros((self.depth, self.width), dtype=np.float32)
        self._salts: dict[int, np.ndarray] = {}

    def params(self) -> dict:
        return {"width": self.width, "depth": self.depth, "dim": self.dim, "seed": self.seed}

    def salts(self, family: int = 0) -> np.ndarray:
        """Salts of one hash family, shape (depth, dim)."""
        table = self._salts.get(family)
        if table is None:
            table = self._salts[family] = salt_table(self.seed, family, self.depth, self.dim)
        return table

    def read_many(self, ids, family: int = 0, estimator: str = "mean") -> np.ndarray:
        """Vectors of many ids (or uint64 keys), shape (n, dim), float64."""
        if estimator not in ESTIMATORS:
            raise ValueError(f"estimator must be one of {ESTIMATORS}")
        keys = as_keys(ids)
        out = np.empty((keys.shape[0], self.dim), dtype=np.float64)
        _read_many(self.cells, self.salts(family), keys, estimator == "median", out)
        return out

    def update_many(self, ids, deltas, family: int = 0) -> None:
        """Add deltas (shape (n, dim)) to the vectors of many ids, in order."""
        keys = as_keys(ids)
        deltas = np.ascontiguousarray(deltas, dtype=np.float64).reshape(keys.shape[0], self.dim)
        _update_many(self.cells, self.salts(family), keys, deltas)

    def read(self, item_id, family: int = 0, estimator: str = "mean") -> np.ndarray:
        """The estimated vector of one id, shape (dim,)."""
        return self.read_many([item_id], family, estimator)[0]

    def update(self, item_id, delta, family: int = 0) -> None:
        """Add a vector (or a scalar when dim == 1) to one id's vector."""
        self.update_many([item_id], np.reshape(np.asarray(delta, dtype=np.float64), (1, self.dim)), family)


def width_for_space_gain(n_ids: int, dim: int, space_gain: float, depth: int) -> int:
    """The sketch sizing, eq. 4.9: the width w = ceil((|U| + |I|) d / (gamma k)) that holds n_ids
    d-dimensional vectors at space gain gamma over dense storage; at least 1.

    >>> width_for_space_gain(1000, 32, 2.0, 4)
    4000
    """
    if space_gain <= 0:
        raise ValueError("space_gain must be positive")
    return max(1, math.ceil(n_ids * dim / (space_gain * depth)))
