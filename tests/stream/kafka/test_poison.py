"""No message stops learning: arbitrary message values through the consumer's real message path
(``KafkaLearner.learn_poll``, which the fleet member's ``learn_poll`` calls per chunk), without a broker.

Each poll of arbitrary messages (any unicode in ids, lone surrogates among them, NUL, 10 kB
strings, ints of any size, nested JSON, bytes that are not UTF-8, CSV and JSON, batches) must be
handled whole: every message's offset stored, every rejection counted by reason and
dead-lettered, the rest learned, the model and its prequential error still finite. Before the
fix a JSON id holding a lone surrogate passed parsing and raised UnicodeEncodeError in the
learner's batch hashing, so the consumer (and every fleet member) died on every restart."""

import json
import math
import threading
import types
from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka import TopicPartition

from sketchrec.models import SketchMF
from sketchrec.stream.kafka.consumer import KafkaLearner, resume_or_create
from sketchrec.stream.kafka.messages import parse_message
from sketchrec.stream.fleet.outage import Outages
from sketchrec.stream.kafka.offsets import OffsetBook

LONE = '{"user": "\\ud800", "item": 1, "rating": 3}'.encode()
ANY_CHAR = st.characters(exclude_categories=())   # surrogates included (excluded by default)
IDS = st.one_of(
    st.text(ANY_CHAR, max_size=12), st.integers(), st.integers(-(10 ** 30), 10 ** 30),
    st.sampled_from(["\ud800", "\udfff", "a\ud800b", "\x00", "x" * 10_000, "", " ", 2 ** 64, -1]),
    st.booleans(), st.none(), st.floats(), st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
RATINGS = st.one_of(st.floats(0.5, 5.0), st.floats(), st.integers(), st.text(ANY_CHAR, max_size=4),
                    st.sampled_from([3, "4.5", 1e308, -1e308, None]))
RATING = st.fixed_dictionaries({"user": IDS, "item": IDS, "rating": RATINGS},
                               optional={"timestamp": st.one_of(st.integers(), st.floats(), st.text(max_size=3))})
NESTED = st.recursive(st.none() | st.integers() | st.text(ANY_CHAR, max_size=4),
                      lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=2), kids, max_size=3),
                      max_leaves=12)


def _json(doc, ascii_only: bool) -> bytes:
    # ensure_ascii: a lone surrogate travels as its \ud800 escape; without, as the bytes that
    # "surrogatepass" gives (not UTF-8)
    text = json.dumps(doc, ensure_ascii=ascii_only)
    return text.encode("utf-8", "surrogatepass")


def _csv(fields) -> bytes:
    return ",".join(str(f) for f in fields).encode("utf-8", "surrogatepass")


MESSAGES = st.one_of(
    st.tuples(RATING, st.booleans()).map(lambda d: _json(*d)),
    st.tuples(st.lists(st.one_of(RATING, NESTED), max_size=4), st.booleans()).map(lambda d: _json(*d)),
    st.tuples(NESTED, st.booleans()).map(lambda d: _json(*d)),
    st.lists(st.tuples(IDS, IDS, RATINGS), min_size=1, max_size=3).map(
        lambda rows: b"\n".join(_csv(r) for r in rows)),
    st.binary(max_size=64), st.sampled_from([LONE, b"1,2,4", b"\xff\xfe", b"[" * 3000, None]))
POLLS = st.lists(st.tuples(MESSAGES, st.sampled_from([None, [("h", b"\xff")], [("sketchrec.ldp", b"\x00")]])),
                 min_size=1, max_size=5)


def _service(directory):
    return resume_or_create(directory, lambda: SketchMF(capacity=500, dim=8), pair_capacity=20_000)


class _Producer:
    """A dead-letter (and model-topic) producer that keeps what it was given."""

    def __init__(self):
        self.sent = []

    def send(self, topic, value=None, **kw):
        self.sent.append((topic, value, kw))
        return types.SimpleNamespace(is_done=True, failed=lambda: False, exception=None)


def _bare(cls, service):
    learner = cls.__new__(cls)
    learner.service, learner.health = service, service.health
    learner.rating_range, learner.dead_topic, learner.stop = (0.5, 5.0), "t.dead", threading.Event()
    learner.producer = _Producer()
    learner.book = OffsetBook(service.offsets)
    learner.dead_letters = Counter()
    learner.topic = "t"
    return learner


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    return _bare(KafkaLearner, _service(tmp_path_factory.mktemp("single")))


