"""What every sketch shares: parameters that fix its shape, one state array, merge and bytes."""

from __future__ import annotations

from typing import ClassVar, Self

import numpy as np

from sketchrec.sketches import serial


class Sketch:
    """Base of the numpy-backed sketches.

    A subclass keeps its whole state in ``self.cells`` and says which constructor parameters fix
    its shape and hashing (``params()``); two sketches with equal params can be merged and a blob
    rebuilds an identical sketch.

    >>> from sketchrec.sketches import CountMinSketch
    >>> a, b = CountMinSketch(width=64, depth=3, seed=1), CountMinSketch(width=64, depth=3, seed=1)
    >>> a.add("x"); b.add("x", 2)
    >>> (a + b).estimate("x")
    3
    >>> CountMinSketch.from_bytes(a.to_bytes()) == a
    True
    """

    kind: ClassVar[str]
    cells: np.ndarray

    def params(self) -> dict:
        raise NotImplementedError

    def _extra_arrays(self) -> dict[str, np.ndarray]:
        return {}

    def _load_extra_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        """Restore state kept beside the cells (none by default)."""

    def _combine(self, other: Self) -> None:
        """Fold other's cells into ours (cell-wise sum by default)."""
        self.cells += other.cells

    @property
    def nbytes(self) -> int:
        """Bytes of sketch state (the fixed memory the sketch costs)."""
        return int(self.cells.nbytes + sum(a.nbytes for a in self._extra_arrays().values()))

    def merge(self, other: Self) -> Self:
        """Add another sketch of the same shape and seed into this one, in place."""
        if type(other) is not type(self) or other.params() != self.params():
            raise ValueError(f"cannot merge {type(self).__name__} with different shape or seed: "
                             f"{self.params()} vs {getattr(other, 'params', lambda: other)()}")
        self._combine(other)
        return self

    def __iadd__(self, other: Self) -> Self:
        return self.merge(other)

    def __add__(self, other: Self) -> Self:
        return self.copy().merge(other)

    def copy(self) -> Self:
        return type(self).from_bytes(self.to_bytes())

    def to_bytes(self) -> bytes:
        return serial.pack(self.kind, self.params(), {"cells": self.cells, **self._extra_arrays()})

    @classmethod
    def from_bytes(cls, blob: bytes) -> Self:
        params, arrays = serial.unpack(blob, cls.kind)
        sketch = cls(**params)
        if arrays["cells"].shape != sketch.cells.shape or arrays["cells"].dtype != sketch.cells.dtype:
            raise ValueError("sketch blob cells do not match its parameters")
        sketch.cells = arrays.pop("cells")
        sketch._load_extra_arrays(arrays)
        return sketch

    def __eq__(self, other: object) -> bool:
        return (type(other) is type(self) and other.params() == self.params()
                and np.array_equal(self.cells, other.cells))

    __hash__ = None  # mutable
