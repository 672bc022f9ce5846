"""`sketchrec bench`: the benchmark suite (``sketchrec.replay.bench.suite``), loaded when run."""

from __future__ import annotations


def bench_main(argv: list[str] | None = None) -> int:
    from sketchrec.replay.bench.suite import main
    return main(argv)
