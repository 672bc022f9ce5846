"""Where the consumer stands in each partition, and when the next checkpoint is due.

One object keeps both, as Quix Streams' ``BaseCheckpoint`` owns its partition offsets and
``expired()``: ``KafkaLearner`` stores each learned batch here, asks ``expired()`` after every poll,
and calls ``checkpointed()`` once a checkpoint is durable. The offsets dict itself is
``LearningService.offsets`` (shared, updated in place), because the service writes it into every
checkpoint and reports it on /stats; its keys are partitions as text (JSON object keys).

>>> book = OffsetBook({}, every=3, seconds=60.0)
>>> book.store({0: 10, 1: 4}, handled=2)
>>> book.expired(), book.offsets, book.position(0), book.position(2)
(False, {'0': 10, '1': 4}, 10, None)
>>> book.store({0: 12}, handled=1)
>>> book.expired(), book.to_commit({0}), book.pending
(True, {0: 12}, 3)
>>> book.checkpointed()
>>> book.expired()
False
"""

from __future__ import annotations

import time


class OffsetBook:
    """Next offsets to consume per partition, and the checkpoint cadence: a checkpoint is due after
    ``every`` ratings (learned or set aside), or ``seconds`` after the last one if any arrived."""

    def __init__(self, offsets: dict[str, int], every: int = 50_000, seconds: float = 30.0):
        self.offsets = offsets
        self.every, self.seconds = every, seconds
        self._pending = 0                 # ratings handled since the last checkpoint
        self._last = time.monotonic()     # when the last checkpoint was made durable
        self._retry_at = 0.0              # after a failed checkpoint: not due before this

    @property
    def pending(self) -> int:
        """Ratings handled (learned or set aside) since the last checkpoint."""
        return self._pending

    def position(self, partition: int) -> int | None:
        """The next offset to consume in ``partition``, or None if it was never consumed."""
        return self.offsets.get(str(partition))

    def store(self, consumed: dict[int, int], handled: int) -> None:
        """A batch is learned: ``consumed`` maps partitions to their next offset; ``handled`` is
        how many ratings the batch held (learned or set aside)."""
        self.offsets.update({str(p): offset for p, offset in consumed.items()})
        self._pending += handled

    def expired(self) -> bool:
        """Is a checkpoint due?"""
        if time.monotonic() < self._retry_at:
            return False
        return self._pending >= self.every or (
            self._pending > 0 and time.monotonic() - self._last >= self.seconds)

    def to_commit(self, assigned: set[int]) -> dict[int, int]:
        """The offsets of the partitions this consumer holds, to commit to its group."""
        return {int(p): offset for p, offset in self.offsets.items() if int(p) in assigned}

    def checkpointed(self) -> None:
        """A checkpoint is durable: the count and the clock start again."""
        self._pending, self._last, self._retry_at = 0, time.monotonic(), 0.0

    def retry_later(self) -> None:
        """A checkpoint failed: the next try is one cadence interval (``seconds``) from now."""
        self._retry_at = time.monotonic() + self.seconds
