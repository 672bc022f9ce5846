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
>>> PrivacyMode.DP_SGD_RATING.surface("model_bytes")
'public'
>>> PrivacyMode.DP_SGD_RATING.surface("ratings_learned")
'withheld'
>>> sorted(m.value for m in PrivacyMode if m.proven)[:3]
['dp-sgd-rating', 'dp-sgd-user', 'joint-rating']
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

# How a surface is made public in a mode:
#   "noised"   computed from the data with calibrated noise, charged to the ledger
#   "public"   a function of public parameters only (no rating changes it)
#   "withheld" operator state: only behind the admin token, outside every covered block
#   "exact"    shown as computed (the non-private and heuristic modes)
HOW = ("noised", "public", "withheld", "exact")

# The surfaces a running system shows (HTTP JSON of every route, /metrics, --json, the dashboard's
# public view, the public part of a checkpoint or snapshot). One name per figure.
SURFACES = (
    "predictions",        # /predict answers, the model's cells, biases and offset
    "recommendations",    # /recommend scores of known users
    "public_ranking",     # /recommend for an unknown user
    "popularity",         # exact counts of ratings per item (count-min)
    "ratings_learned",    # exact counts: learned, skipped, throughput, prequential error
    "model_bytes",        # the size of the model
    "model_shape",        # widths, depths, capacity
    "monitor",            # the privacy monitor's moments
    "guarantee",          # epsilon, delta, unit, accountant
    "offsets",            # Kafka offsets (the stream's length)
    "health",             # uptime, readiness, pause state
)


@dataclass(frozen=True)
class Mechanism:
    """One noise mechanism of a mode: the statistic it noises and the sensitivity it is calibrated
    to, per privacy unit (``m`` is the cap of ratings per user where the unit is a user)."""

    statistic: str
    norm: str             # "l2" (Gaussian) or "l1" (Laplace)
    sensitivity: str      # as a formula of m, e.g. "2*clip*sqrt(m)"


@dataclass(frozen=True)
class _Spec:
    unit: str | None              # "rating", "user" or None (no privacy unit)
    relation: str | None          # the neighbouring relation the bound holds for
    central: bool                 # the server's releases carry a DP bound (accounted, ledger)
    local: bool                   # ratings are perturbed before they leave the device
    proven: bool                  # the ε it reports is a proven bound (not a heuristic/estimate)
    mechanisms: tuple[Mechanism, ...]
    forbids: tuple[str, ...]      # learner features the mode cannot account for


_PRIVATE_SURFACES = {"predictions": "noised", "recommendations": "noised", "public_ranking": "public",
                     "popularity": "withheld", "ratings_learned": "withheld", "model_bytes": "public",
                     "model_shape": "public", "monitor": "withheld", "guarantee": "public",
                     "offsets": "withheld", "health": "public"}
_DP_SGD = (Mechanism("clipped gradient sum per step", "l2", "clip*sqrt(m)"),)
_FALLBACK = (Mechanism("bucketed item (sum, count) of the baseline", "l2", "sqrt(2)*m"),
             Mechanism("held-out error of model vs baseline", "l2", "public bound"))
_JOINT = (Mechanism("item factor Gram and cross statistics", "l2", "see privacy.joint_dp"),
          Mechanism("item bias (sum, count)", "l2", "sqrt(2)*m"))
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
    def central(self) -> bool:
        return self.spec.central

    @property
    def local(self) -> bool:
        return self.spec.local

    @property
    def proven(self) -> bool:
        return self.spec.proven

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
    PrivacyMode.NONE: _Spec(None, None, False, False, False, (), ()),
    PrivacyMode.CLIP_LOSS: _Spec("rating", "replace-one rating", False, False, False, (),
                                 ("implicit", "adagrad")),
    PrivacyMode.SGLD: _Spec(None, None, False, False, False, (), ("implicit", "adagrad")),
    PrivacyMode.SGLD_DP: _Spec("rating", "add/remove rating", True, False, True, _DP_SGD,
                               _ACCOUNTED_FORBIDS),
    PrivacyMode.DP_SGD_RATING: _Spec("rating", "add/remove rating", True, False, True,
                                     _DP_SGD + _FALLBACK, _ACCOUNTED_FORBIDS),
    PrivacyMode.DP_SGD_USER: _Spec("user", "add/remove user", True, False, True, _DP_SGD + _FALLBACK,
                                   _ACCOUNTED_FORBIDS),
    PrivacyMode.JOINT_RATING: _Spec("rating", "add/remove rating", True, False, True, _JOINT,
                                    _ACCOUNTED_FORBIDS),
    PrivacyMode.JOINT_USER: _Spec("user", "add/remove user", True, False, True, _JOINT,
                                  _ACCOUNTED_FORBIDS),
    PrivacyMode.LDP: _Spec("rating", "replace-one rating (on the device)", False, True, True,
                           (Mechanism("each rating, on the device", "l1", "upper - lower"),),
                           ("implicit",)),
}


def mode_of(model, ldp: object | None = None) -> PrivacyMode:
    """The privacy mode a learner trains in: the one place a learner's settings are read for it.

    ``ldp``: the local-DP settings of the stream, if its ratings were perturbed on the device.

    >>> from sketchrec.models import SketchMF
    >>> mode_of(SketchMF(dim=4, capacity=10)).value
    'none'
    >>> mode_of(SketchMF(dim=4, capacity=10, clip_loss=1.0)).value
    'clip-loss'
    """
    declared = getattr(model, "privacy_mode", None)
    if isinstance(declared, PrivacyMode):
        return declared
    if getattr(model, "joint_dp", False):
        unit = getattr(getattr(model, "config", None), "unit", "rating")
        return PrivacyMode.JOINT_USER if unit == "user" else PrivacyMode.JOINT_RATING
    dp = getattr(model, "dp", None)
    if dp is not None:
        if getattr(dp, "mode", "dp-sgd") == "sgld-dp":
            return PrivacyMode.SGLD_DP
        return PrivacyMode.DP_SGD_USER if dp.unit == "user" else PrivacyMode.DP_SGD_RATING
    if ldp is not None:
        return PrivacyMode.LDP
    if getattr(model, "clip_loss", None) is not None:
        return PrivacyMode.CLIP_LOSS
    if getattr(model, "sgld_temperature", None):
        return PrivacyMode.SGLD
    return PrivacyMode.NONE
