"""A ratings file shaped like MovieLens-25M, of any size, and what reading and replaying it costs.

``python -m sketchrec.benchmarks.big_file write OUT [--ratings N] [--string-ids]`` writes
``userId,movieId,rating,timestamp`` with a header, ML-25M's shape: 162,541 users and 59,047 items
(fewer for a small N), Zipf-skewed items, half-star ratings, rows grouped by user as
ML-25M's are. ``--string-ids`` writes UUID-like ids instead (the cost of opaque ids).
``python -m sketchrec.benchmarks.big_file parse FILE`` reads it with the compiled reader and
prints its parse rate (ratings per CPU-second) and peak resident memory. The files are large:
write them outside the repository (e.g. /tmp).
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
import uuid

import numpy as np

ML25M = {"ratings": 25_000_095, "users": 162_541, "items": 59_047}
CHUNK = 1_000_000


def shape(n_ratings: int) -> tuple[int, int]:
    """Users and items for ``n_ratings``: ML-25M's, or fewer when they would rate under 20 each."""
    return (max(10, min(ML25M["users"], n_ratings // 20)), max(10, min(ML25M["items"], n_ratings // 20)))


def write(path: str, n_ratings: int, seed: int = 0, string_ids: bool = False) -> None:
    import pyarrow as pa
    import pyarrow.csv as csv
    n_users, n_items = shape(n_ratings)
    rng = np.random.default_rng(seed)
    item_p = 1.0 / np.arange(1, n_items + 1) ** 0.9
    item_cdf = np.cumsum(item_p) / item_p.sum()
    per_user = rng.multinomial(n_ratings, rng.dirichlet(np.full(n_users, 0.6)))
    users = np.repeat(np.arange(1, n_users + 1), per_user)
    names = ({"u": np.array([str(uuid.UUID(int=int(x))) for x in rng.integers(0, 2**63, n_users + 1)]),
              "i": np.array([str(uuid.UUID(int=int(x))) for x in rng.integers(0, 2**63, n_items + 1)])}
             if string_ids else None)
    with open(path, "wb") as out:
        out.write(b"userId,movieId,rating,timestamp\n")
        for start in range(0, n_ratings, CHUNK):
            u = users[start:start + CHUNK]
            n = len(u)
            items = np.minimum(np.searchsorted(item_cdf, rng.random(n)), n_items - 1) + 1
            stars = np.clip(np.round((3.5 + rng.normal(0, 1.05, n)) * 2) / 2, 0.5, 5.0)
            stamps = rng.integers(789_652_009, 1_574_327_703, n)
            table = pa.table({"userId": names["u"][u] if names else u,
                              "movieId": names["i"][items] if names else items,
                              "rating": stars, "timestamp": stamps})
            csv.write_csv(table, out, csv.WriteOptions(include_header=False, quoting_style="none"))


def parse(path: str) -> dict:
    """Read ``path`` whole with the compiled reader: ratings, CPU-seconds, rate, peak RSS."""
    from sketchrec.data import read_ratings
    cpu, wall = time.process_time(), time.perf_counter()
    data, report = read_ratings(path)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"ratings": len(data), "skipped": report.n_skipped, "cpu_seconds": round(cpu, 2),
            "wall_seconds": round(wall, 2), "ratings_per_cpu_second": round(len(data) / cpu),
            "peak_rss_mb": round(peak, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sketchrec.benchmarks.big_file", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    w = sub.add_parser("write", help="write an ML-25M-shaped ratings file")
    w.add_argument("out")
    w.add_argument("--ratings", type=int, default=10_000_000)
    w.add_argument("--seed", type=int, default=0)
    w.add_argument("--string-ids", action="store_true", help="UUID-like user and item ids")
    p = sub.add_parser("parse", help="read a file whole; its parse rate and peak memory (JSON)")
    p.add_argument("path")
    args = ap.parse_args(argv)
    if args.command == "write":
        write(args.out, args.ratings, args.seed, args.string_ids)
        print(args.out)
    else:
        print(json.dumps(parse(args.path)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
