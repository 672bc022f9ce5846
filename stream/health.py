"""What /healthz and /stats say about the service's readiness, its broker and its checkpoints, and
the one-line structured log events the consumer writes.

``Health`` is written by the learning side (the Kafka loop, the warm-up, the checkpoints) and read
by the HTTP side; each field is one reference assignment, so no lock is needed. Ages are in
seconds, on the monotonic clock. Healthy means progressing: the model is ready, the loop polled
lately, a broker answered lately, the consumer's lag is not growing while nothing is learned,
and the last checkpoint attempt succeeded. A reader process adds the learner's heartbeat age
(``stream.serving.workers.reader``).

>>> h = Health(broker_lost_after=20.0, poll_stale_after=60.0)
>>> h.problems()
[]
>>> h.ready = False
>>> h.problems()
['model not ready (warming up)']
>>> h.ready = True; h.watch_broker(); h.broker_lost("no broker reachable", since=time.monotonic() - 30)
>>> h.problems()
['broker unreachable for 30 s (no broker reachable)']
>>> h.polled(True); h.checkpoint_error = "OSError: disk full"; h.problems()
['last checkpoint failed (OSError: disk full)']
>>> kv("checkpoint", name="ckpt-000000000001.skc", ratings=10)
'event=checkpoint name=ckpt-000000000001.skc ratings=10'
"""

from __future__ import annotations

import logging
import time

log = logging.getLogger("sketchrec.events")

# defaults: a lost broker or a stalled loop shows on /healthz within 10 s of happening
BROKER_LOST_AFTER = 5.0    # seconds without a broker connection
POLL_STALE_AFTER = 10.0    # seconds since the learning loop last polled
STALL_AFTER = 10.0         # seconds of messages waiting with none learned
SILENT_REST_S = 0.8        # a consumer's wait between polls while no broker answers (rest_if_silent)


def kv(event: str, **fields) -> str:
    """``event=NAME key=value ...``: one log line per event, easy to grep and to parse."""
    def text(v) -> str:
        s = f"{v:.3g}" if isinstance(v, float) else str(v)
        return f'"{s}"' if (" " in s or not s) else s
    return " ".join([f"event={event}"] + [f"{k}={text(v)}" for k, v in fields.items()])


def log_event(event: str, level: int = logging.INFO, **fields) -> None:
    """Log one event as one key=value line (see ``kv``)."""
    log.log(level, kv(event, **fields))


