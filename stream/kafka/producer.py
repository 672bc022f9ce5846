"""Publish a ratings file (any format `replay` reads) to a Kafka topic, like rating devices would.

Messages are keyed by user, so one user's ratings stay in order on one partition. ``batch=1``
sends one CSV rating per message; ``batch=N`` sends N ratings of one user-partition per message
(the batched form, for throughput). ``rate`` caps ratings per second. ``compression`` is the
codec of the record batches (none, gzip, snappy, lz4, zstd), as production producers set it.
The messages of a whole file are built at once in compiled code (``sketchrec.csv_lines``) and
sent through librdkafka (``_client`` says why).
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Iterator

import numpy as np
from kafka.errors import KafkaError

from sketchrec.privacy.ldp import HEADER
from sketchrec.stream.kafka.consumer import kafka_config
from sketchrec.stream.kafka.messages import _CSV_UNSAFE, encode_batch
from sketchrec.data import Ratings
from sketchrec.ratings import stable_order

COMPRESSIONS = ("none", "gzip", "snappy", "lz4", "zstd")
log = logging.getLogger(__name__)


def ensure_topic(bootstrap: str, topic: str, partitions: int = 2) -> bool:
    """Create the topic if it does not exist; True if it was created."""
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic
    from kafka.errors import TopicAlreadyExistsError
    admin = KafkaAdminClient(**kafka_config(bootstrap))
    try:
        if topic in admin.list_topics():
            return False
        admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])
        return True
    except TopicAlreadyExistsError:
        return False
    finally:
        admin.close()


class DeliveryError(KafkaError):
    """Not every message was acknowledged within the timeout (the broker stayed down)."""


class _Delivered:
    """Counts the ratings the broker acknowledged, and the first delivery error."""

    def __init__(self):
        self.ratings, self.error = 0, None

    def callback(self, n_ratings: int) -> Callable:
        """librdkafka's delivery report of one message of ``n_ratings`` (run in ``poll``/``flush``)."""
        def report(err, _msg) -> None:
            if err is None:
                self.ratings += n_ratings
            else:
                self.error = self.error or err
        return report


def _client(bootstrap: str, compression: str, transactional_id: str | None):
    """librdkafka's producer (confluent-kafka), set as the kafka-python one was: idempotent, every
    replica acknowledges (acks=all), 20 ms linger, 1 MB batches, the chosen codec; its default
    partitioner for keyed messages is replaced by ``murmur2_random``, the Java client's and
    kafka-python's ``DefaultPartitioner`` (a key lands on the partition it always did).
    Why librdkafka: kafka-python spends tens of microseconds of Python per message sent
    (partitioner, accumulator, future), and a file keyed by user is at least one message per
    user and run; librdkafka queues a message in one C call and partitions, batches, compresses
    and retries in its own threads."""
    import confluent_kafka
    return confluent_kafka.Producer({
        # idempotence, as kafka-python had it by default: a retried request the broker already
        # stored is not written twice, and a failed batch cannot let a later one overtake it (the
        # per-partition order a user's ratings are learned in); librdkafka's default is off
        "enable.idempotence": True,
        "bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 20, "batch.size": 1 << 20,
        "message.max.bytes": 16 << 20, "compression.type": compression,
        "partitioner": "murmur2_random", "queue.buffering.max.messages": 1_000_000,
        "logger": log,   # its connection errors through logging, as kafka-python's (not raw stderr)
        **({"transactional.id": transactional_id} if transactional_id else {})})


