"""The Kafka consumer's offset book: per-partition positions and the checkpoint cadence."""

import types

from sketchrec.stream.kafka.offsets import OffsetBook


def test_a_checkpoint_is_due_after_every_n_ratings():
    book = OffsetBook({}, every=100, seconds=3600)
    book.store({0: 60}, handled=60)
    assert not book.expired()
    book.store({0: 100}, handled=40)
    assert book.expired()
    book.checkpointed()
    assert not book.expired()


def test_a_checkpoint_is_due_after_t_seconds_only_if_something_arrived(monkeypatch):
    from sketchrec.stream.kafka import offsets
    now = [100.0]   # the book's clock, moved by the test alone: no margin for a loaded machine
    monkeypatch.setattr(offsets, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
    book = OffsetBook({}, every=10**9, seconds=30)
    now[0] += 31
    assert not book.expired()            # nothing to save: no empty checkpoints
    book.store({1: 5}, handled=1)
    assert book.expired()
    book.checkpointed()
    book.store({1: 6}, handled=1)
    assert not book.expired()            # the clock restarted at the checkpoint
    now[0] += 29
    assert not book.expired()
    now[0] += 2
    assert book.expired()


def test_offsets_are_the_services_dict_and_commit_only_assigned_partitions():
    shared = {"0": 7}                    # as LearningService.offsets, restored from a checkpoint
    book = OffsetBook(shared, every=10, seconds=10)
    assert book.position(0) == 7 and book.position(3) is None
    book.store({0: 9, 2: 4}, handled=3)
    assert shared == {"0": 9, "2": 4}    # written in place: checkpoints and /stats see it
    assert book.to_commit({2, 5}) == {2: 4}
