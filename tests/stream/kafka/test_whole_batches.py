"""A DP-SGD consumer learns whole noisy steps whatever its polls (``kafka.whole_batches``): fed
ragged polls it holds the model one learner fed the whole stream holds, bit for bit (noise seeded
by the debug seed), its offset book never covers a message it holds back, and a rebalance that
drops the held messages re-reads them once. Without it (the broken variant) ragged polls end in
partial noisy steps: more steps, another model."""

import threading
import types

import numpy as np
from kafka import TopicPartition

from sketchrec import SketchMF
from sketchrec.data import SyntheticStream
from sketchrec.models.private.dp_sgd import DPConfig
from sketchrec.stream.kafka.consumer import KafkaLearner
from sketchrec.stream.kafka.offsets import OffsetBook
from sketchrec.stream.kafka.whole_batches import MAX_HELD_BATCHES, WholeBatches

NS = types.SimpleNamespace
TP = TopicPartition("t", 0)
BATCH = 100


def _model() -> SketchMF:
    return SketchMF(dim=4, capacity=400, seed=0,
                    dp=DPConfig(1.0, batch_size=BATCH, debug_noise_seed=11))


def _messages(data, per_message: int = 1, start: int = 0) -> list:
    rows = [f"{u},{i},{r}" for u, i, r in zip(data.users.tolist(), data.items.tolist(),
                                              data.ratings.tolist())]
    return [NS(value="\n".join(rows[n:n + per_message]).encode(), offset=start + k, headers=[], key=None)
            for k, n in enumerate(range(0, len(rows), per_message))]


def _learner(model, whole: bool = True) -> KafkaLearner:
    """KafkaLearner.learn_poll / learn_held as a consumer runs them, without a broker."""
    learner = KafkaLearner.__new__(KafkaLearner)
    learning = threading.Event()
    learning.set()
    learner.service = NS(recommender=NS(learn_many=model.learn_many, learning=learning, model=model),
                         budget_stopped=False, record_origin=lambda headers, n: None)
    learner.rating_range = (1.0, 5.0)
    learner.book = OffsetBook({}, every=10**9, seconds=1e9)
    learner.whole = WholeBatches.of(model, learner.rating_range) if whole else None
    learner.predictions = []
    learner.tally = lambda skipped, predictions=None, truth=None: (
        None if predictions is None else learner.predictions.append(predictions))
    learner._dead_letter = lambda letter: None
    return learner


def _stream(n: int = 1234):
    return SyntheticStream(n_ratings=n, n_users=300, n_items=120, seed=4).all()


def _ragged(messages: list, seed: int = 0):
    """Polls of 1 to 250 messages from where the consumer stands (``at()``), as a broker serves them."""
    rng = np.random.default_rng(seed)
    return lambda at: messages[at:at + int(rng.integers(1, 251))]


def _same_model(a: SketchMF, b: SketchMF) -> bool:
    return (np.array_equal(a.vectors.cells, b.vectors.cells) and np.array_equal(a.biases.cells, b.biases.cells)
            and np.array_equal(a.stats, b.stats) and int(a.dp_steps[0]) == int(b.dp_steps[0]))


def _consume(learner, messages, rebalance_at: int | None = None) -> int:
    """Poll ``messages`` raggedly to the end, then an empty poll (the held messages' step); polls
    made; at poll ``rebalance_at`` the partition is revoked and reassigned (sought to the book)."""
    poll, polls = _ragged(messages), 0
    at = 0
    while at < len(messages):
        got = poll(at)
        learner.learn_poll({TP: got})
        polls += 1
        at = got[-1].offset + 1
        held = learner.whole.held.get(TP, []) if learner.whole else []
        # the book covers exactly what was learned: up to the first held message
        assert learner.book.position(0) == (held[0].offset if held else at)
        if polls == rebalance_at:
            learner.whole.forget([TP])
            at = learner.book.position(0)   # the reassigned partition resumes where the book stands
    learner.learn_held()
    assert not (learner.whole and learner.whole.held) and learner.book.position(0) == len(messages)
    return polls


