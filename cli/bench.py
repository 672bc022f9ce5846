"""`sketchrec bench`: the benchmark suite (``sketchrec.benchmarks.suite``), loaded when run."""

from __future__ import annotations


def bench_main(argv: list[str] | None = None) -> int:
    from sketchrec.benchmarks.suite import main
    return main(argv)
