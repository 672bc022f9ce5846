"""What the callers do with a model-topic position retention deleted (``model_topic.Truncated``):
a read-only replica is unhealthy with the reason until it is rebuilt, and serves healthy again once
it is; a fenced member whose newest snapshot is older than the log stops instead of retrying."""

import threading
from types import SimpleNamespace

import pytest

from sketchrec.stream.fleet import replicas
from sketchrec.stream.fleet.model_topic import Fenced, Truncated
from sketchrec.stream.fleet.replicas import FleetReplica, NoExactReplica
from sketchrec.stream.health import Health


class Feed:
    def __init__(self):
        self.closed = False

    def close(self):
        self.closed = True


def _replica() -> FleetReplica:
    replica = FleetReplica.__new__(FleetReplica)
    replica.service = SimpleNamespace(health=Health(), fleet=SimpleNamespace(position=40))
    replica.bootstrap, replica.model_topic = "broker:9092", "t.model"
    replica.feed, replica.stop = Feed(), threading.Event()
    replica.bound = print   # the serving options' bound (any callable): handed to the rebuild
    return replica


def test_a_truncated_replica_is_unhealthy_until_rebuilt(monkeypatch):
    replica, lost = _replica(), Truncated("t.model", 7, 40)
    old, new = replica.feed, Feed()
    waits = []
    monkeypatch.setattr(replica.stop, "wait", waits.append)

    def too_old(*args, **kw):
        raise NoExactReplica("t.model starts at offset 40, after the newest snapshot's position 30")
    monkeypatch.setattr(replicas, "rebuild", too_old)
    replica._rebuild(lost)
    [problem] = replica.service.health.problems()
    assert problem.startswith("replica not exact: t.model no longer holds offset 7 (its log starts at 40")
    assert problem.endswith("not rebuilt: t.model starts at offset 40, after the newest snapshot's position 30")
    assert waits == [FleetReplica.REBUILD_AFTER_S] and replica.feed is old and not old.closed

    rebuilt = []
    monkeypatch.setattr(replicas, "rebuild", lambda *args, **kw: rebuilt.append((args, kw)))
    monkeypatch.setattr(replica, "_feed", lambda: new)
    replica._rebuild(lost)
    assert rebuilt == [((replica.service, "broker:9092", "t.model", None), {"bound": print})]
    assert replica.service.health.problems() == [] and replica.feed is new and old.closed


def test_a_truncated_position_fences_a_member():
    """A member whose read of the model topic is handed ``Truncated`` is fenced (then rebuilt by
    `consume --fleet`), not counted as a broker outage and read again (which would skip nothing
    but stall it for good: the position is gone)."""
    from sketchrec.stream.fleet.member import FleetLearner
    member = object.__new__(FleetLearner)
    member.fenced, member.stop = None, threading.Event()
    lost = Truncated("t.model", 7, 40)

    def poll(timeout_ms):
        raise lost
    member.feed = SimpleNamespace(poll=poll)
    member.outages = SimpleNamespace(failed=lambda *a, **k: pytest.fail("counted as an outage"))
    assert member._read_feed(0) == 0
    assert isinstance(member.fenced, Fenced) and str(member.fenced) == str(lost) and member.stop.is_set()


def test_a_member_with_no_snapshot_the_log_follows_stops_rather_than_retrying():
    from sketchrec.cli.fleet import _rejoin
    tries = []

    def rebuild():
        tries.append(1)
        raise NoExactReplica("t.model starts at offset 40, after the newest snapshot's position 30")
    with pytest.raises(NoExactReplica):
        _rejoin(rebuild, lambda: None, threading.Event(), Health())
    assert tries == [1]
