"""What works with what, as data: one row per model kind, one column per privacy mode, optimizer,
input, protocol, serving mode and feature. Each cell is supported, refused (with the one line that
says why and what works instead) or not applicable (the kind fixes that column itself).

The commands' refusals come from here (``refusals``), so does ``sketchrec modes`` (the table as a
rich table, ``--json``, ``--markdown``: docs/modes.md), and a life-cycle test walks every cell.
The privacy modes are ``privacy.mode.PrivacyMode``; what a mode cannot account for is its
``forbids``; what a mode cannot run with beyond the kind's row is ``MODE_LIMITS``.

>>> refusals(Ask("sketch"))
[]
>>> refusals(Ask("mix", PrivacyMode.DP_SGD_RATING))[0].split(";")[0]
'DP-SGD is implemented for one sketch model'
>>> cell("river", "input", "kafka").supported
False
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sketchrec.models.steps import OPTIMIZERS
from sketchrec.privacy.mode import PrivacyMode

# the columns, by axis; values are the names the CLI, `sketchrec modes --json` and the tests use
AXES: dict[str, tuple[str, ...]] = {
    "privacy": tuple(m.value for m in PrivacyMode),
    "optimizer": tuple(OPTIMIZERS),   # the noiseless step rules (models.steps); SGLD is "sgld" above
    "input": ("file", "synthetic", "kafka", "fleet"),
    "protocol": ("prequential", "holdout"),
    "serving": ("none", "thread", "workers", "replica", "fleet-replica", "joint-read-only"),
    "feature": ("checkpoint", "canaries", "topn", "implicit"),
}
AXIS_HELP = {
    "privacy": "privacy mode (--clip-loss, --sgld, --sgld-dp, --dp-*, --ldp-*)",
    "optimizer": "--optimizer of one factor model",
    "input": "file or synthetic (`replay`), a Kafka topic (`consume`), a fleet (`consume --fleet`)",
    "protocol": "`replay`'s protocol: prequential (the default) or --holdout F",
    "serving": "none; --serve in the learning process (thread); --workers N reader processes; "
               "`serve --checkpoint` (replica); `serve --bootstrap --topic` (fleet-replica); "
               "the joint-DP model served read-only",
    "feature": "--checkpoint, --audit-canaries, --topn, --implicit K",
}

DEFAULT_KIND = "mix"   # every command's default learner (replay, consume and its fleet, serve's readers)
PRIVATE_KIND = "sketch"  # the privacy modes' learner when no --model is given
# (a DP fleet runs it with DP-SGD and no private fallback: the dp-fallback row's fleet cell)


@dataclass(frozen=True)
class Cell:
    """One cell: ``state`` is "yes", "no" or "n/a"; a refusal says ``why`` and ``instead``."""

    state: str = "yes"
    why: str = ""
    instead: str = ""

    @property
    def supported(self) -> bool:
        return self.state == "yes"

    def line(self) -> str:
        """The one line a command prints when it refuses this cell."""
        return f"{self.why}; {self.instead}"

    def to_dict(self) -> dict:
        return {"supported": self.supported, "state": self.state,
                **({"why": self.why, "instead": self.instead} if self.state != "yes" else {})}


YES = Cell()


def no(why: str, instead: str) -> Cell:
    return Cell("no", why, instead)


def na(why: str) -> Cell:
    return Cell("n/a", why, "the row's kind sets this column")


@dataclass(frozen=True)
class Kind:
    """One model kind: the class a checkpoint records, a summary, and its non-supported cells
    (every cell not named is supported)."""

    name: str
    model_class: str
    summary: str
    cells: dict[tuple[str, str], Cell] = field(default_factory=dict)

    def cell(self, axis: str, value: str) -> Cell:
        if value not in AXES[axis]:
            raise KeyError(f"unknown {axis} {value!r}; known: {', '.join(AXES[axis])}")
        return self.cells.get((axis, value), YES)


_DP = ("sgld-dp", "dp-sgd-rating", "dp-sgd-user")
_JOINT = ("joint-rating", "joint-user")
_ONE = "give --model sketch (or no --model: the privacy modes use one sketch model)"
_DP_NEEDS_SKETCH = no("DP-SGD is implemented for one sketch model", _ONE)
_JOINT_IS_A_KIND = no("the joint-DP mode is its own learner (private biases and item factors)",
                      "give `replay --holdout F --dp-epsilon E --dp-model joint` without --model")
_CHECKPOINTS = "--model sketch, dense, mix or bias"
_FLEET_KINDS = "a fleet runs the default learner (mix), sketch or bias"
_STEPS_OF_ONE = no("--optimizer sets the steps of one factor model", "give --model sketch with it")


def _refuse(values, cell: Cell, axis: str = "privacy") -> dict:
    return {(axis, v): cell for v in values}


KINDS: dict[str, Kind] = {k.name: k for k in (
    Kind("mix", "Experts", "the bias baseline and an AdaGrad sketch model combined by their recent "
         "error (the default learner)", {
             **_refuse(("clip-loss", "sgld"), no(
                 "the combination tunes its members itself; loss clipping and SGLD run on one learner",
                 "give --model sketch or dense with --clip-loss / --sgld")),
             **_refuse(_DP, _DP_NEEDS_SKETCH), **_refuse(_JOINT, _JOINT_IS_A_KIND),
             **_refuse(AXES["optimizer"], no(
                 "--lr, --reg, --optimizer and --implicit set one learner, and the combination "
                 "(--model mix) tunes its members itself", "give --model sketch with them"), "optimizer"),
             ("serving", "joint-read-only"): na("only the joint-DP model is served read-only after its fit"),
             ("feature", "implicit"): no(
                 "--implicit sets one learner; the combination turns the term on itself when it "
                 "trains epochs", "give --model sketch --implicit K"),
         }),
    Kind("sketch", "SketchMF", "one count-sketch factor model (the thesis learner with plain SGD)", {
        **_refuse(_JOINT, _JOINT_IS_A_KIND),
        ("serving", "joint-read-only"): na("only the joint-DP model is served read-only after its fit"),
    }),
    Kind("dense", "DenseMF", "one factor model with a vector per id (memory grows with the ids)", {
        **_refuse(_DP, _DP_NEEDS_SKETCH), **_refuse(_JOINT, _JOINT_IS_A_KIND),
        **_refuse(AXES["optimizer"][1:], no("AdaGrad steps are implemented for the sketch model",
                                            "give --model sketch --optimizer adagrad"), "optimizer"),
        ("input", "fleet"): no("fleet members add each other's changes to fixed arrays; a dense "
                               "model's rows grow with the ids", "leave --model out (the default "
                               "learner, mix) or give --model sketch or bias"),
        ("serving", "workers"): no("a dense model grows with the ids, so reader processes cannot "
                                   "share its arrays", "serve it with --workers 1, or use --model sketch"),
        ("serving", "fleet-replica"): na(_FLEET_KINDS),
        ("serving", "joint-read-only"): na("only the joint-DP model is served read-only after its fit"),
        ("feature", "implicit"): no("the implicit term is implemented for the sketch model",
                                    "give --model sketch --implicit K"),
    }),
    Kind("river", "RiverBiasedMF", "river's BiasedMF, for comparison", {
        **_refuse(("clip-loss", "sgld"), no("river's BiasedMF has no loss clipping or SGLD",
                                            "give --model sketch or dense")),
        **_refuse(_DP, _DP_NEEDS_SKETCH), **_refuse(_JOINT, _JOINT_IS_A_KIND),
        **_refuse(AXES["optimizer"], no("river's BiasedMF keeps its own SGD steps",
                                        "leave --optimizer out, or give --model sketch"), "optimizer"),
        **_refuse(("kafka", "fleet"), no("river's model has no checkpoint, and a consumer keeps its "
                                         "state in checkpoints", f"give {_CHECKPOINTS}"), "input"),
        **_refuse(("thread", "workers"), no("river's model has no checkpoint or shared form to "
                                            "serve from", f"serve {_CHECKPOINTS}"), "serving"),
        ("serving", "replica"): na("river's model has no checkpoint to serve"),
        ("serving", "fleet-replica"): na(_FLEET_KINDS),
        ("serving", "joint-read-only"): na("only the joint-DP model is served read-only after its fit"),
        **_refuse(("checkpoint", "canaries"), no("river's model has no checkpoint form",
                                                 f"give {_CHECKPOINTS}"), "feature"),
        ("feature", "topn"): no("--topn needs a model that scores without learning: river's "
                                "predict_one draws start vectors for unknown ids",
                                "give --model sketch or dense"),
        ("feature", "implicit"): no("the implicit term is implemented for the sketch model",
                                    "give --model sketch --implicit K"),
    }),
    Kind("bias", "BiasBaseline", "damped running user + item biases", {
        **_refuse(("clip-loss", "sgld"), no("the bias baseline takes no gradient steps to clip or noise",
                                            "give --model sketch or dense")),
        **_refuse(_DP, _DP_NEEDS_SKETCH), **_refuse(_JOINT, _JOINT_IS_A_KIND),
        **_refuse(AXES["optimizer"], no("the bias baseline takes no gradient steps",
                                        "leave --optimizer out, or give --model sketch"), "optimizer"),
        ("serving", "joint-read-only"): na("only the joint-DP model is served read-only after its fit"),
        ("feature", "implicit"): no("the implicit term is implemented for the sketch model",
                                    "give --model sketch --implicit K"),
    }),
    Kind("joint", "PrivateALS", "joint-DP: private biases and item factors released, each user's "
         "part solved from them (`replay --holdout F --dp-epsilon E --dp-model joint`)", {
             **_refuse(("none", "clip-loss", "sgld", "ldp", *_DP), na("the joint-DP model is "
                                                                      "chosen by its privacy mode")),
             **_refuse(AXES["optimizer"], no("the joint-DP model is solved, not stepped",
                                             "leave --optimizer out"), "optimizer"),
             **_refuse(("kafka", "fleet"), no(
                 "the joint-DP model is fitted in one batch over a holdout split",
                 "replay --holdout F --dp-model joint, or consume with DP-SGD (--dp-model sgd)"), "input"),
             ("protocol", "prequential"): no("the joint-DP model is fitted in one batch over a "
                                             "holdout split", "give --holdout F, or --dp-model sgd "
                                             "for a stream"),
             ("serving", "thread"): na("the joint-DP model is served read-only (joint-read-only)"),
             ("serving", "workers"): no("the joint-DP model is served read-only from one process",
                                        "serve it with --workers 1"),
             ("serving", "fleet-replica"): na(_FLEET_KINDS),
             **{("feature", f): no(f"the joint-DP mode (--dp-model joint) does not take {option}: "
                                   "it is fitted in one batch", "use --dp-model sgd")
                for f, option in (("canaries", "--audit-canaries"), ("topn", "--topn"),
                                  ("implicit", "--implicit"))},
         }),
    Kind("dp-fallback", "DPSGDFallback", "a DP-SGD sketch model wrapped with its private "
         "baseline (what a DP-SGD run learns and checkpoints)", {
             **_refuse(("none", "clip-loss", "sgld", "ldp", *_JOINT), na(
                 "the fallback wraps a DP-SGD model only")),
             **_refuse(AXES["optimizer"][1:], na("DP-SGD takes plain SGD steps"), "optimizer"),
             ("input", "fleet"): na("a fleet runs the DP-SGD sketch model itself (the sketch row), "
                                    "without the private fallback, whose windowed releases and "
                                    "choice are one learner's"),
             ("serving", "fleet-replica"): na(_FLEET_KINDS),
             ("serving", "joint-read-only"): na("only the joint-DP model is served read-only after its fit"),
             ("feature", "topn"): no("--topn cuts the stream's batches at its events, which would "
                                     "move DP-SGD's noisy steps", "measure top-N without DP"),
             ("feature", "implicit"): na("the DP modes forbid the implicit term"),
         }),
)}

# what a privacy mode cannot run with, whatever the kind (its ``forbids`` aside)
MODE_LIMITS: dict[PrivacyMode, dict[tuple[str, str], Cell]] = {
    **{PrivacyMode(m): {("feature", "topn"): KINDS["dp-fallback"].cells[("feature", "topn")]}
       for m in _DP},
    # a local-DP fleet runs: the ratings came perturbed, so its claim is the producer's whatever
    # the members do; the id key is its first snapshot's, the debiasing the model topic's
    PrivacyMode.LDP: {("protocol", "prequential"): no(
        "--ldp-epsilon is simulated in the holdout protocol (--holdout F)",
        "for a stream, use `sketchrec produce --ldp-epsilon`")},
}

# what a privacy mode cannot run with when two columns are asked together
_DP_MEMBER_SERVES = no("a DP fleet member's replica runs ahead of the fleet's model by what it has "
                       "not published, which a kill -9 would have its successor learn again",
                       "serve the fleet's model from `sketchrec serve --bootstrap B --topic T` "
                       "replicas (accepted deltas only)")
MODE_PAIR_LIMITS: dict[PrivacyMode, dict[tuple[tuple[str, str], tuple[str, str]], Cell]] = {
    PrivacyMode(m): {(("input", "fleet"), ("serving", "thread")): _DP_MEMBER_SERVES} for m in _DP}

# what two columns cannot run together, whatever the kind and mode
_FLEET_WORKERS = no("a fleet's model is served from its own process: its replica keeps state beside "
                    "the arrays (slot residuals, announcements) that reader processes would not see",
                    "serve it with --workers 1, or run more `sketchrec serve --bootstrap B --topic T` "
                    "replicas")
PAIR_LIMITS: dict[tuple[str, str], dict[tuple[str, str], Cell]] = {
    ("input", "fleet"): {("serving", "workers"): _FLEET_WORKERS,
                         ("feature", "implicit"): no(
                             "--implicit does not run as a fleet: members exchange the sketch's "
                             "cells, not the users' histories", "leave --implicit at 0 in a fleet")},
    ("serving", "fleet-replica"): {("serving", "workers"): _FLEET_WORKERS},
}

# POST /ratings (``stream.feedback``): how each kind of serving service takes a rating posted over
# HTTP, by the route its command gave it ("direct": learned at once; "kafka": produced to the topic
# it consumes, learned when consumed)
_READ_ONLY = no("this service serves a model read-only and learns nothing",
                "send ratings to the learning service (`replay --serve`, `consume --serve`) or "
                "produce them to its topic (`sketchrec produce`)")
FEEDBACK: dict[str, Cell] = {
    "direct": YES, "kafka": YES,
    "read-only": _READ_ONLY,
    "epoch-dp": no("an epoch-planned DP-SGD run (--holdout) accounts sampled steps over its fixed "
                   "split; a posted rating's step cannot be composed into that ledger",
                   "take ratings on a stream pass: `replay` without --holdout, or `consume --serve`"),
    "holdout": no("--holdout trains epochs on a fixed split; a posted rating would be learned "
                  "outside it", "take ratings on a stream: `replay` without --holdout, or `consume --serve`"),
    # a --workers reader relays the request to the learner's own endpoint: one of the above runs
    "forwarded": YES,
    "readers": no("a reader process without its learner's address answers queries only",
                  "serve with --workers 1 to take ratings over HTTP, or produce them to the topic"),
}


# a feature a privacy mode forbids, in words
_FEATURE_NAMES = {"heavy_slots": "a heavy-hitter filter (which ids hold a slot is decided by the data)",
                  "implicit": "the implicit term (--implicit)", "adagrad": "AdaGrad steps",
                  "light_dim": "--light-dim below --dim (its clipping bound covers every component)"}

# what to do instead of a feature a privacy mode forbids (``PrivacyMode.forbids``)
_WITHOUT = {"implicit": "leave --implicit at 0", "adagrad": "use --optimizer sgd",
            "heavy_slots": "use --heavy-fraction 0", "light_dim": "leave --light-dim unset (= --dim)",
            "topn_feedback": "serve without the top-N feedback"}


@dataclass(frozen=True)
class Ask:
    """What a command was asked for: the kind, the privacy mode, and each axis's values (None or
    empty: not asked). ``features`` are ``AXES['feature']`` values plus learner features a privacy
    mode may forbid (``PrivacyMode.forbids``)."""

    kind: str
    privacy: PrivacyMode = PrivacyMode.NONE
    optimizer: str | None = None
    input: str = "file"
    protocol: str | None = None
    serving: tuple[str, ...] = ()
    features: frozenset[str] = frozenset()

    def cells(self) -> list[tuple[str, str]]:
        asked = [("privacy", self.privacy.value), ("optimizer", self.optimizer),
                 ("input", self.input), ("protocol", self.protocol),
                 *(("serving", s) for s in self.serving),
                 *(("feature", f) for f in sorted(self.features) if f in AXES["feature"])]
        return [(axis, value) for axis, value in asked if value is not None]


def cell(kind: str, axis: str, value: str) -> Cell:
    """The table's cell (KeyError for an unknown kind, axis or value)."""
    if kind not in KINDS:
        raise KeyError(f"unknown model kind {kind!r}; known: {', '.join(KINDS)}")
    return KINDS[kind].cell(axis, value)


