"""A DP fleet member's chunks hold back what is past their last whole noisy batch
(``kafka.whole_batches``) and still learn about ``sync_ratings`` per chunk: the member measures
ratings per message from what a chunk read, not from what it learned (a first chunk held back
whole learned nothing, which read as one rating per message and made the next chunk three times
too large)."""

import threading
import time
import types
from collections import Counter

from kafka import TopicPartition

from sketchrec import SketchMF
from sketchrec.models.metrics import ErrorStats
from sketchrec.models.private.dp_sgd import DPConfig
from sketchrec.stream.fleet.member import FleetLearner
from sketchrec.stream.kafka.offsets import OffsetBook
from sketchrec.stream.kafka.whole_batches import WholeBatches

NS = types.SimpleNamespace


def _member(model, learned: list) -> FleetLearner:
    """FleetLearner.learn_poll without a broker: no pace, no model topic, no publish."""
    member = FleetLearner.__new__(FleetLearner)
    learning = threading.Event()
    learning.set()

    def learn_many(users, items, ratings):
        learned.append(len(ratings))
        return model.learn_many(users, items, ratings)
    member.service = NS(recommender=NS(learn_many=learn_many, learning=learning, model=model),
                        budget_stopped=False, record_origin=lambda headers, n: None)
    member.state, member.refusal, member.fenced, member.stop = NS(dp=None), None, None, threading.Event()
    member.rating_range, member.whole = (1.0, 5.0), WholeBatches.of(model, (1.0, 5.0))
    member.book = OffsetBook({}, every=10**9, seconds=1e9)
    member.errors, member.skipped_since, member.dead_letters = ErrorStats(), Counter(), Counter()
    member.per_message, member.chunk_ratings, member.max_poll = None, 300, 20_000
    member.own, member.first_at, member.progress = 0, time.time(), [(time.time(), 0)]
    member.consumer = NS(config={})
    member._pace = lambda: None
    member.after_poll = lambda read=None: None
    return member


def test_a_dp_members_chunks_stay_at_the_sync_size_while_it_holds_messages_back():
    model = SketchMF(dim=4, capacity=400, seed=0, dp=DPConfig(1.0, batch_size=100, debug_noise_seed=2))
    rows = [NS(value=f"{n % 50},{n % 30},4\n{n % 40},{n % 20},3\n{n % 7},{n % 9},5".encode(),
               offset=n, headers=[], key=None) for n in range(200)]   # 3 ratings a message
    learned: list = []
    member = _member(model, learned)
    member.learn_poll({TopicPartition("t", 0): rows})
    # chunks of 1 message (held back whole), then 100 and 99 (each with the one held before)
    assert member.per_message == 3.0
    assert learned == [300, 300] and int(model.dp_steps[0]) == 6 and not member.whole.held
