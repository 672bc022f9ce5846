"""A training run's privacy mode as a value: what it protects, from whom, by which mechanisms, and
how each surface the running system shows is made public.

This is the one table of privacy modes. The CLI's refusals, the capability table
(``sketchrec.capabilities``), /privacy, the release boundary (``privacy.release``) and the
neighbour-difference tests all read it, so a mode added here is checked the day it is added.

A mode is classified once, from a learner's settings (``mode_of``); nothing else inspects a
learner's attributes to decide what it may release.

>>> PrivacyMode.DP_SGD_USER.unit, PrivacyMode.DP_SGD_USER.relation
('user', 'add/remove user')
>>> PrivacyMode.NONE.central, PrivacyMode.JOINT_RATING.central
(False, True)
>>> PrivacyMode.DP_SGD_RATING.surface("model_shape"), PrivacyMode.JOINT_USER.surface("model_bytes")
('public', 'withheld')
>>> PrivacyMode.DP_SGD_RATING.surface("ratings_learned")
'withheld'
>>> sorted(m.value for m in PrivacyMode if m.proven)[:3]
['dp-sgd-rating', 'dp-sgd-user', 'joint-rating']
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

# How a surface is made public in a mode:
#   "noised"   computed from the data with calibrated noise, charged to the ledger
#   "public"   a function of public parameters only (no rating changes it)
#   "withheld" operator state: only behind the admin token, outside every covered block
#   "exact"    shown as computed (the non-private and heuristic modes)
HOW = ("noised", "public", "withheld", "exact")

# The neighbouring relations a mode can claim (the harness runs each).
RELATIONS = ("add/remove rating", "replace-one rating", "add/remove user", "replace-one user")

# The surfaces a running system shows (HTTP JSON of every route, /metrics, --json, the dashboard's
# public view, the public part of a checkpoint or snapshot). One name per figure.
SURFACES = (
    "predictions",        # /predict answers, the model's cells, biases and offset
    "recommendations",    # /recommend scores of known users
    "public_ranking",     # /recommend for an unknown user
    "popularity",         # exact counts of ratings per item (count-min)
    "ratings_learned",    # exact counts: learned, skipped, throughput, prequential error, train size
    "model_bytes",        # the size of the model (a joint model's grows with its ratings)
    "model_shape",        # widths, depths, capacity
    "monitor",            # the privacy monitor's moments
    "guarantee",          # epsilon, delta, unit, accountant
    "epoch_plan",         # the noised training size of DP epochs, and q and steps made from it
    "offsets",            # Kafka offsets (the stream's length)
    "health",             # uptime, readiness, pause state
)


@dataclass(frozen=True)
class Mechanism:
    """One noise mechanism of a mode: the statistic it noises and the sensitivity it is calibrated
    to, per privacy unit (``m`` is the cap of ratings per user where the unit is a user), for
    add/remove neighbours (replace-one: twice it, by the triangle inequality).

    >>> _FALLBACK_USER[0].bound(m=8)
    4.0
    """

    statistic: str
    norm: str             # "l2" (Gaussian) or "l1" (Laplace)
    sensitivity: str      # as a formula of m and clip, e.g. "m*clip"; "public bound": see statistic

    def bound(self, m: int = 1, clip: float = 1.0) -> float:
        """The calibrated sensitivity for cap ``m`` and clip norm ``clip`` (the tests compare the
        largest change of the statistic over adversarial neighbours with it)."""
        return float(eval(self.sensitivity, {"__builtins__": {}},   # a formula of this table only
                          {"sqrt": math.sqrt, "m": m, "clip": clip}))


@dataclass(frozen=True)
class _Spec:
    unit: str | None              # "rating", "user" or None (no privacy unit)
    relation: str | None          # the neighbouring relation the bound holds for
    relations: tuple[str, ...]    # every relation it claims (epochs: add/remove; a stream pass:
                                  # replace-one at fixed positions)
    central: bool                 # the server's releases carry a DP bound (accounted, ledger)
    local: bool                   # ratings are perturbed before they leave the device
    proven: bool                  # the ε it reports is a proven bound (not a heuristic/estimate)
    mechanisms: tuple[Mechanism, ...]
    forbids: tuple[str, ...]      # learner features the mode cannot account for


# an unknown user's /recommend ranks by the released item side (stream.recommender): noised
_PRIVATE_SURFACES = {"predictions": "noised", "recommendations": "noised", "public_ranking": "noised",
                     "popularity": "withheld", "ratings_learned": "withheld", "model_bytes": "withheld",
                     "model_shape": "public", "monitor": "withheld", "guarantee": "public",
                     "epoch_plan": "noised",
                     "offsets": "withheld", "health": "public"}
# sensitivities as calibrated (models.private.dp_sgd, privacy.joint_dp.sensitivity); a user's m
# ratings reach one step's clipped sum m times, and its contribution vector to the bucketed item
# statistics is scaled to norm sqrt(2m) (models.private.fallback.user_weights)
_DP_SGD_RATING = (Mechanism("clipped gradient sum per step", "l2", "clip"),)
_DP_SGD_USER = (Mechanism("clipped gradient sum per step", "l2", "m*clip"),)
_FALLBACK_RATING = (Mechanism("bucketed item (sum, count) of the baseline", "l2", "sqrt(2)"),
                    Mechanism("global (sum, count) of the baseline", "l2", "sqrt(2)"),
                    Mechanism("sum of clipped error differences (the choice)", "l2", "2*0.25"))
_FALLBACK_USER = (Mechanism("bucketed item (sum, count) of the baseline", "l2", "sqrt(2*m)"),
                  Mechanism("global (sum, count) of the baseline", "l2", "sqrt(2)*m"),
                  Mechanism("sum of clipped error differences (the choice)", "l2", "0.25"))
_JOINT_RATING = (Mechanism("item factor Gram and cross statistics", "l2", "sqrt(6*(m+1))"),
                 Mechanism("item bias (sum, count)", "l1", "2"))
_JOINT_USER = (Mechanism("item factor Gram and cross statistics", "l2", "sqrt(2*m)"),
               Mechanism("item bias (sum, count)", "l2", "sqrt(2*m)"))
_RATING, _USER = ("add/remove rating", "replace-one rating"), ("add/remove user", "replace-one user")
_ACCOUNTED_FORBIDS = ("heavy_slots", "implicit", "adagrad", "light_dim", "topn_feedback")


class PrivacyMode(Enum):
    """The privacy modes. Values are the names the CLI, /privacy and ``--json`` use."""

    NONE = "none"
    CLIP_LOSS = "clip-loss"
    SGLD = "sgld"
    SGLD_DP = "sgld-dp"
    DP_SGD_RATING = "dp-sgd-rating"
    DP_SGD_USER = "dp-sgd-user"
    JOINT_RATING = "joint-rating"
    JOINT_USER = "joint-user"
    LDP = "ldp"

    @property
    def spec(self) -> _Spec:
        return _SPECS[self]

    @property
    def unit(self) -> str | None:
        return self.spec.unit

    @property
    def relation(self) -> str | None:
        return self.spec.relation

    @property
    def relations(self) -> tuple[str, ...]:
        """Every neighbouring relation the mode claims a bound for."""
        return self.spec.relations

    @property
    def central(self) -> bool:
        return self.spec.central

    @property
    def local(self) -> bool:
        return self.spec.local

    @property
    def proven(self) -> bool:
        return self.spec.proven

    @property
    def dp_sgd(self) -> bool:
        """A DP-SGD mode (the noisy step on the sketch, with its private fallback and ledger)."""
        return self in (PrivacyMode.DP_SGD_RATING, PrivacyMode.DP_SGD_USER, PrivacyMode.SGLD_DP)

    @property
    def private(self) -> bool:
        """Any privacy mode (per-user answers need a credential by default)."""
        return self is not PrivacyMode.NONE

    @property
    def mechanisms(self) -> tuple[Mechanism, ...]:
        return self.spec.mechanisms

    @property
    def forbids(self) -> tuple[str, ...]:
        return self.spec.forbids

    def surface(self, name: str) -> str:
        """How surface ``name`` is made public in this mode (one of ``HOW``)."""
        if name not in SURFACES:
            raise KeyError(f"unknown surface {name!r}; known: {', '.join(SURFACES)}")
        if not self.central:
            return "exact"
        return _PRIVATE_SURFACES[name]

    def surfaces(self) -> dict[str, str]:
        """Every surface and how it is made public."""
        return {name: self.surface(name) for name in SURFACES}


_SPECS: dict[PrivacyMode, _Spec] = {
    PrivacyMode.NONE: _Spec(None, None, (), False, False, False, (), ()),
    PrivacyMode.CLIP_LOSS: _Spec("rating", "replace-one rating", ("replace-one rating",), False,
                                 False, False, (), ("implicit", "adagrad")),
    PrivacyMode.SGLD: _Spec(None, None, (), False, False, False, (), ("implicit", "adagrad")),
    PrivacyMode.SGLD_DP: _Spec("rating", "add/remove rating", _RATING, True, False, True,
                               _DP_SGD_RATING + _FALLBACK_RATING, _ACCOUNTED_FORBIDS),
    PrivacyMode.DP_SGD_RATING: _Spec("rating", "add/remove rating", _RATING, True, False, True,
                                     _DP_SGD_RATING + _FALLBACK_RATING, _ACCOUNTED_FORBIDS),
    PrivacyMode.DP_SGD_USER: _Spec("user", "add/remove user", _USER, True, False, True,
                                   _DP_SGD_USER + _FALLBACK_USER, _ACCOUNTED_FORBIDS),
    PrivacyMode.JOINT_RATING: _Spec("rating", "add/remove rating", ("add/remove rating",), True,
                                    False, True, _JOINT_RATING, _ACCOUNTED_FORBIDS),
    PrivacyMode.JOINT_USER: _Spec("user", "add/remove user", ("add/remove user",), True, False,
                                  True, _JOINT_USER, _ACCOUNTED_FORBIDS),
    PrivacyMode.LDP: _Spec("rating", "replace-one rating (on the device)",
                           ("replace-one rating (on the device)",), False, True, True,
                           (Mechanism("each rating, on the device", "l1", "upper - lower"),),
                           ("implicit",)),
}


def learner_mode(dp=None, clip_loss: float | None = None, sgld_temperature: float | None = None,
                 joint_unit: str | None = None) -> PrivacyMode:
    """The privacy mode of a learner with these settings: what every learner's ``privacy_mode``
    returns (``dp``: a DP-SGD config; ``joint_unit``: the unit of a joint-DP learner).

    >>> learner_mode(clip_loss=1.0).value, learner_mode(joint_unit="user").value
    ('clip-loss', 'joint-user')
    """
    if joint_unit is not None:
        return PrivacyMode.JOINT_USER if joint_unit == "user" else PrivacyMode.JOINT_RATING
    if dp is not None:
        if getattr(dp, "mode", "dp-sgd") == "sgld-dp":
            return PrivacyMode.SGLD_DP
        return PrivacyMode.DP_SGD_USER if dp.unit == "user" else PrivacyMode.DP_SGD_RATING
    if clip_loss is not None:
        return PrivacyMode.CLIP_LOSS
    if sgld_temperature:
        return PrivacyMode.SGLD
    return PrivacyMode.NONE


def mode_of(model, ldp: object | None = None) -> PrivacyMode:
    """The privacy mode a learner trains in: its declared ``privacy_mode``; LDP when its stream's
    ratings were perturbed on the device (``ldp``: those settings) and it adds no central mode.

    A learner from outside the package without ``privacy_mode`` (e.g. a river model) has none of
    the privacy settings: it trains non-privately.

    >>> from sketchrec.models import SketchMF
    >>> mode_of(SketchMF(dim=4, capacity=10)).value
    'none'
    >>> mode_of(SketchMF(dim=4, capacity=10, clip_loss=1.0)).value
    'clip-loss'
    >>> mode_of(SketchMF(dim=4, capacity=10), ldp=object()).value
    'ldp'
    """
    declared = getattr(model, "privacy_mode", None)
    if not isinstance(declared, PrivacyMode):
        declared = PrivacyMode.NONE
    if ldp is not None and not declared.central:
        return PrivacyMode.LDP
    return declared


def surface_table() -> str:
    """The surface table of every mode as Markdown (docs/privacy/surfaces.md: one source of truth, this table).

    >>> surface_table().splitlines()[0].startswith("| surface | none |")
    True
    """
    modes = list(PrivacyMode)
    lines = ["| surface | " + " | ".join(m.value for m in modes) + " |",
             "|---|" + "---|" * len(modes)]
    lines += [f"| {name} | " + " | ".join(m.surface(name) for m in modes) + " |" for name in SURFACES]
    lines.append("| relations | " + " | ".join(", ".join(m.relations) or "-" for m in modes) + " |")
    return "\n".join(lines)
