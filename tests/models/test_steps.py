"""Step rules as values (models.steps): the same learning as the old keywords, recorded in
checkpoints, built by the CLI, and refused in one line when wrong."""

import numpy as np
import pytest

from sketchrec.models import SGD, AdaGrad, AdaGradId, SketchMF
from sketchrec.models import steps as step_rules
from sketchrec.models.registry import ADAGRAD_DEFAULTS, DEFAULTS
from sketchrec.sketches import serial

RULES_AND_KEYWORDS = [
    (SGD(0.05), dict(optimizer="sgd", lr=0.05)),
    (AdaGrad(0.2, acc0=2.0), dict(optimizer="adagrad", lr=0.2, acc0=2.0)),
    (AdaGradId(0.1), dict(optimizer="adagrad-id", lr=0.1)),
]


def _stream(n=400, seed=3):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 30, n), rng.integers(0, 40, n), rng.integers(1, 6, n).astype(float)


def _learned(**kwargs):
    model = SketchMF(dim=8, capacity=70, seed=1, **kwargs)
    users, items, ratings = _stream()
    return model, model.learn_many(users, items, ratings)


@pytest.mark.parametrize("rule, keywords", RULES_AND_KEYWORDS, ids=lambda v: repr(v))
def test_a_rule_learns_bit_for_bit_what_its_old_keywords_learn(rule, keywords):
    by_rule, predicted = _learned(steps=rule)
    by_keywords, predicted_old = _learned(**keywords)
    assert by_rule.steps == by_keywords.steps == rule
    assert predicted.tobytes() == predicted_old.tobytes()
    assert by_rule.to_bytes() == by_keywords.to_bytes()


def test_the_rule_decides_the_steps():
    # the test above would pass if steps= were ignored and every model took SGD's steps: not so
    outputs = {name: _learned(steps=rule)[1].tobytes()
               for name, rule in [("sgd", SGD(0.1)), ("adagrad", AdaGrad(0.1)), ("id", AdaGradId(0.1))]}
    assert len(set(outputs.values())) == 3


def test_a_checkpoint_records_the_rule_and_an_old_one_still_loads():
    model, _ = _learned(steps=AdaGradId(0.1, acc0=0.5))
    assert model.params()["steps"] == {"rule": "adagrad-id", "lr": 0.1, "acc0": 0.5}
    restored = SketchMF.from_bytes(model.to_bytes())
    assert restored.steps == AdaGradId(0.1, acc0=0.5) and restored.to_bytes() == model.to_bytes()
    # a blob written before step rules: no "steps", the old keywords alone
    params, arrays = serial.unpack(model.to_bytes(), "SketchMF")
    del params["steps"]
    old = SketchMF.from_bytes(serial.pack("SketchMF", params, arrays))
    assert old.steps == AdaGradId(0.1, acc0=0.5)


def test_the_cli_builds_the_rule_from_optimizer_and_lr():
    from sketchrec.cli.config import ModelSettings
    from sketchrec.cli.replay import build_parser

    def built(*argv):
        return ModelSettings.from_args(build_parser().parse_args(list(argv)), private=False).build(100)
    assert built("--model", "sketch").steps == SGD(DEFAULTS["lr"])
    assert built("--model", "sketch", "--optimizer", "adagrad-id").steps == AdaGradId(ADAGRAD_DEFAULTS["lr"])
    assert built("--optimizer", "adagrad", "--lr", "0.1").steps == AdaGrad(0.1)


def test_the_rules_default_steps_are_the_tuned_ones():
    assert SGD().lr == DEFAULTS["lr"] and AdaGrad().lr == AdaGradId().lr == ADAGRAD_DEFAULTS["lr"]


@pytest.mark.parametrize("build, says", [
    (lambda: SketchMF(steps="adam"), "steps must be SGD(lr), AdaGrad(lr, acc0) or AdaGradId"),
    (lambda: SketchMF(steps=AdaGrad(0.2), optimizer="adagrad-id"), "disagree"),
    (lambda: SketchMF(steps=SGD(0.1), lr=0.5), "disagree"),
    (lambda: SGD(-1.0), "SGD: lr must be a positive finite number"),
    (lambda: AdaGrad(0.1, acc0=float("nan")), "AdaGrad: acc0 must be a positive finite number"),
    (lambda: SketchMF(optimizer="adam"), "optimizer must be one of"),
    (lambda: SketchMF(steps={"rule": "sgd", "lr": 0.1, "momentum": 0.9}), "SGD takes no momentum"),
    (lambda: SketchMF(steps=AdaGrad(0.2), sgld_temperature=1.0), "take plain SGD steps"),
])
def test_a_wrong_rule_is_refused_in_one_line(build, says):
    with pytest.raises(ValueError, match=says.replace("(", r"\(").replace(")", r"\)")) as caught:
        build()
    assert "\n" not in str(caught.value)


def test_rules_are_frozen_values():
    rule = AdaGrad(0.2)
    with pytest.raises(AttributeError):
        rule.lr = 0.3
    assert rule == AdaGrad(0.2) != AdaGradId(0.2) and step_rules.of(rule) is rule


def test_a_rate_set_after_construction_is_the_rules_and_the_checkpoint_loads():
    # an epoch plan sets lr on a built model (models.mix): the recorded rule must follow it, or
    # the checkpoint's rule and lr disagree and it cannot be loaded
    model, _ = _learned(steps=AdaGradId(0.2))
    model.lr = 0.07
    assert model.steps == AdaGradId(0.07) and model.hyper()[0] == 0.07
    assert SketchMF.from_bytes(model.to_bytes()).steps == AdaGradId(0.07)
    with pytest.raises(AttributeError):
        model.optimizer = "sgd"   # the rule's kind is chosen at construction (steps=)
