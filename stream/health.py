"""What /healthz and /stats say about the service's readiness, its broker and its checkpoints, and
the one-line structured log events the consumer writes.

``Health`` is written by the learning side (the Kafka loop, the warm-up) and read by the HTTP side;
each field is one reference assignment, so no lock is needed. Ages are in seconds, on the
monotonic clock.

>>> h = Health(broker_lost_after=20.0, poll_stale_after=60.0)
>>> h.problems()
[]
>>> h.ready = False
>>> h.problems()
['model not ready (warming up)']
>>> h.ready = True; h.watch_broker(); h.broker_lost("no broker reachable", since=time.monotonic() - 30)
>>> h.problems()
['broker unreachable for 30 s (no broker reachable)']
>>> kv("checkpoint", name="ckpt-000000000001.skc", ratings=10)
'event=checkpoint name=ckpt-000000000001.skc ratings=10'
"""

from __future__ import annotations

import logging
import time

log = logging.getLogger("sketchrec.events")


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

    def __init__(self, broker_lost_after: float = 20.0, poll_stale_after: float = 60.0):
        self.broker_lost_after, self.poll_stale_after = broker_lost_after, poll_stale_after
        self.ready = True               # False while the model warms up (numba compiles)
        self.watching = False           # a broker is part of this service
        self.connected: bool | None = None
        self.lost_since: float | None = None
        self.last_error: str | None = None
        self.last_poll: float | None = None
        self.checkpoint_error: str | None = None  # the last checkpoint attempt's, if it failed

    def watch_broker(self) -> None:
        self.watching, self.last_poll = True, time.monotonic()

    def polled(self, connected: bool) -> None:
        self.last_poll = time.monotonic()
        if connected:
            self.connected, self.lost_since = True, None
        elif self.lost_since is None:
            self.broker_lost("no broker connection")

    def broker_lost(self, error: str, since: float | None = None) -> None:
        self.connected, self.last_error = False, error
        self.lost_since = since if since is not None else (self.lost_since or time.monotonic())


    def problems(self) -> list[str]:
        """Why the service is not healthy now (empty: healthy)."""
        now, out = time.monotonic(), []
        if not self.ready:
            out.append("model not ready (warming up)")
        if self.watching and self.lost_since is not None and now - self.lost_since > self.broker_lost_after:
            out.append(f"broker unreachable for {now - self.lost_since:.0f} s ({self.last_error})")
        if self.watching and self.last_poll is not None and now - self.last_poll > self.poll_stale_after:
            out.append(f"last poll {now - self.last_poll:.0f} s ago")
        return out

    def broker(self) -> dict | None:
        """The broker's status for /stats (None: no broker)."""
        if not self.watching:
            return None
        now = time.monotonic()
        return {"connected": self.connected, "last_poll_age_s": _age(now, self.last_poll),
                "unreachable_for_s": _age(now, self.lost_since), "last_error": self.last_error}


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
