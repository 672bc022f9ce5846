"""Ctrl-C during a served replay's batch: the summary counts what the served model learned."""

import signal

import pytest

from sketchrec.data import SyntheticStream
from sketchrec.models import SketchMF
from sketchrec.replay.interrupts import batch_whole
from sketchrec.replay.protocols import prequential
from sketchrec.stream.recommender import Recommender
from sketchrec.stream.service import FeedingLearner, LearningService


@pytest.fixture()
def python_sigint():
    """SIGINT raises KeyboardInterrupt in this process for the test, whatever the runner set."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def served_replay_interrupted_after_the_kernel(at_batch: int) -> tuple[dict, LearningService]:
    """A served replay (the learner ``replay --serve`` uses) whose ``at_batch``-th batch gets a
    SIGINT once the model has learned it, while the serving structures are still being updated
    (where a first batch loads their kernels): the window the summary used to lose."""
    service = LearningService(Recommender(SketchMF(dim=4, capacity=200, seed=0), pair_capacity=5000))
    seen = []

    def ctrl_c_after_the_model_learned(ukeys, ikeys, real):
        seen.append(len(ukeys))
        if len(seen) == at_batch:
            signal.raise_signal(signal.SIGINT)

    service.recommender.observers.append(ctrl_c_after_the_model_learned)
    batches = SyntheticStream(1000, 50, 40, seed=1).batches(100)
    return prequential(FeedingLearner(service), batches), service


def test_a_ctrl_c_inside_a_batch_is_held_until_the_batch_is_counted(python_sigint):
    result, service = served_replay_interrupted_after_the_kernel(at_batch=3)
    assert result["interrupted"]
    # what /stats said the model learned is what the summary says, errors included
    assert result["ratings"] == service.ratings_learned == 300 == service.errors.n


def test_without_the_hold_the_batch_is_learned_but_not_counted(python_sigint, monkeypatch):
    """The broken variant: a KeyboardInterrupt raised where it lands, mid-batch."""
    import contextlib

    from sketchrec.replay import protocols
    monkeypatch.setattr(protocols, "batch_whole", contextlib.nullcontext)
    result, service = served_replay_interrupted_after_the_kernel(at_batch=3)
    assert result["interrupted"] and result["ratings"] == 200 and service.ratings_learned == 300


def test_a_second_ctrl_c_within_a_batch_stops_at_once(python_sigint):
    reached = []
    with pytest.raises(KeyboardInterrupt):
        with batch_whole():
            signal.raise_signal(signal.SIGINT)
            reached.append("held")
            signal.raise_signal(signal.SIGINT)
            reached.append("not reached")
    assert reached == ["held"] and signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_outside_the_main_thread_the_body_runs_as_it_is():
    import threading
    done = []
    thread = threading.Thread(target=lambda: done.append(_in_batch()))
    thread.start()
    thread.join()
    assert done == [True]


def _in_batch() -> bool:
    with batch_whole():   # signal.signal would raise ValueError outside the main thread
        return True