class Health:
    """Readiness of the model, state of the broker connection, age of the last poll.

    A service without a broker (``watch_broker`` never called) is judged on readiness alone."""

    def __init__(self, broker_lost_after: float = BROKER_LOST_AFTER, poll_stale_after: float = POLL_STALE_AFTER,
                 stall_after: float = STALL_AFTER):
        self.broker_lost_after, self.poll_stale_after = broker_lost_after, poll_stale_after
        self.stall_after = stall_after
        self.ready = True               # False while the model warms up (numba compiles)
        self.watching = False           # a broker is part of this service
        self.connected: bool | None = None
        self.lost_since: float | None = None
        self.last_error: str | None = None
        self.last_poll: float | None = None
        self.checkpoint_error: str | None = None  # the last checkpoint attempt's, if it failed
        self.inexact: str | None = None   # why a fleet replica is not the model topic's (Truncated)
        self.behind: int | None = None   # messages the consumer has not read yet (its lag), if known
        self.stalled_since: float | None = None   # messages waiting, none learned, since then
        self._progress: tuple[int, int] | None = None   # (ratings learned, lag) at the last report
        # asked at each /healthz (kafka.contact.broker_contact of the learner's client): a loop
        # blocked in a step (a flush, a snapshot) cannot report the hung broker it waits for
        self.probe = None

    def progress(self, learned: int, behind: int | None) -> None:
        """The learning loop's report after a poll: ratings learned so far and its lag (None:
        unknown). Messages waiting while no rating is learned and the lag does not shrink (poison
        set aside shrinks it) is a stall, shown after ``stall_after`` seconds."""
        last, self.behind = self._progress, behind
        if behind is None:
            return
        self._progress = (learned, behind)
        if last is None or behind == 0 or learned > last[0] or behind < last[1]:
            self.stalled_since = None
        elif self.stalled_since is None:
            self.stalled_since = time.monotonic()

    def watch_broker(self) -> None:
        self.watching, self.last_poll = True, time.monotonic()

    def held(self) -> None:
        """Learning is paused (over HTTP): messages may wait, that is no stall."""
        self._progress = self.stalled_since = None

    def polled(self, connected: bool, why: str = "no broker connection", since: float | None = None) -> None:
        """After a poll: whether a broker answers (``kafka.contact``); if not, ``why`` and since
        when (monotonic; default: now, or the outage's start if one is under way)."""
        self.last_poll = time.monotonic()
        if connected:
            self.connected, self.lost_since = True, None
        elif self.lost_since is None:   # an outage under way keeps its start and first reason
            self.broker_lost(why, since)

    def rest_if_silent(self, idle: bool, stop) -> None:
        """After an ``idle`` poll (nothing read) in an outage under way for over ``2 * SILENT_REST_S``
        (not a start-up's first connect): wait ``SILENT_REST_S`` or until ``stop`` is set.
        kafka-python's poll busy-loops on its unanswered requests for its whole timeout while no
        broker answers: a consumer polling on would spend a core on a paused broker.

        >>> class Stop:
        ...     waited = []
        ...     def wait(self, seconds): self.waited.append(seconds)
        >>> h = Health(); h.broker_lost("gone", since=time.monotonic() - 60)
        >>> h.rest_if_silent(True, Stop()); h.rest_if_silent(False, Stop()); Stop.waited
        [0.8]
        >>> Health().rest_if_silent(True, Stop()); Stop.waited   # a broker answering: no wait
        [0.8]
        >>> new = Health(); new.broker_lost("gone"); new.rest_if_silent(True, Stop()); Stop.waited
        [0.8]
        """
        lost = self.lost_since   # (the last example: an outage just begun, a start-up's connect)
        if idle and self.connected is False and lost is not None \
                and time.monotonic() - lost > 2 * SILENT_REST_S:
            stop.wait(SILENT_REST_S)

    def broker_lost(self, error: str, since: float | None = None) -> None:
        self.connected, self.last_error = False, error
        self.lost_since = since if since is not None else (self.lost_since or time.monotonic())


    def problems(self) -> list[str]:
        """Why the service is not healthy now (empty: healthy)."""
        now, out = time.monotonic(), []
        if not self.ready:
            out.append("model not ready (warming up)")
        lost_since, error = self.lost_since, self.last_error
        if self.watching and lost_since is None and self.probe is not None:
            contact = self.probe()
            if not contact.answering and contact.since is not None:
                lost_since, error = contact.since, contact.why
        if self.watching and lost_since is not None and now - lost_since > self.broker_lost_after:
            out.append(f"broker unreachable for {now - lost_since:.0f} s ({error})")
        if self.watching and self.last_poll is not None and now - self.last_poll > self.poll_stale_after:
            out.append(f"last poll {now - self.last_poll:.0f} s ago")
        if self.stalled_since is not None and now - self.stalled_since > self.stall_after:
            out.append(f"no progress for {now - self.stalled_since:.0f} s while {self.behind} "
                       "messages wait")
        if self.checkpoint_error is not None:
            out.append(f"last checkpoint failed ({self.checkpoint_error})")
        if self.inexact is not None:
            out.append(f"replica not exact: {self.inexact}")
        return out

    def broker(self) -> dict | None:
        """The broker's status for /stats (None: no broker)."""
        if not self.watching:
            return None
        now = time.monotonic()
        return {"connected": self.connected, "last_poll_age_s": _age(now, self.last_poll),
                "unreachable_for_s": _age(now, self.lost_since), "last_error": self.last_error,
                "messages_behind": self.behind}


def _age(now: float, then: float | None) -> float | None:
    return None if then is None else round(now - then, 3)


def configure_logging(level: int = logging.INFO) -> None:
    """One line per record on stderr, ``key=value`` after the time and level (idempotent)."""
    root = logging.getLogger("sketchrec")
    if not root.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("ts=%(asctime)s level=%(levelname)s %(message)s"))
        root.addHandler(handler)
        root.setLevel(level)