def test_ragged_polls_learn_what_one_learner_of_the_whole_stream_learns():
    data = _stream()
    whole = _model()
    expected = whole.learn_many(data.users, data.items, data.ratings)
    learner = _learner(_model())
    polls = _consume(learner, _messages(data))
    model = learner.service.recommender.model
    assert polls > 10 and int(model.dp_steps[0]) == -(-len(data.ratings) // BATCH)
    assert _same_model(model, whole)
    assert np.array_equal(np.concatenate(learner.predictions), expected)   # each at its step's start
    assert learner.book.pending == len(data.ratings)


def test_without_holding_back_ragged_polls_take_partial_noisy_steps():
    data = _stream()
    whole = _model()
    whole.learn_many(data.users, data.items, data.ratings)
    learner = _learner(_model(), whole=False)
    _consume(learner, _messages(data))
    model = learner.service.recommender.model
    assert int(model.dp_steps[0]) > int(whole.dp_steps[0]) + 5 and not _same_model(model, whole)


def test_a_rebalance_drops_the_held_messages_and_they_are_learned_once():
    data = _stream()
    whole = _model()
    whole.learn_many(data.users, data.items, data.ratings)
    learner = _learner(_model())
    messages = _messages(data)
    _consume(learner, messages, rebalance_at=3)
    assert learner.book.pending == len(data.ratings)   # nothing learned twice, nothing lost
    assert _same_model(learner.service.recommender.model, whole)


def test_messages_of_many_ratings_on_two_partitions_are_cut_at_whole_batches():
    data = _stream(1500)   # 30-rating messages: a whole number of batches every 10 of them
    parts = {TopicPartition("t", 0): _messages(data.take(slice(0, 900)), per_message=30),
             TopicPartition("t", 1): _messages(data.take(slice(900, 1500)), per_message=30)}
    learner = _learner(_model())
    model = learner.service.recommender.model
    for first, last, learned in ((0, 4, 0), (4, 9, 300), (9, 30, 1500)):
        learner.learn_poll({tp: msgs[first:last] for tp, msgs in parts.items()})
        assert learner.book.pending == learned and int(model.dp_steps[0]) == learned // BATCH
        for tp, msgs in parts.items():
            held = learner.whole.held.get(tp, [])
            expected = held[0].offset if held else min(last, len(msgs))
            assert learner.book.position(tp.partition) == (expected or None)
    assert not learner.whole.held


def test_counts_that_never_make_a_whole_batch_are_held_within_a_bound():
    learner = _learner(_model())
    model = learner.service.recommender.model
    messages = _messages(_stream(2000), per_message=7)   # whole batches every 700 ratings
    for first, last, learned, held in ((0, 50, 0, 50), (50, 230, 1400, 30), (230, 262, 1834, 0)):
        learner.learn_poll({TP: messages[first:last]})
        assert learner.book.pending == learned and len(learner.whole.held.get(TP, [])) == held
    # the last poll would have held 434 ratings, over the bound: learned in a partial step
    assert 1834 - 1400 > MAX_HELD_BATCHES * BATCH and int(model.dp_steps[0]) == 14 + 5


def test_a_partition_given_up_leaves_its_held_messages_to_its_next_owner():
    data = _stream(300)
    tp1 = TopicPartition("t", 1)
    first, second = _messages(data.take(slice(0, 200))), _messages(data.take(slice(200, 300)))
    learner = _learner(_model())
    learner.learn_poll({TP: first[:150], tp1: second[:30]})   # 100 learned; 50 + 30 held
    assert learner.book.pending == 100 and len(learner.whole.held[tp1]) == 30
    learner.forget_held([tp1])                                  # revoked, given to another member
    learner.learn_poll({TP: first[150:]})
    assert learner.book.pending == 200 and not learner.whole.held
    assert learner.book.position(1) is None   # nothing of it covered: its next owner reads it all
