"""Compressed topics: topic -> model ratings/s for uncompressed, lz4 and zstd batches, in one run.

    python -m sketchrec.benchmarks.codecs [PATH] [--bootstrap HOST:PORT] [--codecs none,lz4,zstd]
                                            [--batch 1,100]

For every codec and message form (``--batch`` ratings per message, 1 = one CSV rating each), the
ratings file is published to a fresh topic by ``produce(compression=...)`` and then measured as in
``replay.bench.kafka``: a bare consumer that only fetches (and decompresses), and ``KafkaLearner``
consuming, parsing, learning and checkpointing into a SketchMF. Without --bootstrap, a Tansu
broker is started on a free loopback port.
"""

from __future__ import annotations

import argparse
import json
import uuid
from pathlib import Path

import numpy as np

from sketchrec.data import Ratings, read_ratings
from sketchrec.models import SketchMF
from sketchrec.benchmarks import PATH_HELP, data_file
from sketchrec.benchmarks.kafka import _tansu, bare_consume, learn_from
from sketchrec.stream.kafka.producer import order_for_topic, produce


def measure(data: Ratings, bootstrap: str, codec: str, batch: int, capacity: int) -> dict:
    """One topic of ``data`` in batches of ``codec``: produce, bare consume and topic->model rates."""
    topic = f"bench-{codec}-{batch}-{uuid.uuid4().hex[:6]}"
    sent = produce(data, bootstrap, topic, batch=batch, compression=codec)
    bare = bare_consume(bootstrap, topic, sent["messages"]) * len(data) / sent["messages"]
    return {"codec": codec, "ratings_per_message": batch, "messages": sent["messages"],
            "produce_ratings_per_s": sent["ratings_per_s"], "bare_consume_ratings_per_s": bare,
            "topic_to_model_ratings_per_s": learn_from(bootstrap, topic, capacity, len(data))}


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("path", nargs="?", type=Path, help=PATH_HELP)
    ap.add_argument("--bootstrap")
    ap.add_argument("--codecs", default="none,lz4,zstd")
    ap.add_argument("--batch", default="1,100", help="ratings per message, one topic each")
    args = ap.parse_args(argv)
    data = order_for_topic(read_ratings(data_file(args.path))[0])
    capacity = len(np.unique(data.users)) + len(np.unique(data.items))
    SketchMF(capacity=10).learn_many([1], [1], [3.0])  # compile outside the timings
    broker, bootstrap = _tansu() if args.bootstrap is None else (None, args.bootstrap)
    try:
        rows = [_print(measure(data, bootstrap, codec, int(batch), capacity))
                for batch in args.batch.split(",") for codec in args.codecs.split(",")]
    finally:
        if broker is not None:
            broker.terminate()
    print(json.dumps(rows))
    return rows


def _print(r: dict) -> dict:
    print(f"{r['codec']:6s} {r['ratings_per_message']:>4d}/msg {r['messages']:>9,} messages  bare consume "
          f"{r['bare_consume_ratings_per_s']:>10,.0f} ratings/s   topic->model "
          f"{r['topic_to_model_ratings_per_s']:>10,.0f} ratings/s", flush=True)
    return r

if __name__ == "__main__":
    main()
