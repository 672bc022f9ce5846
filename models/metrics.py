"""Running error sums of a learner's predictions."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np


@dataclass
class ErrorStats:
    """Running squared/absolute error sums."""

    n: int = 0
    sq: float = 0.0
    abs: float = 0.0

    def add(self, predictions: np.ndarray, truth: np.ndarray) -> None:
        err = predictions - truth
        self.n += err.shape[0]
        self.sq += float(err @ err)
        self.abs += float(np.abs(err).sum())

    @property
    def rmse(self) -> float:
        return float(np.sqrt(self.sq / self.n)) if self.n else float("nan")

    @property
    def mae(self) -> float:
        return self.abs / self.n if self.n else float("nan")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ErrorStats":
        return cls(**d)
