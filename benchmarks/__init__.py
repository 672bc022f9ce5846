"""Benchmarks (`sketchrec bench`) and the serving load test: measurements, not library code."""

from __future__ import annotations

from pathlib import Path

from sketchrec.paths import MissingData, ml100k

PATH_HELP = "ratings file (default: $SKETCHREC_DATA/ml-100k/u.data, $SKETCHREC_DATA = ../shared/data)"


def data_file(path: str | Path | None) -> Path:
    """The ratings file a benchmark reads (``sketchrec.paths.ml100k``); a missing one ends the
    command with a one-line message."""
    try:
        return ml100k(path)
    except MissingData as exc:
        raise SystemExit(str(exc)) from None
