"""The fleet member changes the consumer's loop only through its public extension points: a
rename or a new private hook in ``KafkaLearner`` cannot silently stop being called for it."""

import inspect

import pytest

from sketchrec.stream.fleet.member import FleetLearner
from sketchrec.stream.kafka.consumer import KafkaLearner
from sketchrec.stream.kafka.offsets import OffsetBook


def _overridden(cls) -> set[str]:
    return {name for name, value in vars(cls).items()
            if callable(value) and name != "__init__" and hasattr(KafkaLearner, name)}


def test_the_fleet_member_overrides_only_the_consumers_extension_points():
    assert _overridden(FleetLearner) == set(KafkaLearner.EXTENSION_POINTS)
    for name in KafkaLearner.EXTENSION_POINTS:   # each is documented and called by the loop
        assert not name.startswith("_") and inspect.getdoc(getattr(KafkaLearner, name))
    loop = inspect.getsource(KafkaLearner)
    for name in ("resume_partitions", "learn_poll", "tally", "after_poll", "checkpoint"):
        assert f".{name}(" in loop


def test_a_class_overriding_a_private_hook_is_seen():
    class Broken(KafkaLearner):
        def _watch(self, records=None):   # private: the kind of override the check refuses
            pass
    assert not _overridden(Broken) <= set(KafkaLearner.EXTENSION_POINTS)


def test_the_books_pending_count_is_public_and_read_only():
    book = OffsetBook({}, every=10)
    book.store({0: 5}, handled=4)
    assert book.pending == 4
    book.checkpointed()
    assert book.pending == 0
    with pytest.raises(AttributeError):
        book.pending = 3   # the book's own count
