"""Reading the model topic (``model_topic``): a replica's reader that applies the accepted deltas
in the topic's order, each record's outcome depending on the record sequence only, never on
where a fetch ended."""

from __future__ import annotations

import json
import logging
import time

from sketchrec.stream.fleet.model_topic import (MAX_MESSAGE_BYTES, Fenced, FleetState, Truncated,
                                                decode_meta)
from sketchrec.stream.fleet.views import Diverged
from sketchrec.stream.health import log_event

# a hole in the model topic is read past only once it has lasted GAP_PATIENCE_S and GAP_READS
# reads after that still lacked it (``ModelFeed._skipped``)
GAP_PATIENCE_S, GAP_READS = 10.0, 3
_now = time.monotonic   # (a test's clock)


class ModelFeed:
    """Reads the model topic from ``state.position`` and applies accepted deltas through
    ``apply(blob)`` (``DeltaTracker.apply``); this member's own deltas are already in its replica
    and are only settled. ``poll()`` takes what has arrived; ``catch_up()`` reads to the end.
    ``native``: through librdkafka (``feed_reader.NativeReader``, a learning member: a poll is one
    C call), else kafka-python (``consumer`` is then the client a health probe reads). Every
    other member's header's view is judged against this replica's (``views``): a replica that
    every member heard from lately contradicts raises ``Diverged`` (a ``Fenced``) from a poll."""

    def __init__(self, bootstrap: str, topic: str, state: FleetState, apply, on_origin=None,
                 native: bool = False):
        from sketchrec.stream.fleet.feed_reader import NativeReader, PythonReader
        self.state, self.apply = state, apply
        self.on_origin = on_origin   # called after settling a delta that names its ratings' origin
        reader = NativeReader if native else PythonReader
        self.topic = topic
        self.reader = reader(bootstrap, topic, state.position, MAX_MESSAGE_BYTES)
        self.consumer = self.reader.consumer
        self.bytes_read = 0
        # a hole met at ``gap_at`` (the position a record past it was handed over at): since when,
        # and how many reads after GAP_PATIENCE_S still lacked it (_skipped)
        self.gap_at: int | None = None
        self.gap_since, self.gap_reads = 0.0, 0

    def poll(self, timeout_ms: int = 0) -> int:
        """Apply what has arrived; the number of messages read. Each record's outcome depends on
        the records before it only, never on where a fetch ended: a message that is not a good
        delta of this model is refused (``_take``), and whatever else a poll raises (the broker's
        errors, or an error not of the record's making while taking one) leaves the reader at
        ``state.position``, the message after the last one taken, so a retry skips nothing. A
        position the topic no longer holds raises ``Truncated`` (never read past: the readers
        refuse to move to the end). A record handed over past one not yet read sends the reader
        back for it (``_skipped``: at once the first time in a poll, then at the next polls,
        taking nothing past it meanwhile); one handed over again is passed over."""
        from sketchrec.stream.fleet.feed_reader import OutOfRange
        n, again, retried = 0, True, False
        try:
            while again:   # again at once from a record the reader skipped (_skipped)
                again = False
                for msg in self.reader.poll(timeout_ms):
                    if msg.offset < self.state.position:   # handed over again: taken already
                        continue
                    if msg.offset > self.state.position and self._skipped(msg.offset):
                        again, retried = not retried, True
                        break
                    self._take(msg)
                    n += 1
        except OutOfRange:
            self.reader.seek(self.state.position)
            raise Truncated(self.topic, self.state.position,
                            self.reader.beginning(self.topic, 0)) from None
        except Exception:
            # the reader has moved past every record the fetch handed over, taken or not
            self.reader.seek(self.state.position)
            raise
        return n

    def _skipped(self, offset: int) -> bool:
        """Whether the reader handed over a record past ``state.position`` with the ones between
        missing, and is sent back to read them. The model topic holds no gap of its own (one
        partition, idempotent producers, no transactions), but a broker may hand over the records
        after one whose write it has not finished (Tansu moves a partition's end before it stores
        the batch, so members publishing at once can see the later batch first). A replica that
        took the record after the missing one would judge every later delta on another coverage
        than the others, for good, and hand that on in its snapshots. So a hole is read past only
        once it has lasted ``GAP_PATIENCE_S`` and ``GAP_READS`` reads since (a write the broker
        lost after moving the end)."""
        position, now = self.state.position, _now()
        if self.gap_at != position:
            self.gap_at, self.gap_since, self.gap_reads = position, now, 0
        elif now - self.gap_since >= GAP_PATIENCE_S:
            self.gap_reads += 1
            if self.gap_reads >= GAP_READS:
                log_event("model_topic_gap", logging.WARNING, position=position, offset=offset,
                          waited_s=round(now - self.gap_since, 1),
                          note="no record between them for that long: read past")
                return False
        self.reader.seek(position)
        return True

    def catch_up(self, timeout: float = 60.0) -> None:
        """Read until the end of the topic as it is now."""
        self.read_through(self.reader.end_offset() - 1, timeout)

    def beginning_offsets(self, tps) -> dict:
        """The first offset of each of ``tps`` (kafka-python ``TopicPartition`` objects of the input
        topic), asked through this reader's own client (not the input consumer, whose rebalance
        callback asks)."""
        return {tp: self.reader.beginning(tp.topic, tp.partition) for tp in tps}

    def read_through(self, offset: int, timeout: float = 60.0) -> None:
        """Read until the message at ``offset`` is read (e.g. one this member has just written)."""
        deadline = time.monotonic() + timeout
        while self.state.position <= offset:
            if time.monotonic() > deadline:
                raise TimeoutError(f"model topic: at {self.state.position}, waiting for {offset}")
            self.poll(200)

    def _take(self, msg) -> None:
        try:
            meta = decode_meta(msg.headers)
        except ValueError as exc:
            self._refuse(msg, {}, str(exc))
            return
        if meta is None or self.state.duplicate(meta):  # not a delta, or a retry's copy
            self.state.passed(msg.offset, "n")
            return
        mine = meta.get("member") == self.state.member
        diverged = None if mine else self.state.views.judge(meta.get("member"), meta.get("view"), msg.offset)
        if diverged is not None:
            raise Diverged(diverged)
        if not self.state.accepts(meta):
            self._refuse(msg, meta, "its offsets do not continue its partitions' coverage by their owner")
            if mine:
                raise Fenced(f"this member's delta at model offset {msg.offset} covers offsets "
                             "another member had already covered; its replica must be rebuilt")
            return
        if not mine and msg.value:
            try:
                self.apply(msg.value)
            except ValueError as exc:
                # not a delta of this model, or applied already: the same verdict at every replica
                # (they share the first snapshot's model). A member's own delta is its model's,
                # so it is settled unread (it is in its replica already)
                self._refuse(msg, meta, str(exc))
                return
        self.bytes_read += len(msg.value or b"")
        self.state.settle(meta, msg.offset)
        if meta.get("origin") and self.on_origin is not None:
            self.on_origin()

    def _refuse(self, msg, meta: dict, why: str) -> None:
        """A message that counts nowhere: one line, counted (``state.refuse``), read past."""
        self.state.refuse(meta)
        self.state.passed(msg.offset, "r")
        log_event("delta_refused", logging.WARNING, offset=msg.offset, member=meta.get("member"),
                  covers=json.dumps(meta.get("covers"), separators=(",", ":")), why=why)

    def close(self) -> None:
        self.reader.close()
