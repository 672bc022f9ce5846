"""Step rules as values: how a factor model moves its parameters after each rating.

A rule is a small frozen value handed to the model, as river hands ``optim.SGD(0.025)`` to its
``BiasedMF``: ``SketchMF(steps=AdaGrad(0.2))``. Four rules: plain ``SGD``, per-coordinate
``AdaGrad``, ``AdaGradId`` (one AdaGrad sum per id) and ``SGLD`` (SGD steps plus Gaussian noise).
The first three are the optimizer axis of the capability table (``models.capabilities``,
``--optimizer``: ``OPTIMIZERS``); SGLD is its privacy axis's "sgld" column (``--sgld TAU``), so
SGLD with AdaGrad cannot even be written. A rule only names what the compiled kernels already
take (the optimizer's code in the hyper-parameter vector, its step eta, AdaGrad's start ``acc0``,
SGLD's temperature), so a model built from a rule learns bit for bit what the old keywords
``optimizer=``, ``lr=``, ``acc0=`` and ``sgld_temperature=`` made it learn; those keywords still
work and build the rule (``resolve``).

DP-SGD is not a step rule but a privacy mode (``dp=``, ``models.private.dp_sgd``): its noise is
calibrated to plain SGD steps of a clipped loss, and what it costs is accounted by the mode (its
ledger, its fallback, the release of every surface), which a rule cannot carry. A DP-SGD model
takes ``SGD`` steps; ``--sgld-dp`` is DP-SGD whose noise scale comes from an SGLD temperature.

A checkpoint records the rule as a dict with its ``rule`` name (``dataclasses.asdict``), and
``of`` reads it back. Which rule combines with what (DP-SGD takes plain SGD steps, only the
sketch model has AdaGrad) stays the capability table's and the model's call.

>>> AdaGrad(0.2)
AdaGrad(lr=0.2, acc0=1.0)
>>> of({"rule": "adagrad-id", "lr": 0.1, "acc0": 1.0}) == AdaGradId(0.1)
True
>>> named("sgd", 0.05).optimizer, SGD().lr
('sgd', 0.03)
>>> resolve(None, "sgd", 0.05, 1.0, temperature=0.001)   # the old keywords of an SGLD model
SGLD(lr=0.05, temperature=0.001)
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Union

__all__ = ["SGD", "AdaGrad", "AdaGradId", "SGLD", "StepRule", "of", "named", "resolve"]


def _positive(rule: str, name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            math.isfinite(value) and value > 0):
        raise ValueError(f"{rule}: {name} must be a positive finite number, not {value!r}")


@dataclass(frozen=True)
class SGD:
    """Plain SGD: each parameter moves by ``lr`` times its gradient (the thesis's steps; the ones
    DP-SGD takes, its noise being calibrated to them).

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

    @property
    def temperature(self) -> None:
        """No SGLD noise."""
        return None


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

    @property
    def temperature(self) -> None:
        """No SGLD noise (SGLD takes plain SGD steps)."""
        return None


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


@dataclass(frozen=True)
class SGLD:
    """Stochastic gradient Langevin dynamics: a plain SGD step, then Gaussian noise of variance
    ``lr x temperature`` added to every parameter the step touched (thesis eq. 2.13/2.14; on a
    sketch each of a component's k cells gets the k-fold variance, so the estimate's noise is the
    same). The model samples from a tempered posterior rather than settling on one point.

    The noise is drawn by the compiled kernels from numba's generator, given a whole fresh state
    before every batch (624 words from a generator keyed by 128 fresh secret bits of the OS
    CSPRNG, ``privacy.entropy``) in the thread that learns: never the model's ``seed`` nor a
    searchable 32-bit seed, so two runs with one seed differ. SGLD alone proves no privacy bound (the
    "sgld" mode of ``privacy.mode``); ``--sgld-dp`` is the accounted mode.

    Parameters
    ----------
    lr : the step eta (decayed over epochs by the model's ``lr_schedule_T``; the noise follows it).
    temperature : tau > 0 (``--sgld TAU``; 0 is plain ``SGD``).

    Examples
    --------
    >>> from sketchrec.models import SketchMF
    >>> model = SketchMF(dim=4, capacity=20, steps=SGLD(0.05, temperature=0.001))
    >>> model.sgld_temperature, model.optimizer, model.privacy_mode.value
    (0.001, 'sgd', 'sgld')
    >>> SketchMF(dim=4, capacity=20, sgld_temperature=0.001, lr=0.05).steps   # the old keyword
    SGLD(lr=0.05, temperature=0.001)
    """

    lr: float
    temperature: float
    rule: str = field(default="sgld", init=False, repr=False)

    def __post_init__(self) -> None:
        _positive(type(self).__name__, "lr", self.lr)
        _positive(type(self).__name__, "temperature", self.temperature)

    @property
    def optimizer(self) -> str:
        """The kernels' steps: plain SGD (the temperature is the kernels' noise switch)."""
        return "sgd"

    @property
    def acc0(self) -> float:
        """AdaGrad's start, unread (as for ``SGD``)."""
        return 1.0


