"""ServingSource (stream.serving.source): every served thing implements it, the app reads nothing
else and refuses what is not one in one line."""

import ast
from pathlib import Path

import numpy as np
import pytest

from sketchrec.data import SyntheticStream
from sketchrec.models import SketchMF
from sketchrec.models.private.joint_als import JointDPConfig, PrivateALS
from sketchrec.stream.checkpoint import CheckpointStore
from sketchrec.stream.feedback import DirectFeedback, Refusal
from sketchrec.stream.recommender import Recommender
from sketchrec.stream.service import LearningService
from sketchrec.stream.serving import http
from sketchrec.stream.serving.feedback import feedback_of
from sketchrec.stream.serving.joint import JointRecommender, JointService
from sketchrec.stream.serving.source import ServingSource, missing_members
from sketchrec.stream.serving.workers.block import SharedBlock
from sketchrec.stream.serving.workers.reader import ReplicaService

DATA = SyntheticStream(3000, n_users=100, n_items=60, seed=2).all()


def _learning(**kwargs) -> LearningService:
    rec = Recommender(SketchMF(dim=4, capacity=200, seed=0), pair_capacity=10_000, seed=0)
    rec.learn_many(DATA.users, DATA.items, DATA.ratings)
    return LearningService(rec, **kwargs)


@pytest.fixture
def sources(tmp_path):
    learning = _learning(checkpoints=CheckpointStore(tmp_path))
    learning.checkpoint()
    replica = LearningService.from_checkpoint(tmp_path)   # serve --checkpoint
    joint = JointService(JointRecommender(PrivateALS(JointDPConfig(epsilon=8.0, rank=2, cap=40),
                                                     np.unique(DATA.items)).fit(
        DATA.users, DATA.items, DATA.ratings), DATA))
    block = SharedBlock.create(learning.recommender, catalogue_capacity=64)
    try:
        reader = ReplicaService(SharedBlock.attach(block.name))
        yield {"learning": learning, "checkpoint replica": replica, "joint": joint, "reader": reader}
    finally:
        block.unlink()


def test_every_served_thing_is_a_serving_source(sources):
    for name, source in sources.items():
        assert isinstance(source, ServingSource) and missing_members(source) == [], name


def test_each_source_declares_how_it_takes_posted_ratings(sources):
    assert isinstance(feedback_of(sources["learning"]), DirectFeedback)
    for name, why in [("checkpoint replica", "read-only"), ("reader", "readers")]:
        refusal = feedback_of(sources[name])
        assert isinstance(refusal, Refusal) and refusal == Refusal(why), name


def test_the_app_imports_no_concrete_service():
    tree = ast.parse(Path(http.__file__).read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert "sketchrec.stream.serving.source" in imported
    assert not imported & {"sketchrec.stream.service", "sketchrec.stream.serving.joint",
                           "sketchrec.stream.serving.workers.reader", "sketchrec.stream.fleet.replicas"}


def test_what_is_not_a_source_is_refused_in_one_line():
    class NoFeedback:   # the broken variant: a service that never says how it takes ratings
        def __init__(self, service):
            for name in ("recommender", "health", "read_only", "checkpoints", "origin", "stats",
                         "privacy", "checkpoint", "pause", "resume", "warm_up"):
                setattr(self, name, getattr(service, name))

    broken = NoFeedback(_learning())
    assert missing_members(broken) == ["feedback"]
    with pytest.raises(TypeError, match="NoFeedback is not a ServingSource: it lacks feedback") as refused:
        http.create_app(broken)
    assert "\n" not in str(refused.value)
    broken.feedback = None   # declared: the app learns posted ratings directly
    assert http.create_app(broken) is not None
