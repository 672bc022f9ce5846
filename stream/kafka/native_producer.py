"""A producer of few large messages in order (a fleet's deltas, claims and snapshot chunks) through
librdkafka, behind the small part of kafka-python's ``KafkaProducer`` interface its callers use:
``send`` returning a future (``is_done``, ``failed()``, ``exception``, ``get(timeout)``),
``flush(timeout)`` and ``close(timeout)``.

Why: kafka-python builds and sends each record batch in Python on its own network thread; a fleet
member publishes a delta every few hundred ratings, and that thread cost it as much CPU as a tenth of
its learning. librdkafka queues a message in one C call and sends, batches and retries in C threads.
Its delivery reports run only inside ``poll`` or ``flush``: a future here polls (without waiting)
when asked whether it is done, so a caller that only checks ``is_done`` sees deliveries as
kafka-python's did.

>>> producer = NativeProducer("127.0.0.1:9092", max_bytes=1 << 20)   # doctest: +SKIP
>>> producer.send("t.model", value=b"delta", key=b"m1", partition=0).get(timeout=10).offset  # doctest: +SKIP
0
"""

from __future__ import annotations

import logging
import time
from typing import NamedTuple

from kafka.errors import KafkaError, KafkaTimeoutError

log = logging.getLogger(__name__)


class Delivered(NamedTuple):
    """Where the broker stored a message (as kafka-python's ``RecordMetadata`` names it)."""

    topic: str
    partition: int
    offset: int


class DeliveryFailed(KafkaError):
    """The broker did not take the message (librdkafka's error, in one line)."""


class Pending:
    """The future of one message ``NativeProducer.send`` queued."""

    def __init__(self, producer: "NativeProducer"):
        self._producer, self.value, self.exception = producer, None, None
        self._done = False

    def _report(self, err, msg) -> None:   # librdkafka's delivery report (in poll or flush)
        if err is not None:
            self.exception = DeliveryFailed(f"{err.name()}: {err.str()}")
        else:
            self.value = Delivered(msg.topic(), msg.partition(), msg.offset())
        self._done = True

    @property
    def is_done(self) -> bool:
        if not self._done:
            self._producer.client.poll(0)
        return self._done

    def failed(self) -> bool:
        return self.is_done and self.exception is not None

    def succeeded(self) -> bool:
        return self.is_done and self.exception is None

    def get(self, timeout: float | None = None) -> Delivered:
        """Where the message was stored, once the broker took it; its error if it did not;
        ``KafkaTimeoutError`` if neither happened within ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._done:
            left = 0.1 if deadline is None else min(0.1, deadline - time.monotonic())
            if left <= 0:
                raise KafkaTimeoutError(f"no delivery report within {timeout:g} s")
            self._producer.client.poll(left)
        if self.exception is not None:
            raise self.exception
        return self.value


class NativeProducer:
    """librdkafka's producer, idempotent (messages reach a partition in the order sent, retries
    included), acknowledged by every replica, sending at once (no linger: one message is a whole
    delta) and one message per record batch, with kafka-python's delivery timeout (2 minutes).

    Parameters
    ----------
    bootstrap : the broker.
    max_bytes : the largest message (the model topic's ``max.message.bytes``).

    Examples
    --------
    See the module docstring.
    """

    def __init__(self, bootstrap: str, max_bytes: int):
        import confluent_kafka
        self.client = confluent_kafka.Producer({
            "bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
            "linger.ms": 0, "message.max.bytes": max_bytes, "message.timeout.ms": 120_000,
            # one message per record batch: a delta is large (nothing to gain from batching), and
            # a broker that ends a batch's offsets at its first record (Tansu's end offsets) would
            # hide the rest of a batch from a replica reading "to the end"
            "batch.num.messages": 1,
            "logger": log,   # its connection errors through logging, not raw stderr
        })

    def send(self, topic: str, value: bytes | None = None, key: bytes | None = None,
             partition: int | None = None, headers: list | None = None) -> Pending:
        """Queue one message; its future (``Pending``)."""
        pending = Pending(self)
        kw = {} if partition is None else {"partition": partition}
        self.client.produce(topic, value=value, key=key, headers=headers or None,
                            on_delivery=pending._report, **kw)
        self.client.poll(0)   # reports of earlier messages, and the send started
        return pending

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every queued message is delivered or failed (its future says which);
        ``KafkaTimeoutError`` if some are still queued after ``timeout`` seconds."""
        left = self.client.flush(-1 if timeout is None else timeout)
        if left:
            raise KafkaTimeoutError(f"{left} message(s) not delivered within {timeout:g} s")

    def close(self, timeout: float | None = None) -> None:
        """Deliver what is queued (up to ``timeout``); the client goes with the object."""
        try:
            self.flush(timeout)
        except KafkaTimeoutError as exc:
            log.warning("closing the producer with messages undelivered: %s", exc)
