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
        return int(sum(a.nbytes for a in self.state_arrays().values()))

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

    def state_arrays(self) -> dict[str, np.ndarray]:
        """The whole state by name: ``cells`` and what is kept beside them (what ``to_bytes``
        writes; a holder of several sketches stores these under its own names)."""
        return {"cells": self.cells, **self._extra_arrays()}

    def load_state_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        """Adopt ``state_arrays()`` of a sketch with the same params (the arrays, not copies)."""
        cells = arrays["cells"]
        if cells.shape != self.cells.shape or cells.dtype != self.cells.dtype:
            raise ValueError(f"{self.kind} cells do not match its parameters")
        self.cells = cells
        self._load_extra_arrays({name: a for name, a in arrays.items() if name != "cells"})

    def to_bytes(self) -> bytes:
        return serial.pack(self.kind, self.params(), self.state_arrays())

    @classmethod
    def from_bytes(cls, blob: bytes) -> Self:
        params, arrays = serial.unpack(blob, cls.kind)
        sketch = cls(**params)
        sketch.load_state_arrays(arrays)
        return sketch

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self) or other.params() != self.params():
            return False
        mine, theirs = self.state_arrays(), other.state_arrays()
        return mine.keys() == theirs.keys() and all(np.array_equal(a, theirs[n])
                                                    for n, a in mine.items())

    __hash__ = None  # mutable