def produce(ratings: Ratings, bootstrap: str, topic: str, batch: int = 1, rate: float | None = None,
            partitions: int = 2, randomiser=None, compression: str = "none",
            timeout: float = 120.0, held_until: Callable[[], object] | None = None) -> dict:
    """Send all ratings, in order; returns counts and throughput. With ``randomiser`` (a
    ``privacy.ldp.DeviceRandomiser``) every rating is perturbed before it is sent — the raw value
    never leaves this process — and every message carries a header naming the mechanism.
    The producer retries across a broker outage; DeliveryError (naming how many ratings were
    acknowledged) when not every message is acknowledged ``timeout`` seconds after the last send.
    With ``held_until``, everything goes in one transaction, committed once every message is
    acknowledged and ``held_until()`` has returned: read_committed consumers (ours) see none of it
    before, then all of it at once (a benchmark starts its consumers in ``held_until``)."""
    import confluent_kafka
    if batch < 1:
        raise ValueError("batch must be at least 1")
    if compression not in COMPRESSIONS:
        raise ValueError(f"compression must be one of {', '.join(COMPRESSIONS)}")
    ensure_topic(bootstrap, topic, partitions)
    try:
        return _produce(ratings, bootstrap, topic, batch, rate, randomiser, compression, timeout,
                        held_until)
    except confluent_kafka.KafkaException as exc:   # one error type for callers, as before
        raise KafkaError(str(exc.args[0] if exc.args else exc)) from None


def _produce(ratings: Ratings, bootstrap: str, topic: str, batch: int, rate: float | None,
             randomiser, compression: str, timeout: float, held_until) -> dict:
    producer = _client(bootstrap, compression, f"held-{topic}" if held_until else None)
    if held_until:
        producer.init_transactions(30)
        producer.begin_transaction()
    t0, cpu0 = time.perf_counter(), time.process_time()
    sent_messages = 0
    values = ratings.ratings if randomiser is None else randomiser.perturb(ratings.ratings)
    headers = None if randomiser is None else [(HEADER, randomiser.header())]
    delivered = _Delivered()
    messages = (_messages(ratings, values, batch) if rate is None
                else _paced(_rows(ratings, values), batch, rate, t0))
    for key, value, n_ratings in messages:
        if not _send(producer, topic, key, value, headers, delivered.callback(n_ratings), timeout):
            break   # the broker took nothing for ``timeout`` s: _flush names what was delivered
        sent_messages += 1
    total = len(ratings)
    acknowledged: list[float] = []   # when the last message was (a held commit waits after it)
    _flush(producer, delivered, total, timeout,
           held_until and (lambda: (acknowledged.append(time.perf_counter()), held_until())))
    seconds = (acknowledged[0] if acknowledged else time.perf_counter()) - t0
    # this process's CPU, librdkafka's threads included: on a shared machine the robust figure
    cpu_per_million = (time.process_time() - cpu0) * 1e6 / max(total, 1)
    return {"topic": topic, "ratings": total, "messages": sent_messages, "compression": compression,
            "seconds": seconds, "ratings_per_s": total / max(seconds, 1e-9),
            "cpu_s_per_million": cpu_per_million,
            **({"ldp": randomiser.header().decode()} if randomiser is not None else {})}


def _send(producer, topic: str, key: bytes, value: bytes, headers, report: Callable,
          timeout: float) -> bool:
    """Queue one message; while librdkafka's queue is full (a broker outage, or sending faster
    than the broker takes), serve delivery reports until it has room: False after ``timeout`` s."""
    deadline = None
    while True:
        try:
            producer.produce(topic, value, key, headers=headers, on_delivery=report)
            producer.poll(0)   # the delivery reports due (no wait)
            return True
        except BufferError:
            deadline = deadline or time.monotonic() + timeout
            if time.monotonic() > deadline:
                return False
            producer.poll(0.1)


Message = tuple[bytes, bytes, int]   # (key, value, ratings in it)


def _rows(ratings: Ratings, values: np.ndarray) -> list[tuple]:
    return list(zip(ratings.users.tolist(), ratings.items.tolist(), values.tolist(),
                    ratings.timestamps.tolist()))


