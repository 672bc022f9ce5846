"""Publish a ratings file (any format `replay` reads) to a Kafka topic, like rating devices would.

Messages are keyed by user, so one user's ratings stay in order on one partition. ``batch=1``
sends one CSV rating per message; ``batch=N`` sends N ratings of one user-partition per message
(the batched form, for throughput). ``rate`` caps ratings per second. ``compression`` is the
codec of the record batches (none, gzip, snappy, lz4, zstd), as production producers set it.
The messages are built a chunk of runs at a time in compiled code (``sketchrec.csv_lines``) and
sent through librdkafka (``_client`` says why), whose queue is bounded: a file's text is never
held whole.
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
from sketchrec.csv_lines import csv_lines, group_order, text_or_ints
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
        "partitioner": "murmur2_random",
        # the queue of messages not yet acknowledged: 64 MB, not librdkafka's default of 1 GB
        # (most of a large file's text); a full queue makes the sender wait for room (``_send``)
        "queue.buffering.max.messages": 200_000, "queue.buffering.max.kbytes": 64 << 10,
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
    the ratings' CSV lines written in compiled passes (``sketchrec.csv_lines``), a user's lines
    cut into runs of ``batch``, and the runs sent in the order ``_paced`` sends them (a full run
    when its last rating comes, the rest at the end by where they began). The lines are written
    for CHUNK_RATINGS ratings of runs at a time, in sending order, so a file's text is never held
    whole. Ids holding a comma or a line break (JSON messages), or columns arrow cannot type,
    take ``_paced``."""
    import pyarrow as pa
    n = len(ratings)
    users = ratings.users
    try:
        if n == 0 or any(ids.dtype == object and _unsafe(ids) for ids in (users, ratings.items)):
            raise ValueError("a message of JSON")
        encoded = pa.array(users).dictionary_encode()    # compiled, for int and text ids alike
        for column in (users, ratings.items, ratings.timestamps):
            _check_text(column)   # before the first message: a chunk's text is then written
    except (ValueError, pa.ArrowException):
        yield from _paced(_rows(ratings, values), batch, None, 0.0)
        return
    user_of = encoded.indices.to_numpy(zero_copy_only=False)
    order = group_order(user_of, len(encoded.dictionary))   # each user's ratings together, in order
    starts = _run_starts(np.bincount(user_of), batch)
    ends = np.append(starts[1:], n)                      # a run: starts[j]..ends[j] of ``order``
    full = ends - starts == batch
    # _paced sends a full run at its last rating, the others after everything, by first rating
    sending = np.argsort(np.where(full, order[ends - 1], n + order[starts]))   # distinct: stable
    stars = pa.array(values).dictionary_encode()         # a rating's text: one :g per distinct value
    star_of = stars.indices.to_numpy(zero_copy_only=False)
    star_texts = [f"{r:g}" for r in stars.dictionary.to_pylist()]
    keys = [str(u).encode() for u in encoded.dictionary.to_pylist()]
    lengths = ends - starts
    for runs in _chunks(sending, lengths):
        counts = lengths[runs]
        first = np.cumsum(counts) - counts               # each run's first line in the chunk
        rows = order[np.repeat(starts[runs] - first, counts) + np.arange(int(counts.sum()))]
        offsets, data = csv_lines(np.arange(len(rows)), *(text_or_ints(col[rows]) for col in (
            users, ratings.items)), star_of[rows], star_texts, text_or_ints(ratings.timestamps[rows]))
        data, bounds = memoryview(data), offsets[np.append(first, len(rows))].tolist()
        for j, (user, count) in enumerate(zip(user_of[order[starts[runs]]].tolist(), counts.tolist())):
            yield keys[user], bytes(data[bounds[j]:bounds[j + 1] - 1]), count


def _run_starts(counts: np.ndarray, batch: int) -> np.ndarray:
    """Where each run of ``batch`` ratings of one user begins in the rows grouped by user (users
    of ``counts`` ratings each, in that order), computed per run, not per rating.

    >>> _run_starts(np.array([3, 0, 5]), 2).tolist()
    [0, 2, 3, 5, 7]
    """
    runs = -(-counts // batch)                           # each user's runs
    first = np.repeat(np.cumsum(counts) - counts, runs)  # its first row, for each of its runs
    return first + batch * (np.arange(int(runs.sum())) - np.repeat(np.cumsum(runs) - runs, runs))


CHUNK_RATINGS = 1 << 20   # ratings whose lines are written at once (a chunk of runs)


def _chunks(sending: np.ndarray, lengths: np.ndarray) -> Iterator[np.ndarray]:
    """The runs in sending order, cut into chunks of at most CHUNK_RATINGS ratings (a longer run
    alone)."""
    ends = np.cumsum(lengths[sending])
    at = 0
    while at < len(sending):
        stop = max(int(np.searchsorted(ends, (ends[at - 1] if at else 0) + CHUNK_RATINGS, "right")), at + 1)
        yield sending[at:stop]
        at = stop


def _check_text(column: np.ndarray) -> None:
    """ValueError (or arrow's error) unless ``text_or_ints`` writes any part of ``column``: a
    float column, ids of mixed types or a missing id (an object column is typed whole)."""
    import pyarrow as pa
    if column.dtype != object:
        text_or_ints(column[:1])
    elif pa.array(column).null_count:
        raise ValueError("a missing value has no CSV text")


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
