"""Replicas' views of the model topic (``stream.fleet.views``): the rule that tells which replica
diverged, and a disputed replica holding its snapshots back. (The views over real records, read
by either reader: ``test_model_feed_records.py``; against a real fleet: the kill -9 integration
test.)"""

from types import SimpleNamespace

import pytest

from sketchrec.stream.fleet.model_topic import FleetState
from sketchrec.stream.fleet.replicas import TopicSnapshots
from sketchrec.stream.fleet.views import DISAGREEING, RECENT, Views


def _pair():
    """A replica's views and a second replica's that decided record 3 otherwise."""
    mine, theirs = Views(0, ""), Views(0, "")
    for offset in range(10):
        mine.step(offset, "a")
        theirs.step(offset, "r" if offset == 3 else "a")
    return mine, theirs


def test_every_member_heard_lately_disagreeing_says_this_replica_diverged():
    mine, theirs = _pair()
    assert mine.judge("m1", theirs.at(2), 20) is None   # before record 3: they agree
    reasons = [mine.judge(m, theirs.at(8), 21 + n) for n, m in enumerate(["m1", "m2", "m3"])]
    # m1 agreed at 20 and disagrees at 21: its latest counts; from DISAGREEING members on, diverged
    assert [r is not None for r in reasons] == [n + 1 >= DISAGREEING for n in range(3)]
    assert "otherwise than 3 other members" in reasons[-1]


def test_one_member_agreeing_lately_keeps_the_replica_in():
    mine, theirs = _pair()
    assert mine.judge("m1", mine.at(8), 30) is None   # m1 read as this replica did
    assert mine.judge("m2", theirs.at(8), 31) is None and mine.judge("m3", theirs.at(8), 32) is None
    # ... until m1's agreement is older than RECENT records
    assert mine.judge("m3", theirs.at(9), 30 + RECENT) is not None


@pytest.mark.parametrize("view", [None, [99, "x"]])   # no view, or one from before the window
def test_a_view_that_cannot_be_compared_counts_for_nothing(view):
    mine, _ = _pair()
    assert mine.judge("m1", view, 20) is None and mine.members == {}


class _Producer:
    def send(self, *args, **kw):
        raise AssertionError("a disputed replica wrote a snapshot")


def test_a_replica_some_member_disagrees_with_writes_no_snapshot(monkeypatch):
    """A diverged replica's snapshot would hand its reading on to every replica restored from it
    (the joiner of the split kill -9 run): while a member disagrees, the snapshot is held."""
    state = FleetState(member="me")
    for offset in range(5):
        state.passed(offset, "n")
    other = Views(0, "")
    for offset in range(5):
        other.step(offset, "r")
    service = SimpleNamespace(fleet=state, ratings_learned=7, tracker=SimpleNamespace(settle=lambda: None),
                              recommender=None, model_cls=FleetState)
    sink = TopicSnapshots(service, SimpleNamespace(catch_up=lambda: None), _Producer(), "t.model.snapshots")
    assert state.views.judge("m1", other.at(5), 6) is None   # one member: logged, reading goes on
    written = sink.write()
    assert written.name == "held" and written.extra["offset"] is None and written.extra["position"] == 5
    state.views.members.clear()   # no dispute: it writes
    monkeypatch.setattr("sketchrec.stream.fleet.replicas.write_snapshot", lambda *a, **k: 41)
    assert sink.write().extra["offset"] == 41
