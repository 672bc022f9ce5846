"""Reading a window of the snapshot topic: a stalled read fails, a slow one that goes on is read
whole (a part of the window taken for the whole would miss its newest manifest)."""

import json
import types
from collections import namedtuple

import pytest
from kafka import TopicPartition

from sketchrec.stream.fleet import snapshots

Msg = namedtuple("Msg", "offset headers value")
TP = TopicPartition("m.snapshots", 0)


class _Consumer:
    """Hands one message per poll, with ``pause`` seconds of clock between polls; none from
    ``stall_at`` on."""

    def __init__(self, n: int, clock: list, pause: float, stall_at: int | None = None):
        self.n, self.clock, self.pause, self.stall_at, self.at = n, clock, pause, stall_at, 0

    def seek(self, tp, offset: int) -> None:
        self.at = offset

    def poll(self, timeout_ms: int) -> dict:
        self.clock[0] += self.pause
        if self.at >= self.n or (self.stall_at is not None and self.at >= self.stall_at):
            return {}
        header = json.dumps({"id": "s", "manifest": self.at == self.n - 1}).encode()
        self.at += 1
        return {TP: [Msg(self.at - 1, [(snapshots.HEADER, header)], b"")]}


@pytest.fixture()
def clock(monkeypatch):
    now = [0.0]
    # the module's clock only (the time module itself is everyone's)
    monkeypatch.setattr(snapshots, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
    return now


def test_a_read_slower_in_all_than_its_timeout_but_never_stalled_is_whole(clock):
    got = snapshots._read(_Consumer(10, clock, pause=1.0), TP, 0, 10, timeout=3.0)
    assert [o for o, _, _ in got] == list(range(10)) and got[-1][1]["manifest"]


def test_a_stalled_read_fails_instead_of_returning_part_of_the_window(clock):
    with pytest.raises(TimeoutError, match="could not be read from offset 4 to 10"):
        snapshots._read(_Consumer(10, clock, pause=1.0, stall_at=4), TP, 0, 10, timeout=3.0)
