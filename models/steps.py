"""Step rules as values: how a factor model moves its parameters after each rating.

A rule is a small frozen value handed to the model, as river hands ``optim.SGD(0.025)`` to its
``BiasedMF``: ``SketchMF(steps=AdaGrad(0.2))``. The three rules are the optimizer axis of the
capability table (``models.capabilities``): plain ``SGD``, per-coordinate ``AdaGrad`` and
``AdaGradId`` (one AdaGrad sum per id). A rule only names what the compiled kernels already take
(the optimizer's code in the hyper-parameter vector, its step eta and AdaGrad's start ``acc0``),
so a model built from a rule learns bit for bit what the old keywords ``optimizer=``, ``lr=`` and
``acc0=`` made it learn; those keywords still work and build the rule (``resolve``).

A checkpoint records the rule as a dict with its ``rule`` name (``dataclasses.asdict``), and
``of`` reads it back. Which rule combines with what (DP-SGD and SGLD take plain SGD steps, only
the sketch model has AdaGrad) stays the capability table's and the model's call.

>>> AdaGrad(0.2)
AdaGrad(lr=0.2, acc0=1.0)
>>> of({"rule": "adagrad-id", "lr": 0.1, "acc0": 1.0}) == AdaGradId(0.1)
True
>>> named("sgd", 0.05).optimizer, SGD().lr
('sgd', 0.03)
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Union

__all__ = ["SGD", "AdaGrad", "AdaGradId", "StepRule", "of", "named", "resolve"]


def _positive(rule: str, name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            math.isfinite(value) and value > 0):
        raise ValueError(f"{rule}: {name} must be a positive finite number, not {value!r}")


@dataclass(frozen=True)
class SGD:
    """Plain SGD: each parameter moves by ``lr`` times its gradient (the thesis's steps; the only
    rule DP-SGD and SGLD take, their noise being calibrated to it).

    Parameters
    ----------
    lr : the step eta (decayed over epochs by the model's ``lr_schedule_T``).

    Examples
    --------
    >>> from sketchrec.models import SketchMF
    >>> SketchMF(dim=4, capacity=20, steps=SGD(0.05)).lr
    0.05
    """

    lr: float = 0.03
    rule: str = field(default="sgd", init=False, repr=False)

    def __post_init__(self) -> None:
        _positive(type(self).__name__, "lr", self.lr)

    @property
    def optimizer(self) -> str:
        """The kernels' name for this rule (``models._adaptive.OPTIMIZERS``)."""
        return self.rule

    @property
    def acc0(self) -> float:
        """AdaGrad's start, which plain SGD does not read (the kernels take a value anyway)."""
        return 1.0


@dataclass(frozen=True)
class AdaGrad:
    """AdaGrad per coordinate: a parameter's step is ``lr g / sqrt(acc0 + G)``, G the running sum
    of its squared gradients, kept in a count-min sketch the shape of the vectors' (twice their
    memory; ``models._adaptive``). Sketch model only.

    Parameters
    ----------
    lr : AdaGrad's eta.
    acc0 : the sums' start, a damping that keeps a new id's first steps at most ``lr / sqrt(acc0)``.

    Examples
    --------
    >>> from sketchrec.models import SketchMF
    >>> model = SketchMF(dim=4, capacity=20, steps=AdaGrad(0.2))
    >>> model.optimizer, model.lr, model.steps
    ('adagrad', 0.2, AdaGrad(lr=0.2, acc0=1.0))
    """

    lr: float = 0.2
    acc0: float = 1.0
    rule: str = field(default="adagrad", init=False, repr=False)

    def __post_init__(self) -> None:
        _positive(type(self).__name__, "lr", self.lr)
        _positive(type(self).__name__, "acc0", self.acc0)

    @property
    def optimizer(self) -> str:
        """The kernels' name for this rule (``models._adaptive.OPTIMIZERS``)."""
        return self.rule


@dataclass(frozen=True)
class AdaGradId(AdaGrad):
    """AdaGrad with one sum per id (one for its vector, one for its bias) in a count-min the size
    of the bias sketch: as fast as SGD, little memory. Sketch model only.

    Parameters
    ----------
    lr : AdaGrad's eta.
    acc0 : the sums' start (as ``AdaGrad``'s).

    Examples
    --------
    >>> from sketchrec.models import SketchMF
    >>> SketchMF(dim=4, capacity=20, steps=AdaGradId(0.2)).optimizer
    'adagrad-id'
    """

    rule: str = field(default="adagrad-id", init=False, repr=False)


StepRule = Union[SGD, AdaGrad, AdaGradId]
RULES: dict[str, type] = {"sgd": SGD, "adagrad": AdaGrad, "adagrad-id": AdaGradId}
_SPELLING = "SGD(lr), AdaGrad(lr, acc0) or AdaGradId(lr, acc0)"


def of(value: "StepRule | dict") -> StepRule:
    """A rule from itself or from the dict a checkpoint recorded (``{"rule": name, ...}``)."""
    if isinstance(value, (SGD, AdaGrad)):
        return value
    if isinstance(value, dict) and value.get("rule") in RULES:
        cls = RULES[value["rule"]]
        names = {f.name for f in dataclasses.fields(cls) if f.init}
        unknown = set(value) - names - {"rule"}
        if unknown:
            raise ValueError(f"steps: {cls.__name__} takes no {', '.join(sorted(unknown))}")
        return cls(**{name: value[name] for name in names if name in value})
    raise ValueError(f"steps must be {_SPELLING}, not {value!r}")


def named(optimizer: str, lr: float | None = None, acc0: float = 1.0) -> StepRule:
    """The rule the CLI's ``--optimizer NAME --lr X`` (or the old keywords) name; ``lr`` None: the
    rule's own default step."""
    cls = RULES.get(optimizer)
    if cls is None:
        raise ValueError(f"optimizer must be one of {sorted(RULES)}, not {optimizer!r}")
    given = {"lr": lr} if lr is not None else {}
    if cls is SGD:
        _positive(optimizer, "acc0", acc0)   # the old keyword was checked for every optimizer
        return SGD(**given)
    return cls(**given, acc0=acc0)


def resolve(steps: "StepRule | dict | None", optimizer: str, lr: float, acc0: float,
            defaults: tuple[str, float, float] = ("sgd", 0.03, 1.0)) -> StepRule:
    """The model's rule: ``steps`` when given, else the one the old keywords name. With ``steps``
    the old keywords must be left at their ``defaults`` or agree with it: a disagreement refuses
    rather than one of them being dropped silently."""
    if steps is None:
        return named(optimizer, lr, acc0)
    rule = of(steps)
    for name, given, default in zip(("optimizer", "lr", "acc0"), (optimizer, lr, acc0), defaults):
        if given != default and given != getattr(rule, name):
            raise ValueError(f"steps={rule!r} and {name}={given!r} disagree: give the step rule "
                             f"alone (steps=...) or the keywords alone")
    return rule
