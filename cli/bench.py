"""`sketchrec bench`: the benchmark suite (``sketchrec.benchmarks.suite``), loaded when run;
`sketchrec bench serving`: the tail while learning (``sketchrec.benchmarks.serving``);
`sketchrec bench big-file`: a large file's parse and replay figures (``sketchrec.benchmarks.big_file``);
`sketchrec bench fleet`: a fleet's rates, CPU-seconds per rating and delta bytes (``sketchrec.benchmarks.fleet``)."""

from __future__ import annotations


def bench_main(argv: list[str] | None = None) -> int:
    if argv and argv[0] == "serving":
        from sketchrec.benchmarks.serving import main as serving_main
        return serving_main(argv[1:])
    if argv and argv[0] == "big-file":
        from sketchrec.benchmarks.big_file import main as big_file_main
        return big_file_main(["bench", *argv[1:]])
    if argv and argv[0] == "fleet":
        from sketchrec.benchmarks.fleet import main as fleet_main
        fleet_main(argv[1:])
        return 0
    from sketchrec.benchmarks.suite import main
    return main(argv)
