"""A fleet member across broker stalls and outages: every step's failure is survivable.

A member talks to the broker in more steps than a single consumer: the input poll, publishing a
delta, reading the model topic, claiming partitions and writing a snapshot. Each of them can time
out while the broker is stalled or gone (kafka-python raises ``KafkaTimeoutError`` after its
request timeout, 30 s, or ``TimeoutError`` from our own waits), and one that escaped ended the
member. The rule, per step: the failure is caught, logged once per outage (``outage`` on the
first failure of a step, ``recovered`` with its length and count when the step works again), the
health shows the broker lost, and the step is retried after BACKOFF seconds (the single
consumer's back-off after a failed poll). Nothing is lost by a retry: a step that failed changed
nothing the fleet relies on (a delta not yet acknowledged stays in flight, kafka-python retries it
up to its delivery timeout; only a delta that definitely failed fences the member, which then
rebuilds from the snapshot and the model topic).

>>> import logging
>>> outages = Outages()
>>> outages.failed("snapshot", TimeoutError("model topic: at 7, waiting for 9"), wait=False)
>>> outages.failed("snapshot", TimeoutError("again"), wait=False)   # counted, not logged again
>>> outages.failing["snapshot"][1]
2
>>> outages.ok("snapshot"), "snapshot" in outages.failing
(None, False)
"""

from __future__ import annotations

import logging
import time

from sketchrec.stream.health import log_event

BACKOFF = 0.5   # seconds before a failed step is tried again (as the single consumer's poll)


class Outages:
    """The steps failing now: step -> (monotonic time of the first failure, failures)."""

    def __init__(self, health=None):
        self.health = health
        self.failing: dict[str, tuple[float, int]] = {}

    def failed(self, step: str, exc: BaseException, wait: bool = True) -> None:
        """``step`` failed with ``exc``: logged if it is the outage's first failure of that
        step, the broker marked lost, then BACKOFF seconds of waiting (unless ``wait`` is off)."""
        error = f"{type(exc).__name__}: {exc}".splitlines()[0]
        since, count = self.failing.get(step, (time.monotonic(), 0))
        if not count:
            log_event("outage", logging.WARNING, step=step, error=error,
                      note="retrying; the member stays up")
        self.failing[step] = (since, count + 1)
        if self.health is not None:
            self.health.broker_lost(error)
        if wait:
            time.sleep(BACKOFF)

    def ok(self, step: str) -> None:
        """``step`` worked: the end of its outage, if it had one, is logged."""
        failed = self.failing.pop(step, None)
        if failed is not None:
            log_event("recovered", step=step, after_s=round(time.monotonic() - failed[0], 1),
                      failures=failed[1])