def refusals(ask: Ask) -> list[str]:
    """Every line the table refuses ``ask`` with (empty: it runs), first the kind's cells, then the
    privacy mode's limits and what it forbids; each line once."""
    lines = []
    for axis, value in ask.cells():
        found = cell(ask.kind, axis, value)
        if not found.supported:
            lines.append(found.line())
        limit = MODE_LIMITS.get(ask.privacy, {}).get((axis, value))
        if limit is not None:
            lines.append(limit.line())
        for other in ask.cells():
            pair = PAIR_LIMITS.get(other, {}).get((axis, value))
            if pair is not None:
                lines.append(pair.line())
            pair = MODE_PAIR_LIMITS.get(ask.privacy, {}).get((other, (axis, value)))
            if pair is not None:
                lines.append(pair.line())
    asked = set(ask.features) | ({"adagrad"} if ask.optimizer in ("adagrad", "adagrad-id") else set())
    for feature in ask.privacy.forbids:
        if feature in asked:
            lines.append(f"the {ask.privacy.value} mode cannot account for "
                         f"{_FEATURE_NAMES.get(feature, feature.replace('_', ' '))}; "
                         f"{_WITHOUT.get(feature, 'leave it out')}")
    return list(dict.fromkeys(lines))


def kind_of(model) -> str:
    """The kind of a built (or loaded) model, by the class a checkpoint records."""
    name = type(model).__name__
    for kind in KINDS.values():
        if kind.model_class == name:
            return kind.name
    raise KeyError(f"no kind for model class {name}")


