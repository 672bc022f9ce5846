"""A model-topic record's outcome depends on the record sequence only, never on where a fetch ended
(``stream.fleet.model_feed.ModelFeed`` over either reader of ``stream.fleet.feed_reader``): a
message that is not a good delta of this model is refused (one line, counted, read past) wherever
it falls in a poll, and an error that is not the record's leaves the reader where a retry skips
nothing. The readers' clients are stubs over a list of messages that move past what each fetch
hands over, as librdkafka and kafka-python do; the fetch size varies the poll boundaries."""

import json
import logging

import confluent_kafka
import kafka
import numpy as np
import pytest

from sketchrec.models import SketchMF
from sketchrec.models.metrics import ErrorStats
from sketchrec.stream.fleet.feed_reader import NativeReader, PythonReader, Record
from sketchrec.stream.fleet import model_feed
from sketchrec.stream.fleet.model_feed import ModelFeed
from sketchrec.stream.fleet.model_topic import HEADER, Fenced, FleetState, encode_meta
from sketchrec.stream.fleet.views import Diverged
from sketchrec.stream.fleet.tracker import DeltaTracker
from sketchrec.stream.recommender import Recommender
from sketchrec.synthetic import SyntheticStream

READERS = ("native", "python")
FETCHES = (1, 2, 3, 10)   # records per fetch: where each poll ends


class _NativeMessage:
    def __init__(self, record: Record):
        self.record = record

    def error(self):
        return None

    def offset(self):
        return self.record.offset

    def value(self):
        return self.record.value

    def headers(self):
        return self.record.headers


class _Client:
    """A client over ``records`` from its position: each fetch hands over up to ``fetch`` of them
    and moves past them; a fetch numbered in ``fail`` moves past its records and raises instead
    (the way a client's poll loses what it drained before an error). ``lose``: offsets the first
    fetch that reaches them does not hand over, or {offset: how many fetches that reach it do
    not} (a broker that lists the batches after one whose write it has not finished)."""

    def __init__(self, records, fetch, fail=(), lose=()):
        self.records, self.fetch, self.fail, self.pos, self.fetches = records, fetch, set(fail), 0, 0
        self.lose = dict(lose) if isinstance(lose, dict) else dict.fromkeys(lose, 1)

    def _next(self) -> list[Record]:
        got = [r for r in self.records if r.offset >= self.pos][:self.fetch]
        self.pos = got[-1].offset + 1 if got else self.pos
        lost = {r.offset for r in got if self.lose.get(r.offset, 0) > 0}
        for offset in lost:
            self.lose[offset] -= 1
        got = [r for r in got if r.offset not in lost]   # moved past all the same
        self.fetches += 1
        if self.fetches in self.fail:
            raise self.error("the broker went away mid-fetch")
        return got


class _NativeClient(_Client):
    error = staticmethod(lambda why: confluent_kafka.KafkaException(
        confluent_kafka.KafkaError(confluent_kafka.KafkaError._TRANSPORT, why)))

    def consume(self, n, timeout):
        return [_NativeMessage(r) for r in self._next()]

    def assign(self, tps):
        self.pos = tps[0].offset


class _PythonClient(_Client):
    error = kafka.errors.KafkaConnectionError

    def poll(self, timeout_ms):
        got = self._next()
        return {kafka.TopicPartition("t.model", 0): got} if got else {}

    def seek(self, tp, position):
        self.pos = position


def _feed(kind: str, records, fetch: int, apply, fail=(), lose=()) -> ModelFeed:
    if kind == "native":
        reader = NativeReader.__new__(NativeReader)
        reader._errors, reader._error = confluent_kafka, None
        reader.tp = confluent_kafka.TopicPartition("t.model", 0, 0)
        reader.consumer = _NativeClient(records, fetch, fail, lose)
    else:
        reader = PythonReader.__new__(PythonReader)
        reader.tp = kafka.TopicPartition("t.model", 0)
        reader.consumer = _PythonClient(records, fetch, fail, lose)
    feed = ModelFeed.__new__(ModelFeed)
    feed.state, feed.apply, feed.on_origin, feed.bytes_read = FleetState(member="m2"), apply, None, 0
    feed.reader, feed.consumer, feed.gap_at = reader, reader.consumer, None
    feed.gap_since, feed.gap_reads = 0.0, 0
    return feed


