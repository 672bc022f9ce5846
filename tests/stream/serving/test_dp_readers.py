"""A DP-SGD model's private fallback in the shared block: a reader answers what the learner
answers, whichever model the DP choice picked, and follows a new release once it is published."""

import numpy as np
import pytest

from sketchrec.data import SyntheticStream
from sketchrec.models import SketchMF
from sketchrec.models.private.dp_sgd import DPConfig
from sketchrec.models.private.fallback import DPSGDFallback
from sketchrec.stream.recommender import Recommender
from sketchrec.stream.serving.workers.binding import ReleasedFallback, publish_release
from sketchrec.stream.serving.workers.block import SharedBlock, shareable

USERS, ITEMS = np.repeat(np.arange(1, 41), 30), np.tile(np.arange(1, 31), 40)


@pytest.fixture
def learner():
    """A DP-SGD fallback past two releases (reproducible noise: a debug seed)."""
    data = SyntheticStream(32_000, n_users=300, n_items=200, seed=4).all()
    model = DPSGDFallback(SketchMF(dim=8, capacity=600, dp=DPConfig(1.0, batch_size=500,
                                                                    debug_noise_seed=7)), width=512)
    rec = Recommender(model, pair_capacity=50_000, user_capacity=2_000)
    rec.learn_many(data.users[:22_000], data.items[:22_000], data.ratings[:22_000])
    assert model.windows == 2
    block = SharedBlock.create(rec)
    yield rec, block, data
    block.unlink()


def _reader(block):
    return SharedBlock.attach(block.name).model()


def test_a_reader_answers_as_the_learner_under_either_choice(learner):
    rec, block, _ = learner
    fallback, reader = rec.model, _reader(block)
    assert shareable(rec) and isinstance(reader, ReleasedFallback)
    for choice in (True, False):
        fallback.chose_factors = choice   # as a window's choice would set it
        publish_release(fallback)
        assert reader.chose_factors is choice
        assert np.array_equal(reader.predict_many(USERS, ITEMS), fallback.predict_many(USERS, ITEMS))
        assert reader.global_mean == fallback.global_mean
        assert np.array_equal(reader.score_items(USERS[0], ITEMS[:30]), fallback.score_items(USERS[0], ITEMS[:30]))
    # the baseline answers differ from the factor model's: a reader serving the bare DP-SGD model
    # (the shared arrays without the released state) would answer other ratings
    bare = reader.model
    assert not np.allclose(bare.predict_many(USERS, ITEMS), fallback.predict_many(USERS, ITEMS))
    assert not publish_release(fallback)   # nothing new: nothing copied


def test_a_new_release_reaches_the_reader_once_published(learner):
    rec, block, data = learner
    fallback, reader = rec.model, _reader(block)
    fallback.chose_factors = False   # the baseline answers: every release shows
    publish_release(fallback)
    before = reader.predict_many(USERS, ITEMS)
    rec.learn_many(data.users[22_000:], data.items[22_000:], data.ratings[22_000:])   # a third window
    assert fallback.windows == 3
    fallback.chose_factors = False
    assert np.array_equal(reader.predict_many(USERS, ITEMS), before)   # not published yet
    assert publish_release(fallback)
    after = reader.predict_many(USERS, ITEMS)
    assert np.array_equal(after, fallback.predict_many(USERS, ITEMS))
    assert not np.array_equal(after, before)