def one_process_line(recommender) -> str:
    """Why a recommender cannot be shared by reader processes, as the table says: its kind's
    workers cell, or a fleet's (a recommender observed by a fleet's delta tracker)."""
    if getattr(recommender, "observers", None):
        return _FLEET_WORKERS.line()
    found = cell(kind_of(recommender.model), "serving", "workers")
    return found.line() if not found.supported else "its state is not all fixed arrays; serve it with --workers 1"


def as_dict() -> dict:
    """The table, machine-readable (`sketchrec modes --json`)."""
    return {"default_kind": DEFAULT_KIND, "axes": {a: list(v) for a, v in AXES.items()},
            "kinds": {k.name: {"model_class": k.model_class, "summary": k.summary,
                               "cells": {axis: {v: k.cell(axis, v).to_dict() for v in values}
                                         for axis, values in AXES.items()}}
                      for k in KINDS.values()},
            "modes": {m.value: {"forbids": list(m.forbids),
                                "limits": {f"{a}:{v}": c.to_dict()
                                           for (a, v), c in MODE_LIMITS.get(m, {}).items()},
                                "pairs": {f"{a}:{v} + {b}:{w}": c.to_dict() for ((a, v), (b, w)), c
                                          in MODE_PAIR_LIMITS.get(m, {}).items()}}
                      for m in PrivacyMode},
            "pairs": {f"{a}:{v} + {b}:{w}": c.to_dict() for (a, v), limits in PAIR_LIMITS.items()
                      for (b, w), c in limits.items()}}