def _drain(feed: ModelFeed) -> int:
    """Poll as a member does until a poll without error finds nothing: an error is an outage
    (``FleetLearner._read_feed`` reads again after it). The number of polls that raised."""
    failed = 0
    for _ in range(100):
        try:
            if feed.poll(0) == 0:
                return failed
        except Exception:  # noqa: BLE001 - as the member: counted as an outage, read again
            failed += 1
    raise AssertionError("the feed never reached the end")


def _record(offset: int, member: str, seq: int, covers: dict, value: bytes, header: bytes | None = None):
    meta = header or encode_meta(member, seq, covers, ErrorStats(n=1, sq=1.0, abs=1.0), {})
    return Record(offset, value, [(HEADER, meta)])


def _recommender(dim: int = 16) -> Recommender:
    return Recommender(SketchMF(capacity=120, dim=dim, seed=0), pair_capacity=4_000, user_capacity=500)


@pytest.fixture(scope="module")
def deltas():
    """Two deltas of member m1 and one of m3, whose model is configured differently (dim 8)."""
    data = SyntheticStream(600, n_users=60, n_items=40, seed=0).all()
    m1, m3 = _recommender(), _recommender(dim=8)
    t1, t3 = DeltaTracker(m1, member="m1"), DeltaTracker(m3, member="m3")
    out = []
    for rows in (slice(0, 300), slice(300, 600)):
        m1.learn_many(data.users[rows], data.items[rows], data.ratings[rows])
        out.append(t1.take())
    m3.learn_many(data.users[:300], data.items[:300], data.ratings[:300])
    return out[0], t3.take(), out[1]


def _replica(kind: str, records, fetch: int):
    """A fresh replica (member m2, m1's configuration) that read ``records``: its feed, its tracker."""
    tracker = DeltaTracker(_recommender(), member="m2")
    feed = _feed(kind, records, fetch, tracker.apply)
    assert _drain(feed) == 0   # a bad record is no error of the poll's
    return feed, tracker


@pytest.mark.parametrize("kind", READERS)
def test_a_delta_of_another_model_is_refused_and_the_next_one_applied_wherever_the_fetch_ends(kind, deltas, caplog):
    """The reviewer's sequence: m1#1, a delta of a differently configured model, m1#2, then an
    empty poll. On either reader, whatever the fetch size, m1#2 is applied, the bad delta refused
    and counted (one line), and the replicas end identical. (Before, the apply's ValueError ended
    the poll: m1#2 was lost when it came in the same fetch, and the refusal was never counted.)"""
    caplog.set_level(logging.WARNING, logger="sketchrec.events")   # whatever an earlier test set
    first, foreign, second = deltas
    records = [_record(0, "m1", 0, {0: (0, 300)}, first), _record(1, "m3", 0, {1: (0, 300)}, foreign),
               _record(2, "m1", 1, {0: (300, 600)}, second)]
    states, cells = [], []
    for fetch in FETCHES:
        caplog.clear()
        feed, tracker = _replica(kind, records, fetch)
        assert tracker.applied == {"m1": 2}
        assert feed.state.refused == 1 and feed.state.position == 3 and feed.state.covered == {"0": 600}
        refusals = [r.getMessage() for r in caplog.records if "delta_refused" in r.getMessage()]
        assert len(refusals) == 1 and "differently configured" in refusals[0] and "offset=1" in refusals[0]
        states.append(feed.state.to_dict())
        cells.append(tracker.rec.model.vectors.cells.copy())
    assert all(s == states[0] for s in states)
    assert all(np.array_equal(c, cells[0]) for c in cells)


@pytest.mark.parametrize("kind", READERS)
def test_a_delta_applied_already_and_a_malformed_header_are_refused_alike(kind, deltas):
    """m1#1 again under a fresh header (the tracker has applied it: ValueError) and a header whose
    covers are not ranges: both refused and counted on every fetch size, and what follows them
    still counts."""
    first, _, second = deltas
    bad_header = json.dumps({"v": 1, "member": "m4", "seq": 0, "covers": {"3": 7}}).encode()
    records = [_record(0, "m1", 0, {0: (0, 300)}, first), _record(1, "m1", 1, {2: (0, 9)}, first),
               _record(2, "m4", 0, {}, b"x", header=bad_header), _record(3, "m1", 2, {0: (300, 600)}, second)]
    states = []
    for fetch in FETCHES:
        feed, tracker = _replica(kind, records, fetch)
        assert tracker.applied == {"m1": 2} and feed.state.refused == 2
        assert feed.state.covered == {"0": 600} and feed.state.position == 4
        states.append(feed.state.to_dict())
    assert all(s == states[0] for s in states)


