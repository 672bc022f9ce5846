"""Publish a ratings file (any format `replay` reads) to a Kafka topic, like rating devices would.

Messages are keyed by user, so one user's ratings stay in order on one partition. ``batch=1``
sends one CSV rating per message; ``batch=N`` sends N ratings of one user-partition per message
(the batched form, for throughput). ``rate`` caps ratings per second. ``compression`` is the
codec of the record batches (none, gzip, snappy, lz4, zstd), as production producers set it.
"""

from __future__ import annotations

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

    def track(self, future, n_ratings: int) -> None:
        future.add_callback(lambda _: self._ok(n_ratings))
        future.add_errback(self._failed)

    def _ok(self, n: int) -> None:
        self.ratings += n

    def _failed(self, exc) -> None:
        self.error = self.error or exc


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
    from kafka import KafkaProducer
    if batch < 1:
        raise ValueError("batch must be at least 1")
    if compression not in COMPRESSIONS:
        raise ValueError(f"compression must be one of {', '.join(COMPRESSIONS)}")
    ensure_topic(bootstrap, topic, partitions)
    producer = KafkaProducer(**kafka_config(bootstrap), linger_ms=20, batch_size=1 << 20, acks="all",
                             max_request_size=16 << 20,
                             compression_type=None if compression == "none" else compression,
                             **({"transactional_id": f"held-{topic}"} if held_until else {}))
    if held_until:
        producer.init_transactions()
        producer.begin_transaction()
    t0 = time.perf_counter()
    sent_messages = 0
    values = ratings.ratings if randomiser is None else randomiser.perturb(ratings.ratings)
    headers = None if randomiser is None else [(HEADER, randomiser.header())]
    delivered = _Delivered()
    messages = (_messages(ratings, values, batch) if rate is None
                else _paced(_rows(ratings, values), batch, rate, t0))
    for key, value, n_ratings in messages:
        delivered.track(producer.send(topic, key=key, value=value, headers=headers), n_ratings)
        sent_messages += 1
    total = len(ratings)
    acknowledged: list[float] = []   # when the last message was (a held commit waits after it)
    _flush(producer, delivered, total, timeout,
           held_until and (lambda: (acknowledged.append(time.perf_counter()), held_until())))
    seconds = (acknowledged[0] if acknowledged else time.perf_counter()) - t0
    return {"topic": topic, "ratings": total, "messages": sent_messages, "compression": compression,
            "seconds": seconds,
            "ratings_per_s": total / max(seconds, 1e-9),
            **({"ldp": randomiser.header().decode()} if randomiser is not None else {})}


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
    each rating's CSV line formatted by arrow, a user's lines cut into runs of ``batch``, and the
    runs sent in the order ``_paced`` sends them (a full run when its last rating comes, the rest
    at the end by where they began). Ids holding a comma or a line break (JSON messages) take
    ``_paced``."""
    import pyarrow as pa
    import pyarrow.compute as pc
    n = len(ratings)
    users = ratings.users
    if n == 0 or any(users.dtype == object and _unsafe(ids) for ids in (users, ratings.items)):
        yield from _paced(_rows(ratings, values), batch, None, 0.0)
        return
    encoded = pa.array(users).dictionary_encode()        # compiled, for int and text ids alike
    user_of = encoded.indices.to_numpy(zero_copy_only=False)
    order = np.argsort(user_of, kind="stable")          # each user's ratings together, in order
    counts = np.bincount(user_of)
    rank = np.arange(n) - np.repeat(np.cumsum(counts) - counts, counts)   # within its user
    starts = np.flatnonzero(rank % batch == 0)                           # a run begins
    ends = np.append(starts[1:], n)
    full = ends - starts == batch
    # _paced sends a full run at its last rating, the others after everything, by first rating
    sent_at = np.where(full, order[ends - 1], n + order[starts])
    stars, star_of = np.unique(values[order], return_inverse=True)
    wide = pa.large_string()   # 64-bit offsets: a file's text may pass 2 GB
    text = [pa.array(col[order]).cast(wide) for col in (users, ratings.items)]
    text += [pa.array([f"{r:g}" for r in stars.tolist()], wide).take(pa.array(star_of)),
             pa.array(ratings.timestamps[order]).cast(wide), pa.scalar("\n", wide)]
    lines = pc.binary_replace_slice(pc.binary_join_element_wise(*text, pa.scalar(",", wide)), -2, -1, "")
    offsets = np.frombuffer(lines.buffers()[1], np.int64, len(lines) + 1, lines.offset * 8)
    data = memoryview(lines.buffers()[2])
    keys = [str(u).encode() for u in encoded.dictionary.to_pylist()]
    for run in np.argsort(sent_at, kind="stable").tolist():
        a, b = starts[run], ends[run]
        yield keys[user_of[order[a]]], bytes(data[offsets[a]:offsets[b] - 1]), int(b - a)


def _unsafe(ids: np.ndarray) -> bool:
    return any(isinstance(x, str) and any(c in x for c in _CSV_UNSAFE) for x in set(ids.tolist()))


def _flush(producer, delivered: _Delivered, total: int, timeout: float,
           held_until: Callable[[], object] | None = None) -> None:
    """Wait until every message is acknowledged; DeliveryError with the count delivered if not.
    A held transaction is committed after that, once ``held_until()`` returns."""
    try:
        producer.flush(timeout=timeout)
    except KafkaError:
        pass  # judged by the count below
    if delivered.ratings < total:
        producer.close(timeout=5)
        why = delivered.error or f"no acknowledgement within {timeout:g} s"
        raise DeliveryError(f"{delivered.ratings:,} of {total:,} ratings delivered ({why})")
    if held_until:
        held_until()
        producer.commit_transaction()
    producer.close(timeout=5)


def order_for_topic(ratings: Ratings) -> Ratings:
    """Time order, as devices would send them (ties in file order)."""
    return ratings.take(stable_order(ratings.timestamps))
