"""The windowed prequential curve: RMSE over consecutive windows of a fixed number of
predictions, so a drift and the recovery from it show (the overall RMSE averages them away),
and its plot.

>>> w = WindowedErrors(window=2)
>>> w.add(np.array([1.0, 2.0, 3.0]), np.array([1.0, 1.0, 1.0]))
>>> w.add(np.array([5.0]), np.array([1.0]))
>>> c = w.curve(); c["end"], c["n"], [round(x, 4) for x in c["rmse"]]
([2, 4], [2, 2], [0.7071, 3.1623])
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

WINDOWS = 100   # default: the stream in 100 windows (1% of it each)


def default_window(total: int) -> int:
    """Predictions per window when none is given: 1% of the stream, at least 1.

    >>> default_window(100_000), default_window(50)
    (1000, 1)
    """
    return max(1, math.ceil(total / WINDOWS))


class WindowedErrors:
    """Squared-error sums over windows of ``window`` consecutive predictions, in stream order
    (the last window may be shorter)."""

    def __init__(self, window: int):
        if window < 1:
            raise ValueError("window must be at least 1")
        self.window = int(window)
        self.n = 0
        self._sq: list[float] = []
        self._count: list[int] = []

    def add(self, predictions: np.ndarray, truth: np.ndarray) -> None:
        """The next predictions of the stream and the ratings they predicted."""
        sq = (np.asarray(predictions, dtype=np.float64) - truth) ** 2
        if sq.shape[0] == 0:
            return
        index = (self.n + np.arange(sq.shape[0])) // self.window
        first = int(index[0])
        sums = np.bincount(index - first, weights=sq)
        counts = np.bincount(index - first)
        if self._sq and len(self._sq) - 1 == first:   # the open window goes on
            self._sq[-1] += float(sums[0])
            self._count[-1] += int(counts[0])
            sums, counts = sums[1:], counts[1:]
        self._sq += sums.tolist()
        self._count += counts.tolist()
        self.n += sq.shape[0]

    def curve(self) -> dict:
        """{"window", "end": position after each window's last prediction, "rmse", "n"}."""
        ends = np.cumsum(self._count).tolist()
        return {"window": self.window, "end": ends,
                "rmse": [math.sqrt(s / c) for s, c in zip(self._sq, self._count)],
                "n": list(self._count)}


def plot_curves(curves: dict[str, dict], path: str | Path, title: str = "",
                change_at: int | None = None) -> None:
    """A PNG of one or more curves (label -> ``WindowedErrors.curve()``): windowed RMSE against
    the ratings seen, with a dashed line at ``change_at`` (a synthetic stream's change-point)."""
    import matplotlib
    matplotlib.use("Agg")   # files only, never a display
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for label, curve in curves.items():
        ax.plot(curve["end"], curve["rmse"], label=label, linewidth=1.2)
    if change_at is not None:
        ax.axvline(change_at, color="grey", linestyle="--", linewidth=1, label="change-point")
    ax.set_xlabel("ratings seen")
    ax.set_ylabel(f"RMSE per window ({next(iter(curves.values()))['window']:,} ratings)"
                  if curves else "RMSE per window")
    ax.set_title(title or "prequential RMSE per window")
    ax.grid(alpha=0.3)
    if curves:
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
