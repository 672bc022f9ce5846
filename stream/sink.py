"""Where a consumer's state goes: a ``StateSink``.

A consumer's loop decides *when* its state is made durable (a cadence, a rebalance, a stop);
the sink decides *where*: the single consumer's local checkpoint files (``LocalCheckpoints``,
`consume --checkpoint DIR`) or a fleet member's snapshots on the model topic
(``stream.fleet.replicas.TopicSnapshots``). ``KafkaLearner.write_state`` is the one place that
writes through a sink and logs what was written; it does not know which sink it holds.

A sink's ``write`` either makes the whole state durable and says what it wrote (``Written``), or
raises and leaves the previous state in force: the caller logs the failure in one line and retries
at its next cadence.

>>> class Memory:
...     kind, records_offsets = "checkpoint", True
...     def __init__(self):
...         self.saved = []
...     def write(self):
...         self.saved.append("state")
...         return Written(f"mem-{len(self.saved)}", ratings=10 * len(self.saved))
>>> sink = require_sink(Memory())
>>> sink.write(), sink.write().fields()
(Written(name='mem-1', ratings=10, extra={}), {'name': 'mem-2', 'ratings': 20})
>>> try:
...     require_sink(object())
... except TypeError as refused:
...     print(refused)
not a StateSink (missing: kind, records_offsets, write): give LocalCheckpoints(service) or the fleet's TopicSnapshots
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple, Protocol, runtime_checkable

if TYPE_CHECKING:   # the service is only called, never built here
    from sketchrec.stream.service import LearningService


class Written(NamedTuple):
    """What a sink wrote: a name a log line and /stats may show (never a filesystem path: /stats
    is public), the ratings its state holds, and the sink's own further fields for the log."""

    name: str
    ratings: int | None = None
    extra: dict = {}

    def fields(self) -> dict:
        """The log line's fields: name, ratings, then the sink's own."""
        return {"name": self.name, "ratings": self.ratings, **self.extra}


@runtime_checkable
class StateSink(Protocol):
    """Where a consumer's whole state goes when its loop writes it.

    Parameters
    ----------
    kind:
        The log event a write is reported as (``"checkpoint"``, ``"snapshot"``).
    records_offsets:
        Whether what it writes holds the input topic's offsets and identity, so that the consumer
        resumes from them and checks a re-created topic against them (``kafka.identity``); a fleet
        member resumes from the model topic's accepted deltas instead.
    write:
        Makes the state durable now and returns what it wrote; raises (leaving the previous state
        in force) when it cannot.

    Examples
    --------
    >>> isinstance(LocalCheckpoints.__new__(LocalCheckpoints), StateSink)
    True
    """

    kind: str
    records_offsets: bool

    def write(self) -> Written: ...


_MEMBERS = ("kind", "records_offsets", "write")


def require_sink(sink: object) -> StateSink:
    """``sink`` if it is a StateSink; otherwise a one-line TypeError naming what it lacks."""
    missing = [name for name in _MEMBERS if not hasattr(sink, name)]
    if missing:
        raise TypeError(f"not a StateSink (missing: {', '.join(missing)}): give "
                        "LocalCheckpoints(service) or the fleet's TopicSnapshots")
    return sink   # type: ignore[return-value]


class LocalCheckpoints:
    """The single consumer's sink: one atomic checkpoint file of the service's whole state, its
    offsets included (``LearningService.checkpoint``, ``stream.checkpoint``).

    Parameters
    ----------
    service:
        The learning service whose ``checkpoints`` directory receives the files; one without a
        directory is refused in one line.

    Examples
    --------
    >>> import tempfile
    >>> from sketchrec.models.bias_baseline import BiasBaseline
    >>> from sketchrec.stream.checkpoint import CheckpointStore
    >>> from sketchrec.stream.recommender import Recommender
    >>> from sketchrec.stream.service import LearningService
    >>> with tempfile.TemporaryDirectory() as directory:
    ...     service = LearningService(Recommender(BiasBaseline(), pair_capacity=100),
    ...                               CheckpointStore(directory))
    ...     LocalCheckpoints(service).write().fields()["ratings"]
    0
    """

    kind = "checkpoint"
    records_offsets = True

    def __init__(self, service: "LearningService"):
        if service.checkpoints is None:
            raise ValueError("the Kafka consumer needs a checkpoint directory (--checkpoint DIR)")
        self.service = service

    def write(self) -> Written:
        written = self.service.checkpoint()
        return Written(written["name"], written["ratings_learned"])