StepRule = Union[SGD, AdaGrad, AdaGradId, SGLD]
# the optimizer axis (--optimizer): the noiseless rules; SGLD is the privacy axis's "sgld" column
OPTIMIZERS: dict[str, type] = {"sgd": SGD, "adagrad": AdaGrad, "adagrad-id": AdaGradId}
RULES: dict[str, type] = {**OPTIMIZERS, "sgld": SGLD}
_SPELLING = "SGD(lr), AdaGrad(lr, acc0), AdaGradId(lr, acc0) or SGLD(lr, temperature)"


def of(value: "StepRule | dict") -> StepRule:
    """A rule from itself or from the dict a checkpoint recorded (``{"rule": name, ...}``)."""
    if isinstance(value, (SGD, AdaGrad, SGLD)):
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
    cls = OPTIMIZERS.get(optimizer)
    if cls is None:
        raise ValueError(f"optimizer must be one of {sorted(OPTIMIZERS)}, not {optimizer!r}")
    given = {"lr": lr} if lr is not None else {}
    if cls is SGD:
        _positive(optimizer, "acc0", acc0)   # the old keyword was checked for every optimizer
        return SGD(**given)
    return cls(**given, acc0=acc0)


def noisy(rule: StepRule, temperature: float | None) -> StepRule:
    """``rule`` with SGLD's noise at ``temperature`` (the CLI's ``--sgld TAU``): ``SGLD(lr, tau)``
    from plain SGD; ``rule`` itself at no temperature (None or 0: no noise, as the kernels read
    it). Refuses a rule SGLD cannot take.

    >>> noisy(SGD(0.05), 0.01), noisy(SGD(0.05), 0)
    (SGLD(lr=0.05, temperature=0.01), SGD(lr=0.05))
    """
    temperature = _temperature(temperature)
    if temperature is None or rule.temperature == temperature:
        return rule
    if type(rule) is not SGD:
        raise ValueError(f"SGLD takes plain SGD steps (its noise is calibrated to them), not "
                         f"{rule!r}: give steps=SGLD(lr, temperature)")
    return SGLD(rule.lr, temperature)


def _temperature(value: float | None) -> float | None:
    """SGLD's temperature as a rule holds it: None for no noise (None or 0)."""
    if value is not None and (isinstance(value, bool) or not value >= 0):
        raise ValueError(f"sgld_temperature must be non-negative, not {value!r}")
    return float(value) if value else None


def resolve(steps: "StepRule | dict | None", optimizer: str, lr: float, acc0: float,
            temperature: float | None = None,
            defaults: tuple = ("sgd", 0.03, 1.0, None)) -> StepRule:
    """The model's rule: ``steps`` when given, else the one the old keywords name (``temperature``
    is ``sgld_temperature=``). With ``steps`` the old keywords must be left at their ``defaults``
    or agree with it: a disagreement refuses rather than one of them being dropped silently."""
    if steps is None:
        return noisy(named(optimizer, lr, acc0), temperature)
    rule, temperature = of(steps), _temperature(temperature)
    given = (optimizer, lr, acc0, temperature)
    for name, value, default in zip(("optimizer", "lr", "acc0", "temperature"), given, defaults):
        if value != default and value != getattr(rule, name):
            if name == "temperature" and isinstance(rule, AdaGrad):
                noisy(rule, value)   # the one-line reason: SGLD takes plain SGD steps
            keyword = "sgld_temperature" if name == "temperature" else name
            raise ValueError(f"steps={rule!r} and {keyword}={value!r} disagree: give the step "
                             f"rule alone (steps=...) or the keywords alone")
    return rule
