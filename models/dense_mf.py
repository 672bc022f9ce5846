"""Regular (unbounded) matrix factorization: the baseline the sketch is measured against."""

from __future__ import annotations

import inspect

import numpy as np

from sketchrec.models import steps as step_rules
from sketchrec.models._dense_sgd import dense_learn, dense_predict
from sketchrec.models._sgd import init_rows
from sketchrec.models.base import ITEM, KEYED, USER, FactorizationModel


class _IdTable:
    """Dense row index per id key, with arrays grown by doubling."""

    def __init__(self, dim: int):
        self.index: dict[int, int] = {}
        self.vectors = np.zeros((16, dim), dtype=np.float32)
        self.biases = np.zeros(16, dtype=np.float32)

    def rows(self, keys: np.ndarray, create: bool, init_salts, init_std) -> np.ndarray:
        uniques, inverse = np.unique(keys, return_inverse=True)
        idx = np.fromiter((self.index.get(k, -1) for k in uniques.tolist()), dtype=np.int64,
                          count=len(uniques))
        if create and (idx < 0).any():
            new = np.flatnonzero(idx < 0)
            start = len(self.index)
            self._grow(start + len(new))
            self.vectors[start:start + len(new)] = init_rows(uniques[new], init_salts, init_std)
            for offset, n in enumerate(new):
                self.index[int(uniques[n])] = idx[n] = start + offset
        return idx[inverse.reshape(-1)]

    def _grow(self, size: int) -> None:
        if size > len(self.biases):
            cap = max(size, 2 * len(self.biases))
            self.vectors = np.concatenate([self.vectors, np.zeros((cap - len(self.biases),
                                                                    self.vectors.shape[1]), np.float32)])
            self.biases = np.concatenate([self.biases, np.zeros(cap - len(self.biases), np.float32)])


class DenseMF(FactorizationModel):
    """The same biased MF as ``SketchMF`` with one float32 row per user and per item.

    Memory grows with the number of distinct ids; with no collisions the sketch learner computes
    exactly what this one does (same start vectors, same SGD order).

    Parameters
    ----------
    dim, lr, reg, bias_reg, init_std, lr_schedule_T, sgld_temperature, clip_loss, seed : as
        ``SketchMF``'s (``models.base.FactorizationModel``).
    steps : the step rule (``models.steps``): ``SGD(lr)`` or ``SGLD(lr, temperature)`` (AdaGrad
        is the sketch model's); ``lr`` and ``sgld_temperature`` build it when not given.

    Examples
    --------
    >>> from sketchrec import DenseMF
    >>> model = DenseMF(dim=8, seed=0)
    >>> _ = model.learn_many(["ann", "bob"], ["up", "heat"], [5.0, 2.0])
    >>> 0.5 <= model.predict_one("ann", "up") <= 5.0
    True
    >>> DenseMF(dim=8, lr=0.05, sgld_temperature=0.01).steps
    SGLD(lr=0.05, temperature=0.01)
    """

    # rows per id, in the order ids came: no fixed shape that replicas could add changes to
    STATE_MERGES = {f"{family}_{part}": KEYED for family in ("users", "items")
                    for part in ("keys", "rows", "vectors", "biases")}

    def __init__(self, dim: int = 64, lr: float = 0.03, reg: float = 0.085,
                 bias_reg: float | None = 0.05, init_std: float = 0.05, lr_schedule_T: float = 20.0,
                 sgld_temperature: float | None = None, clip_loss: float | None = None,
                 seed: int = 0, steps: step_rules.SGD | step_rules.SGLD | dict | None = None):
        steps = step_rules.resolve(steps, "sgd", lr, 1.0, sgld_temperature, _KEYWORD_DEFAULTS)
        if steps.optimizer != "sgd":
            raise ValueError(f"AdaGrad steps are implemented for the sketch model, not DenseMF "
                             f"({steps!r}): give steps=SGD(lr) or SGLD(lr, temperature)")
        super().__init__(dim=dim, lr=steps.lr, reg=reg, bias_reg=bias_reg, init_std=init_std,
                         lr_schedule_T=lr_schedule_T, clip_loss=clip_loss, seed=seed, steps=steps)
        self._tables = (_IdTable(self.dim), _IdTable(self.dim))

    def _state_arrays(self) -> dict[str, np.ndarray]:
        out = {}
        for name, table in zip(("users", "items"), self._tables):
            n = len(table.index)
            out[f"{name}_keys"] = np.fromiter(table.index, dtype=np.uint64, count=n)
            out[f"{name}_rows"] = np.fromiter(table.index.values(), dtype=np.int64, count=n)
            out[f"{name}_vectors"], out[f"{name}_biases"] = table.vectors[:n], table.biases[:n]
        return out

    def _load_state_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        for name, table in zip(("users", "items"), self._tables):
            table.index = dict(zip(arrays[f"{name}_keys"].tolist(), arrays[f"{name}_rows"].tolist()))
            table.vectors = arrays[f"{name}_vectors"].copy()
            table.biases = arrays[f"{name}_biases"].copy()
            table._grow(len(table.index) + 1)

    @property
    def n_users(self) -> int:
        return len(self._tables[USER].index)

    @property
    def n_items(self) -> int:
        return len(self._tables[ITEM].index)

    @property
    def nbytes(self) -> int:
        arrays = sum(t.vectors.nbytes + t.biases.nbytes for t in self._tables)
        # the id -> row dictionaries cost memory too: about 100 bytes an entry in CPython
        return arrays + 100 * (self.n_users + self.n_items)

    def factors(self, ids, family: int) -> tuple[np.ndarray, np.ndarray]:
        keys = self.id_keys.as_keys(ids)
        rows = self._rows(keys, family, False)
        table = self._tables[family]
        vectors = init_rows(keys, self._init_salts[family], self.init_std)
        known = rows >= 0
        vectors[known] = table.vectors[rows[known]]
        biases = np.where(known, table.biases[np.maximum(rows, 0)], 0.0)
        return vectors, biases

    def _rows(self, keys, family: int, create: bool) -> np.ndarray:
        return self._tables[family].rows(keys, create, self._init_salts[family], self.init_std)

    def _learn_keys(self, ukeys, ikeys, ratings, hp, out) -> None:
        uidx, iidx = self._rows(ukeys, USER, True), self._rows(ikeys, ITEM, True)
        users, items = self._tables
        dense_learn(users.vectors, items.vectors, users.biases, items.biases, uidx, iidx, ratings,
                    hp, self.stats, self.counters, out)

    def _predict_keys(self, ukeys, ikeys, clip, out) -> None:
        uidx, iidx = self._rows(ukeys, USER, False), self._rows(ikeys, ITEM, False)
        users, items = self._tables
        dense_predict(users.vectors, items.vectors, users.biases, items.biases, uidx, iidx,
                      init_rows(ukeys, self._init_salts[USER], self.init_std),
                      init_rows(ikeys, self._init_salts[ITEM], self.init_std), self.stats, clip, out)


# the old step keywords' defaults (optimizer, lr, acc0, sgld_temperature): at these, they defer to steps=
_SIGNATURE = inspect.signature(DenseMF.__init__).parameters
_KEYWORD_DEFAULTS = ("sgd", _SIGNATURE["lr"].default, 1.0, _SIGNATURE["sgld_temperature"].default)