@pytest.fixture(scope="module")
def member():
    """A fleet member's message handling (``FleetLearner.learn_poll``: chunks, publishes, the model
    topic) over fakes of its broker clients."""
    from sketchrec.models.metrics import ErrorStats
    from sketchrec.stream.fleet.member import FleetLearner
    from sketchrec.stream.fleet.model_topic import FleetState
    from sketchrec.stream.fleet.replicas import FleetService
    from sketchrec.stream.fleet.pace import HotItems
    from sketchrec.stream.fleet.tracker import DeltaTracker
    from sketchrec.stream.recommender import Recommender
    recommender = Recommender(SketchMF(capacity=500, dim=8), pair_capacity=20_000)
    service = FleetService(recommender, None, read_only=False)   # as a member's (replicas.py)
    learner = _bare(FleetLearner, service)
    learner.state, learner.tracker = FleetState(member="m"), DeltaTracker(recommender, "m")
    learner.hot = HotItems(recommender, learner.tracker)   # a member's pace, as __init__ makes it
    learner.model_producer, learner.model_topic = _Producer(), "t.model"
    learner.outages = Outages(service.health)
    learner.feed = types.SimpleNamespace(poll=lambda timeout_ms=0: 0)
    learner.consumer = types.SimpleNamespace(partitions_for_topic=lambda t: {0, 1},
                                             assignment=lambda: {TopicPartition("t", 0)}, config={})
    learner.published, learner.errors, learner.skipped_since = {"0": 0}, ErrorStats(), Counter()
    learner.seq, learner.bytes_published, learner.inflight = 0, 0, []
    learner.snapshot_seconds, learner.last_snapshot = math.inf, 0.0
    learner.by_size, learner.sync_ratings, learner.chunk_ratings = False, 3, 3
    learner.alone, learner.per_message, learner.max_poll, learner.fenced = False, None, 100, None
    learner.refusal = None   # no topic refused (a user-level DP fleet refuses one not keyed by user)
    learner.own, learner.first_at, learner.last_at, learner.progress = 0, None, None, []
    learner.book = OffsetBook({"0": 0}, 3, 3600.0)
    return learner


def _expected(values) -> tuple[int, Counter]:
    """Ratings and rejections (by reason) that parse_message finds in the messages: the oracle
    (it is what the consumer uses for every message outside the compiled fast form)."""
    n, reasons = 0, Counter()
    for value in values:
        parsed = parse_message(value, (0.5, 5.0))
        n += len(parsed.ratings)
        reasons.update(reason for _, reason, _ in parsed.rejected)
    return n, reasons


def _poll(learner, batch):
    tp = TopicPartition("t", 0)
    start = learner.book.position(0) or 0
    return tp, start, {tp: [types.SimpleNamespace(value=v, headers=h, offset=start + n)
                            for n, (v, h) in enumerate(batch)]}


def _check(learner, batch, skipped_before: Counter, learned_before: int, letters_before: int,
           skipped_now: Counter) -> None:
    n, reasons = _expected(v for v, h in batch if not h)
    got = skipped_now - skipped_before
    letters = learner.producer.sent[letters_before:]
    assert sum(got.values()) == len(letters)             # every rejection dead-lettered, once
    for _, letter, _ in letters:
        assert json.loads(letter)["reason"] in got       # ... naming its reason
    if all(not h for _, h in batch):   # no header to refuse a message: parse_message decides
        assert learner.service.ratings_learned - learned_before == n
        assert got == reasons
    rmse = learner.service.stats()["prequential_rmse"]
    assert rmse is None or math.isfinite(rmse)
    assert np.isfinite(learner.service.recommender.predict_many(np.array([1]), np.array([1]))).all()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(POLLS)
def test_no_message_stops_the_single_consumer(single, batch):
    tp, start, records = _poll(single, batch)
    before = Counter(single.dead_letters), single.service.ratings_learned, len(single.producer.sent)
    single.learn_poll(records)
    assert single.book.position(0) == start + len(batch)   # every message handled
    _check(single, batch, *before, Counter(single.dead_letters))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(POLLS)
def test_no_message_stops_a_fleet_member(member, batch):
    tp, start, records = _poll(member, batch)
    before = Counter(member.dead_letters), member.service.ratings_learned, len(member.producer.sent)
    member.learn_poll(records)
    assert member.fenced is None
    assert member.book.position(0) == start + len(batch)
    _check(member, batch, *before, Counter(member.dead_letters))
    for _, _, kw in member.model_producer.sent:   # every delta's header is JSON, its errors finite
        json.loads(dict(kw["headers"])["sketchrec.delta"], parse_constant=_refuse)


def _refuse(constant):
    raise AssertionError(f"{constant} in a delta's header")


def test_the_lone_surrogate_message_is_set_aside_and_learning_goes_on(single, member):
    """The fault probe's message, alone and among good ones, in the single consumer and a member."""
    for learner in (single, member):
        batch = [(b"7,8,4", None), (LONE, None), (b'[{"user": "a\\ud800", "item": 2, "rating": 4}, '
                                                   b'{"user": "b", "item": 2, "rating": 4}]', None)]
        learned = learner.service.ratings_learned
        letters = len(learner.producer.sent)
        tp, start, records = _poll(learner, batch)
        learner.learn_poll(records)
        assert learner.service.ratings_learned - learned == 2
        reasons = [json.loads(v)["reason"] for _, v, _ in learner.producer.sent[letters:]]
        assert reasons == ["id not valid Unicode (lone surrogate)"] * 2


def test_one_extreme_rating_leaves_the_prequential_error_finite(tmp_path):
    """Before: with any finite rating accepted, one rating of 1e300 made the squared-error sum
    infinite and /stats' prequential_rmse null for good."""
    learner = _bare(KafkaLearner, _service(tmp_path))
    learner.rating_range = None
    for values in ([b"1,2,4", b"3,4,3"], [b"1,2,1e300"], [b"5,6,4"]):
        tp, start, records = _poll(learner, [(v, None) for v in values])
        learner.learn_poll(records)
    rmse = learner.service.stats()["prequential_rmse"]
    assert rmse is not None and math.isfinite(rmse) and rmse < 10