def _good(n: int) -> list[Record]:
    """``n`` deltas of two members, each continuing its partition's coverage."""
    return [_record(k, f"m{3 + k % 2}", k // 2, {k % 2: (10 * (k // 2), 10 * (k // 2 + 1))}, b"d%d" % k)
            for k in range(n)]


@pytest.mark.parametrize("kind", READERS)
@pytest.mark.parametrize("fetch", [2, 3])
def test_a_transport_error_mid_poll_loses_nothing(kind, fetch, monkeypatch):
    """A client that moves past a fetch's records and then raises, and an apply that fails once
    for a reason not the record's (not a ValueError): the polls that raised are read again from
    the last record taken, and every delta is applied exactly once. The broken variant (a reader
    that does not seek back, the old behaviour) loses the fetch's records."""
    records = _good(8)

    def run(seek: bool) -> tuple[list[bytes], int]:
        applied, failing = [], [b"d5"]

        def apply(blob):
            if blob in failing:
                failing.remove(blob)
                raise OSError("out of file handles")
            applied.append(blob)
        feed = _feed(kind, records, fetch, apply, fail=[2])
        if not seek:
            monkeypatch.setattr(feed.reader, "seek", lambda position: None)
        return applied, _drain(feed)

    assert run(seek=True) == ([r.value for r in records], 2)   # 2: the fetch's error and the apply's
    assert len(run(seek=False)[0]) < len(records)   # the old behaviour: records skipped


def test_an_error_pending_from_a_fetch_is_dropped_by_a_seek():
    """librdkafka: records that came with a broker's error are handed over and the error kept for
    the next poll; a seek starts the fetch afresh, so the next poll reads from the position."""
    feed = _feed("native", _good(4), 10, lambda blob: None)
    reader = feed.reader
    reader._error = confluent_kafka.KafkaError(confluent_kafka.KafkaError._TRANSPORT)
    reader.seek(2)
    assert [r.offset for r in reader.poll(0)] == [2, 3]


@pytest.mark.parametrize("kind", READERS)
def test_a_record_the_reader_skipped_is_read_again_before_the_ones_after_it(kind, monkeypatch):
    """A fetch that hands over the records after one it lost: the feed goes back for it, and every
    delta is settled in order (the coverage a replica judges later deltas on). The broken variant
    takes what it is handed: the lost delta's partition stays behind and its next delta is refused
    at this replica alone."""
    records = _good(6)
    applied = []
    feed = _feed(kind, records, 3, applied.append, lose={2})
    assert _drain(feed) == 0
    assert applied == [r.value for r in records] and feed.state.refused == 0
    assert feed.state.covered == {"0": 30, "1": 30} and feed.state.position == 6
    monkeypatch.setattr(ModelFeed, "_skipped", lambda self, offset: False)
    broken = _feed(kind, records, 3, [].append, lose={2})
    _drain(broken)
    assert broken.state.refused > 0 and broken.state.covered != feed.state.covered


class _Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("kind", READERS)
@pytest.mark.parametrize("fetch", [1, 3, 10])
def test_a_record_still_missing_when_read_again_is_waited_for(kind, fetch, monkeypatch):
    """A broker that moves a partition's end before it stores the batch (Tansu) can, while
    members publish at once, list the batch after one not stored yet, fetch after fetch until
    the write lands. The feed takes nothing past the hole meanwhile, and every delta settles in
    order once it is handed over. A replica that read past it would refuse the missing delta's
    partition for good, and the snapshots it wrote would hand that on to the members restored
    from them."""
    clock = _Clock()
    monkeypatch.setattr(model_feed, "_now", clock)
    records = _good(6)
    applied = []
    feed = _feed(kind, records, fetch, applied.append, lose={2: 4})   # missing from four fetches
    for _ in range(12):   # polls a few milliseconds apart, as a member's between its chunks
        feed.poll(0)
        clock.now += 0.005
    assert applied == [r.value for r in records] and feed.state.refused == 0
    assert feed.state.covered == {"0": 30, "1": 30} and feed.state.position == 6


@pytest.mark.parametrize("kind", READERS)
def test_a_hole_the_topic_holds_is_read_past_after_the_patience(kind, monkeypatch, caplog):
    """A record the broker never stores (its end moved, the write lost): read past once it has
    been missing for GAP_PATIENCE_S and GAP_READS reads after that, one line logged, and what
    follows counts."""
    caplog.set_level(logging.WARNING, logger="sketchrec.events")
    clock = _Clock()
    monkeypatch.setattr(model_feed, "_now", clock)
    records = _good(6)
    holed = _feed(kind, records[:1] + records[2:3], 3, [].append)   # offsets 0 and 2 only
    for _ in range(5):
        holed.poll(0)
        clock.now += 1.0
    assert holed.state.position == 1   # within the patience: nothing past the hole
    clock.now += model_feed.GAP_PATIENCE_S
    for _ in range(model_feed.GAP_READS + 1):
        holed.poll(0)
    assert holed.state.position == 3 and holed.state.refused == 0
    assert sum("model_topic_gap" in r.getMessage() for r in caplog.records) == 1


def _viewed(members: list[str], n: int) -> list[Record]:
    """``n`` deltas of ``members`` in turn, each continuing its own partition's coverage, each
    header carrying its member's view: the digest of a replica that had read every record before
    it (``FleetState.view``), as a member publishes."""
    ref, records = FleetState(member="publisher"), []
    for k in range(n):
        member, p = members[k % len(members)], k % len(members)
        covers = {p: (10 * (k // len(members)), 10 * (k // len(members) + 1))}
        header = encode_meta(member, k // len(members), covers, ErrorStats(n=1, sq=1.0, abs=1.0), {},
                             view=ref.view())
        records.append(_record(k, member, 0, {}, b"d%d" % k, header))
        ref.settle(json.loads(header), k)
    return records


def _read_until_diverged(feed: ModelFeed):
    """Poll to the end; the ``Diverged`` raised on the way (None if none)."""
    for _ in range(50):
        try:
            if feed.poll(0) == 0:
                return None
        except Diverged as exc:
            return exc
    raise AssertionError("the feed never reached the end")


@pytest.mark.parametrize("kind", READERS)
def test_a_replica_that_read_past_a_record_is_told_apart_by_the_other_members_views(kind, monkeypatch, caplog):
    """Each delta carries its member's digest of the verdicts before it; a replica that decided the
    records as every member did agrees with all of them and ends with their state. The broken
    variant reads past a record its fetch lost (as the model feed did on a second read): from
    there on every other member's view differs from its own, and once every member it heard from
    lately disagrees (two at least) it raises Diverged (a member is then fenced and rebuilt)
    instead of refusing one member's deltas for good."""
    caplog.set_level(logging.WARNING, logger="sketchrec.events")
    records = _viewed(["m1", "m3", "m4"], 12)
    healthy = _feed(kind, records, 3, [].append, lose={4: 1})
    assert _read_until_diverged(healthy) is None
    assert healthy.state.refused == 0 and healthy.state.covered == {"0": 40, "1": 40, "2": 40}
    assert all(ok for _, ok in healthy.state.views.members.values()) and len(healthy.state.views.members) == 3
    monkeypatch.setattr(ModelFeed, "_skipped", lambda self, offset: False)
    broken = _feed(kind, records, 3, [].append, lose={4: 1})
    exc = _read_until_diverged(broken)
    assert isinstance(exc, Diverged) and isinstance(exc, Fenced) and "otherwise than 3 other members" in str(exc)
    assert not any(ok for _, ok in broken.state.views.members.values())   # each agreed until the hole
    assert broken.state.position < len(records)   # stopped at the evidence, not read to the end
    assert sum("view_mismatch" in r.getMessage() for r in caplog.records) == 3


@pytest.mark.parametrize("kind", READERS)
def test_one_member_disagreeing_is_logged_not_acted_on(kind, monkeypatch, caplog):
    """With one other member (a fleet of two) a disagreement cannot say which side read wrong:
    one line names the member, and reading goes on."""
    caplog.set_level(logging.WARNING, logger="sketchrec.events")
    monkeypatch.setattr(ModelFeed, "_skipped", lambda self, offset: False)
    broken = _feed(kind, _viewed(["m1"], 6), 2, [].append, lose={2: 1})
    assert _read_until_diverged(broken) is None and broken.state.position == 6
    assert [r.getMessage().count("member=m1") for r in caplog.records if "view_mismatch" in r.getMessage()] == [1]


def test_a_snapshot_carries_the_digest_and_one_without_it_checks_nothing():
    state = FleetState(member="a")
    for k, record in enumerate(_viewed(["m1", "m3"], 4)):
        state.settle(json.loads(dict(record.headers)[HEADER]), k)
    restored = FleetState.from_dict(state.to_dict(), "b")
    assert restored.view() == state.view() and restored.view()[0] == 4
    old = state.to_dict()
    del old["chain"]   # written before digests existed
    unknown = FleetState.from_dict(old, "b")
    assert unknown.view() is None
    assert unknown.views.judge("m1", state.view(), 4) is None and unknown.views.members == {}
