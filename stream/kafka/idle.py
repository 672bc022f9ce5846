"""When an idle consumer may end (``KafkaLearner.run(idle_exit=...)``): its share of the topic is
settled and read to its end.

A consumer without a group holds the whole topic. A member of a group holds a share the group
hands it, and the share moves: while the group rebalances it is being taken away, and a member
killed while it joined still holds the rest of the topic until the group evicts it (one session),
after which the rebalance hands that rest to the members left. A member that ended as soon as its
first share was read would leave the rest to a later run.
"""

from __future__ import annotations

import time

from sketchrec.stream.health import log_event

# seconds an idle consumer still waits for assigned partitions that have messages it has not read,
# or for a broker that cannot say where they end (then it exits anyway, the lag logged)
LAG_PATIENCE = 30.0
# the group session: a member that stops heartbeating is evicted after it
SESSION_MS, HEARTBEAT_MS = 6000, 1000
# an idle member holding part of the topic takes it as its share only after holding it this long
GROUP_SETTLE = (SESSION_MS + 2 * HEARTBEAT_MS) / 1000


class IdleShare:
    """What an idle consumer knows of its share: told of the group's rebalances by the consumer's
    listener (``revoked``, ``assigned``), asked whether the share is ``settled`` and ``drained``.

    Parameters
    ----------
    consumer: the kafka-python consumer.
    topic: the topic it reads.
    group: its group (None: it was assigned the whole topic).

    Examples
    --------
    >>> share = IdleShare(consumer=None, topic="ratings", group=None)
    >>> share.settled(), share.joining()   # no group: the whole topic is its share
    (True, False)
    """

    def __init__(self, consumer, topic: str, group: str | None):
        self.consumer, self.topic, self.group = consumer, topic, group
        # a member's share since when (None: never handed one yet); without a group, from the start
        self.rebalancing, self.assigned_at = False, None if group else time.monotonic()
        self.lag_logged = False

    def revoked(self) -> None:
        """The group takes partitions away (or has lost this member): a rebalance is under way."""
        self.rebalancing = True

    def assigned(self) -> None:
        """The group has handed this member its share."""
        self.rebalancing, self.assigned_at = False, time.monotonic()

    def joining(self) -> bool:
        """Is this member waiting for the group to hand it a share (its first, or after a
        rebalance)? Never without a group. Joining is not idleness."""
        return bool(self.group) and (self.assigned_at is None or self.rebalancing)

    def settled(self) -> bool:
        """May the assignment be taken as this consumer's share of the topic? Not while it joins,
        nor while a member holds part of the topic (or none of it: more members than partitions)
        for less than GROUP_SETTLE."""
        if not self.group:
            return True
        if self.joining():
            return False
        held = len(self.consumer.assignment())
        total = len(self.consumer.partitions_for_topic(self.topic) or ())
        return held >= total or time.monotonic() - self.assigned_at >= GROUP_SETTLE

    def drained(self) -> bool:
        """Has every assigned partition been read to its end (the last stable offset: the consumer
        reads committed messages only)? False when the broker cannot say: a broker too loaded to
        answer in time is the case a stalled fetch is too, and ending there would leave the rest
        to a later run; an unreachable broker's consumer still exits, after LAG_PATIENCE. A lag is
        logged once."""
        tps = list(self.consumer.assignment())
        if not tps:   # a member handed no partition has nothing to read
            return True
        try:
            ends = self.consumer.end_offsets(tps, timeout_ms=2_000)
            behind = {tp.partition: ends[tp] - self.consumer.position(tp, timeout_ms=2_000)
                      for tp in tps}
        except Exception as exc:  # noqa: BLE001 - any failure to ask: not known to be drained
            if not self.lag_logged:
                log_event("idle_lag", messages_behind="unknown", why=f"{type(exc).__name__}: {exc}")
            self.lag_logged = True
            return False
        behind = {p: n for p, n in sorted(behind.items()) if n > 0}
        if behind and not self.lag_logged:
            log_event("idle_lag", messages_behind=behind)
        self.lag_logged = bool(behind)
        return not behind