def _paced(rows: list[tuple], batch: int, rate: float | None, t0: float) -> Iterator[Message]:
    """The messages of ``rows`` one rating at a time: a user's ratings gather until ``batch`` of
    them make a message (sent then), the rest go at the end in the order their users' last
    message began; with ``rate``, no faster than ``rate`` ratings per second."""
    pending: dict = {}
    for n, row in enumerate(rows):
        key = str(row[0]).encode()
        pending.setdefault(key, []).append(row)
        if len(pending[key]) >= batch:
            group = pending.pop(key)
            yield key, encode_batch(group), len(group)
        if rate is not None:
            # one clock reading: a stalled send (broker outage) can pass ``due`` between two
            wait = t0 + (n + 1) / rate - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
    for key, group in pending.items():
        yield key, encode_batch(group), len(group)


def _messages(ratings: Ratings, values: np.ndarray, batch: int) -> Iterator[Message]:
    """The messages ``_paced`` makes without a rate, byte for byte, built a column at a time:
    every rating's CSV line written in one compiled pass (``sketchrec.csv_lines``), a user's
    lines cut into runs of ``batch``, and the runs sent in the order ``_paced`` sends them (a
    full run when its last rating comes, the rest at the end by where they began). Ids holding a
    comma or a line break (JSON messages), or columns arrow cannot type, take ``_paced``."""
    import pyarrow as pa
    from sketchrec.csv_lines import csv_lines, group_order, text_or_ints
    n = len(ratings)
    users = ratings.users
    try:
        if n == 0 or any(ids.dtype == object and _unsafe(ids) for ids in (users, ratings.items)):
            raise ValueError("a message of JSON")
        columns = [text_or_ints(col) for col in (users, ratings.items, ratings.timestamps)]
        encoded = pa.array(users).dictionary_encode()    # compiled, for int and text ids alike
    except (ValueError, pa.ArrowException):
        yield from _paced(_rows(ratings, values), batch, None, 0.0)
        return
    user_of = encoded.indices.to_numpy(zero_copy_only=False)
    order = group_order(user_of, len(encoded.dictionary))   # each user's ratings together, in order
    counts = np.bincount(user_of)
    rank = np.arange(n) - np.repeat(np.cumsum(counts) - counts, counts)   # within its user
    starts = np.flatnonzero(rank % batch == 0)                           # a run begins
    ends = np.append(starts[1:], n)
    full = ends - starts == batch
    # _paced sends a full run at its last rating, the others after everything, by first rating
    sent_at = np.where(full, order[ends - 1], n + order[starts])
    stars = pa.array(values).dictionary_encode()         # a rating's text: one :g per distinct value
    offsets, data = csv_lines(order, columns[0], columns[1],
                              stars.indices.to_numpy(zero_copy_only=False),
                              [f"{r:g}" for r in stars.dictionary.to_pylist()], columns[2])
    data = memoryview(data)
    keys = [str(u).encode() for u in encoded.dictionary.to_pylist()]
    for run in np.argsort(sent_at).tolist():    # distinct values: any sort is the stable one
        a, b = starts[run], ends[run]
        yield keys[user_of[order[a]]], bytes(data[offsets[a]:offsets[b] - 1]), int(b - a)


def _unsafe(ids: np.ndarray) -> bool:
    return any(isinstance(x, str) and any(c in x for c in _CSV_UNSAFE) for x in set(ids.tolist()))


def _flush(producer, delivered: _Delivered, total: int, timeout: float,
           held_until: Callable[[], object] | None = None) -> None:
    """Wait until every message is acknowledged; DeliveryError with the count delivered if not
    (what is still queued is dropped, not sent later). A held transaction is committed after
    that, once ``held_until()`` returns."""
    producer.flush(timeout)
    if delivered.ratings < total:
        producer.purge()
        producer.flush(0)
        why = delivered.error or f"no acknowledgement within {timeout:g} s"
        raise DeliveryError(f"{delivered.ratings:,} of {total:,} ratings delivered ({why})")
    if held_until:
        held_until()
        producer.commit_transaction(30)


def order_for_topic(ratings: Ratings) -> Ratings:
    """Time order, as devices would send them (ties in file order)."""
    return ratings.take(stable_order(ratings.timestamps))
