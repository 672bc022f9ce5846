"""The StateSink: the consumer's loop writes its state through whichever sink it holds (local
checkpoints or a fleet member's snapshots), logs what the sink wrote, and keeps going when a write
fails."""

import collections
import logging
import types

import pytest

from sketchrec.models.bias_baseline import BiasBaseline
from sketchrec.stream.checkpoint import CheckpointStore
from sketchrec.stream.kafka.consumer import KafkaLearner
from sketchrec.stream.kafka.offsets import OffsetBook
from sketchrec.stream.recommender import Recommender
from sketchrec.stream.service import LearningService
from sketchrec.stream.sink import LocalCheckpoints, StateSink, Written, require_sink


class Memory:
    """A sink of the test's own: the loop must not care that it is neither of the product's."""

    kind, records_offsets = "snapshot", False

    def __init__(self, fail: bool = False):
        self.writes, self.fail = 0, fail

    def write(self) -> Written:
        if self.fail:
            raise OSError("the sink is gone")
        self.writes += 1
        return Written(f"mem-{self.writes}", 7, {"offset": self.writes})


def _service(directory=None) -> LearningService:
    store = CheckpointStore(directory) if directory is not None else None
    return LearningService(Recommender(BiasBaseline(), pair_capacity=100), store, read_only=False)


def _learner(service, sink) -> KafkaLearner:
    """The loop's writing half, without a broker (its connection is not what is tested)."""
    learner = KafkaLearner.__new__(KafkaLearner)
    learner.service, learner.group, learner.health, learner.sink = service, None, service.health, sink
    learner.producer = types.SimpleNamespace(flush=lambda timeout: None)
    learner.book = OffsetBook(service.offsets, every=10, seconds=60)
    learner.dead_letters = collections.Counter()
    return learner


def test_the_loop_writes_through_whichever_sink_it_holds(tmp_path, caplog):
    local = _learner(_service(tmp_path), LocalCheckpoints(_service(tmp_path)))
    other = _learner(_service(), Memory())
    with caplog.at_level(logging.INFO, logger="sketchrec"):
        assert local.checkpoint("interval") and other.checkpoint("interval")
    assert len(CheckpointStore(tmp_path).paths()) == 1 and other.sink.writes == 1
    lines = [r.getMessage() for r in caplog.records]
    assert any("event=checkpoint why=interval" in line and "ratings=0" in line for line in lines)
    assert any("event=snapshot why=interval name=mem-1 ratings=7 offset=1" in line for line in lines)


def test_a_failed_write_is_one_line_and_the_next_cadence_retries(caplog):
    learner = _learner(_service(), Memory(fail=True))
    learner.book.store({0: 20}, handled=20)
    with caplog.at_level(logging.INFO, logger="sketchrec"):
        assert learner.checkpoint("interval") is False
    assert "the sink is gone" in learner.health.checkpoint_error and not learner.book.expired()
    learner.sink.fail = False
    assert learner.checkpoint("interval") is True and learner.health.checkpoint_error is None


def test_a_consumer_whose_state_has_nowhere_to_go_is_refused_before_connecting(tmp_path):
    with pytest.raises(ValueError, match="needs a checkpoint directory"):
        KafkaLearner(_service(), "localhost:1", "ratings")   # no broker contacted: refused first
    with pytest.raises(TypeError, match=r"^not a StateSink \(missing: kind, records_offsets\)"):
        require_sink(types.SimpleNamespace(write=lambda: None))
    assert isinstance(LocalCheckpoints(_service(tmp_path)), StateSink)
