"""Benchmarks (`sketchrec bench`) and the serving load test: measurements, not library code."""
