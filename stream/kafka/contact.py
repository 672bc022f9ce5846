"""Is the broker answering, and how far behind is a consumer: read from what a kafka-python client
already knows, without a request of its own (a probe that asked the broker would itself wait
for a hung one).

A connection's TCP socket stays up when the broker process hangs (SIGSTOP, a stalled disk):
kafka-python notices only when a request times out (``request_timeout_ms``, 30 s) and a
reconnection's first request times out again, so "connected" alone says nothing for about a
minute. Contact is therefore judged by answers: a request sent more than ``SILENT_AFTER``
seconds ago with nothing read from any broker since is a broker that does not answer. Requests
the broker holds by design are not counted: a group's JoinGroup and SyncGroup (the broker answers
them once the group has formed: while its leader is dead, up to a session later), and any whose
own deadline is long.
The lag comes from what each fetch response carries and the consumer's position: the high
watermark, or for a ``read_committed`` consumer the last stable offset below it when a transaction
is open (its messages cannot be read before it ends: waiting for them is no stall), which
kafka-python reads and drops; ``track_stable_offsets`` keeps it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from sketchrec.stream.kafka import internals

SILENT_AFTER = 3.0        # seconds an ordinary request may wait before the broker counts as silent
LONG_REQUEST_S = 60.0     # requests allowed longer than this do not count
GROUP_WAITS = frozenset({11, 14})   # JoinGroup, SyncGroup: held by the broker while the group forms


@dataclass(frozen=True)
class Contact:
    """The broker's state as one client sees it: ``answering``; if not, ``since`` (monotonic
    seconds: the last answer, or the unanswered request) and ``why``."""

    answering: bool
    since: float | None = None
    why: str = ""


def broker_contact(client_owner, silent_after: float = SILENT_AFTER, now: float | None = None) -> Contact:
    """The contact of a ``KafkaConsumer`` or ``KafkaProducer`` (anything with ``_client``) with
    its brokers. Unknown internals (another kafka-python: ``kafka.internals``) count as
    answering: no false alarm.

    >>> from types import SimpleNamespace as NS
    >>> fetch = NS(correlation_id=1, request_api_key=1)
    >>> conn = NS(connected=True, in_flight_requests=[(1, None, 90.0, 120.0, None)],
    ...           parser=NS(in_flight_requests=[fetch]), transport=NS(last_read=89.0))
    >>> consumer = NS(_client=NS(_manager=NS(_conns={0: conn})))
    >>> broker_contact(consumer, now=92.0).answering    # asked 2 s ago: still waiting
    True
    >>> broker_contact(consumer, now=95.0)
    Contact(answering=False, since=90.0, why='broker not answering (a request unanswered for 5 s)')
    >>> fetch.request_api_key = 14   # a SyncGroup the broker holds: a wait, not silence
    >>> broker_contact(consumer, now=95.0).answering
    True
    """
    now = time.monotonic() if now is None else now
    try:
        conns = internals.connections(client_owner)
        if conns is None:
            return Contact(True)
        conns = [c for c in conns if c.connected]
        if not conns:
            return Contact(False, None, "no broker connection")
        last_read = max(c.transport.last_read for c in conns)
        asked = [sent for c in conns for key, sent, deadline in internals.unanswered(c)
                 if key not in GROUP_WAITS and deadline - sent <= LONG_REQUEST_S]
    except (AttributeError, RuntimeError, TypeError, ValueError):
        # RuntimeError: the IO thread changed a deque while it was copied; judge at the next poll
        return Contact(True)
    oldest = min(asked, default=None)
    if oldest is not None and now - oldest > silent_after and now - last_read > silent_after:
        since = max(oldest, last_read)
        return Contact(False, since, f"broker not answering (a request unanswered for {now - oldest:.0f} s)")
    return Contact(True)


def track_stable_offsets(consumer) -> bool:
    """Keep each partition's last stable offset from every fetch response of ``consumer``
    (``messages_behind`` reads it). False, the consumer untouched, when its fetcher is not the kind
    this was written against (``kafka.internals``): the lag then counts open transactions' messages."""
    return internals.track_stable_offsets(consumer)


def messages_behind(consumer) -> int | None:
    """Messages the consumer's assigned partitions hold beyond its position that it can read now:
    up to the high watermark of the last fetch responses, or the last stable offset when it is
    lower (an open transaction; ``track_stable_offsets``). None: no partition's is known yet.
    Nothing is asked of the broker.

    >>> from types import SimpleNamespace as NS
    >>> state = {"a": NS(highwater=120, position=NS(offset=100)), "b": NS(highwater=None, position=None)}
    >>> messages_behind(NS(_subscription=NS(assignment=state)))
    20
    >>> open_transaction = NS(sketchrec_stable={"a": 100})   # offsets 100-119: not committed yet
    >>> messages_behind(NS(_subscription=NS(assignment=state), _fetcher=open_transaction))
    0
    """
    try:
        stable, states = internals.stable_offsets(consumer), internals.assignment(consumer)
        if states is None:
            return None
        known = [min(s.highwater, stable.get(tp, s.highwater)) - s.position.offset for tp, s in states
                 if s.highwater is not None and s.position is not None]
    except (AttributeError, RuntimeError, TypeError):
        return None
    return max(0, sum(known)) if known else None
