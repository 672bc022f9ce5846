"""Topic identity: is the input topic the one the checkpoint's offsets were taken on?

A topic deleted and created again under the same name starts its offsets at 0 again. A consumer
that seeks to its checkpoint's offsets would then silently skip the new topic's first messages
(as many as the old topic had), or wait past its end for messages that come later. Two signs tell
a new topic: its topic id (Kafka's UUID, from the metadata: kept in the checkpoint beside the
offsets) is not the checkpoint's, or a checkpointed offset lies beyond the partition's log end.
Either is logged; then the topic is consumed from its start (``restart``, the default: the model
keeps what it learned, the new topic's ratings are new ratings) or the consumer refuses to start
with one line (``refuse``), per ``consume --on-new-topic``.

>>> stale("b", "a", {"0": 10}, {0: 50}), stale("a", "a", {"0": 10}, {0: 10})
('its topic id is b, the checkpoint was taken on a', None)
>>> stale("b", None, {"0": 10}, {0: 5}), stale("b", None, {"0": 10}, {0: 9})
('the offset of partition 0 is beyond its end (10 > 5)', None)
"""

from __future__ import annotations

import logging

from sketchrec.stream.health import log_event
from sketchrec.stream.kafka import internals

POLICIES = ("restart", "refuse")
# the end offset some brokers report (Tansu, read_committed) can lag the offset after the last
# message by one: a checkpoint at the very end of the same topic is not a new topic
SLACK = 1


class NewTopic(RuntimeError):
    """The input topic is not the one the checkpoint knows, and the policy is to refuse."""


def stale(topic_id: str | None, known_id: str | None, offsets: dict, ends: dict) -> str | None:
    """Why the checkpoint's ``offsets`` (partition text -> offset) do not belong to the topic now
    on the broker (``topic_id``, and log ``ends`` per partition), or None when they do. The ids
    decide when both are known; otherwise (a checkpoint written before ids were kept, a broker
    without them) an offset beyond the end by more than SLACK does."""
    if topic_id and known_id:
        if topic_id != known_id:
            return f"its topic id is {topic_id}, the checkpoint was taken on {known_id}"
        return None
    for p, end in sorted(ends.items()):
        at = offsets.get(str(p))
        if at is not None and at > end + SLACK:
            return f"the offset of partition {p} is beyond its end ({at} > {end})"
    return None


def check(consumer, service, topic: str, policy: str = "restart") -> bool:
    """Compare the topic on the broker with what ``service`` (its offsets, its ``topic_id``)
    knows; on a new topic, forget the offsets (``restart``: True, consume it from its start) or
    raise NewTopic (``refuse``). ``service.topic_id`` is then the topic's. Broker errors
    propagate (as at start)."""
    from kafka import TopicPartition
    topic_id = internals.topic_id(consumer, topic)
    known = {p: off for p, off in service.offsets.items()}
    if known:
        tps = [TopicPartition(topic, int(p)) for p in known]
        ends = {tp.partition: end for tp, end in consumer.end_offsets(tps).items()}
        why = stale(topic_id, getattr(service, "topic_id", None), known, ends)
        if why is not None:
            if policy == "refuse":
                raise NewTopic(f"topic {topic!r} was deleted and created again ({why}); "
                               "--on-new-topic restart consumes it from its start")
            log_event("topic_recreated", logging.WARNING, topic=topic, reason=why,
                      forgotten=len(known), note="consuming the new topic from its start")
            service.offsets.clear()   # in place: the OffsetBook holds this dict
            service.topic_id = topic_id
            return True
    service.topic_id = topic_id
    return False
