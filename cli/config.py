"""Frozen settings built from parsed options, with the defaults that depend on the training mode
resolved here (the argparse Namespace is never changed), and the objects they describe."""

from __future__ import annotations

import argparse
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from sketchrec.models.capabilities import DEFAULT_KIND, KINDS, PRIVATE_KIND, Ask, refusals
from sketchrec.models.registry import ADAGRAD_DEFAULTS, DEFAULTS, DP_DEFAULTS
from sketchrec.cli.options import ACCESS, Refused, parse_host_port, refuse, refuse_inapplicable
from sketchrec.privacy.mode import PrivacyMode
from sketchrec.cli.dp_settings import DPSettings  # noqa: F401 - re-exported: the commands' settings in one place


def check(prog: str, ask: Ask) -> None:
    """Refuse ``ask`` if the capability table does (``models.capabilities``)."""
    lines = refusals(ask)
    if lines:
        refuse(prog, lines)


@dataclass(frozen=True)
class ModelSettings:
    """The learner: its kind (mix, sketch, dense, river, bias) and hyper-parameters, DP defaults
    resolved. No --model: every command's default, the combination ``mix`` (``models.mix``),
    (in a fleet too), except in the privacy modes (DP-SGD, SGLD, loss clipping), which use one
    learner, the sketch with plain SGD, and when --lr, --reg, --optimizer or --implicit is given (they set
    one learner: the sketch). Whether a kind runs with the rest is the capability table's call
    (``models.capabilities``)."""

    kind: str
    dim: int
    lr: float
    reg: float
    depth: int = DEFAULTS["depth"]
    width: int | None = None
    space_gain: float = DEFAULTS["space_gain"]
    heavy_fraction: float | None = None
    light_dim: int | None = None
    bias_reg: float = DEFAULTS["bias_reg"]
    init_std: float = DEFAULTS["init_std"]
    sgld: float | None = None
    clip_loss: float | None = None
    seed: int = 0
    optimizer: str = "sgd"
    implicit: int = 0

    @classmethod
    def from_args(cls, args: argparse.Namespace, private: bool, prog: str = "replay") -> "ModelSettings":
        optimizer = args.optimizer or "sgd"
        tuned = DP_DEFAULTS if private else DEFAULTS if optimizer == "sgd" else ADAGRAD_DEFAULTS

        def given(name: str):
            value = getattr(args, name)
            return tuned[name] if value is None else value

        # --lr, --reg or --optimizer set ONE learner: given without --model they ask for one
        one = any(v is not None for v in (args.lr, args.reg, args.optimizer, args.implicit))
        kind = args.model or (PRIVATE_KIND if private or one or args.sgld is not None
                              or args.clip_loss is not None else DEFAULT_KIND)
        if kind == "mix" and one:   # the table's line: --lr and --reg are no column of their own
            which = ("feature", "implicit") if args.implicit else ("optimizer", "sgd")
            refuse(prog, [KINDS["mix"].cell(*which).line()])
        return cls(kind, given("dim"), given("lr"), given("reg"), args.depth, args.width,
                   args.space_gain, args.heavy_fraction, args.light_dim, args.bias_reg, args.init_std,
                   args.sgld, args.clip_loss, args.seed, optimizer, args.implicit or 0)

    def build(self, capacity: int, dp=None, prog: str = "replay"):
        """The model, sized for ``capacity`` distinct users + items; its own option checks end the
        command with a one-line message."""
        common = dict(dim=self.dim, lr=self.lr, reg=self.reg, init_std=self.init_std, seed=self.seed)
        if self.kind == "river":
            from sketchrec.models.river_adapters import RiverBiasedMF
            return RiverBiasedMF(**common)
        extra = dict(bias_reg=self.bias_reg, clip_loss=self.clip_loss)
        sketch = dict(depth=self.depth, width=self.width, space_gain=self.space_gain,
                      capacity=capacity, heavy_fraction=self.heavy_fraction, light_dim=self.light_dim)
        try:
            if self.kind in ("mix", "bias"):
                return self._build_mix(capacity, sketch)
            from sketchrec.models import DenseMF, SketchMF, steps as step_rules
            # --optimizer, --lr and --sgld TAU, as a step rule (SGLD: plain SGD steps with noise)
            steps = step_rules.noisy(step_rules.named(self.optimizer, self.lr), self.sgld)
            if self.kind == "dense":
                return DenseMF(steps=steps, **common, **extra)
            return SketchMF(dp=dp, steps=steps, implicit=self.implicit, **sketch, **common, **extra)
        except ValueError as exc:   # the model's own checks of its settings, one line each
            refuse(prog, [str(exc)])

    def _build_mix(self, capacity: int, sketch: dict):
        """The bias baseline, or the combination with the sketch's shape options (those given)
        passed to its factor members."""
        from sketchrec.models.bias_baseline import BiasBaseline
        from sketchrec.models.mix import DEFAULT_MEMBERS, Experts
        if self.kind == "bias":
            return BiasBaseline(capacity=capacity, depth=self.depth, seed=self.seed)
        shape = {name: value for name, value in sketch.items() if value is not None
                 and name not in ("capacity", "space_gain")}
        shape.update(dim=self.dim, init_std=self.init_std, bias_reg=self.bias_reg)
        members = [spec if spec["model"] != "SketchMF" else {**spec, **shape}
                   for spec in DEFAULT_MEMBERS]
        return Experts(members, capacity=capacity, space_gain=self.space_gain, seed=self.seed)

    def warm(self, dp=None, say: Callable[[str], None] | None = None, prog: str = "replay",
             predicts: bool = True, epochs: int = 1) -> None:
        """Compile numba's kernels (or load them from its cache) by learning a few ratings on a
        throwaway model of these settings and feeding them to a throwaway privacy monitor, so no
        run counts compile time as learning time. When that takes over a second (the first run
        compiles), ``say`` is told which family of kernels compiles, k of n. ``predicts=False``
        (a run whose only predictions are those ``learn_many`` returns, e.g. a prequential
        replay) leaves the prediction kernels to compile at their first use, if any. ``epochs``:
        a run of several passes plans them on the throwaway model too (the combination's members
        then learn with other settings, e.g. the implicit term, which compiles other kernels)."""
        if self.kind == "river":
            return
        import numpy as np
        steps = ["the learner", *(["predictions"] if predicts else []),
                 *(["the DP step"] if dp is not None else []), "the privacy monitor"]
        with CompileNotice(say, steps) as notice:
            model, ids = self.build(64, dp, prog), np.arange(1, 9, dtype=np.int64)
            if epochs > 1 and hasattr(model, "plan_epochs"):
                model.plan_epochs(epochs)
            predictions = model.learn_many(ids, ids, np.full(8, 3.0))
            if predicts:
                notice.next()
                model.predict_many(ids, ids)
            if dp is not None:
                notice.next()
                model.noisy_step(ids, ids, np.full(8, 3.0))
            # the privacy monitor's kernels too: fed every learned batch, inside the timed loop
            notice.next()
            from sketchrec.privacy.monitor import PrivacyMonitor
            keys = model.id_keys.as_keys(ids)
            PrivacyMonitor(window=4, reservoir=4).observe(model, keys, keys, np.full(8, 3.0), predictions)


class CompileNotice:
    """Progress of the warm-up's steps, said only once ``delay`` seconds have passed (a warm
    cache loads every kernel sooner, and then nothing is said): a line for the step running
    then, and one for each later step as it starts.

    Parameters
    ----------
    say : where the lines go; None says nothing.
    steps : the names of the kernel families, in the order they compile.
    delay : seconds before the first line.

    Examples
    --------
    >>> lines = []
    >>> with CompileNotice(lines.append, ["the learner", "predictions"], delay=0.0) as notice:
    ...     notice.wait_shown()
    ...     notice.next()
    >>> lines[-1]
    'compiling kernels (first run only): predictions, 2 of 2…'
    """

    def __init__(self, say: Callable[[str], None] | None, steps: list[str], delay: float = 1.0):
        self.say, self.steps, self.at = say, steps, 0
        self._lock, self._shown = threading.Lock(), threading.Event()
        self._timer = threading.Timer(delay, self._show) if say else None

    def line(self) -> str:
        return (f"compiling kernels (first run only): {self.steps[self.at]}, "
                f"{self.at + 1} of {len(self.steps)}…")

    def _show(self) -> None:
        with self._lock:   # the timer's thread: never between next()'s step and its line
            self._shown.set()
            self.say(self.line())

    def wait_shown(self) -> None:
        self._shown.wait()

    def next(self) -> None:
        """The next step starts."""
        with self._lock:
            self.at += 1
            if self._shown.is_set():
                self.say(self.line())

    def __enter__(self) -> "CompileNotice":
        if self._timer:
            self._timer.daemon = True
            self._timer.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._timer:
            self._timer.cancel()


@dataclass(frozen=True)
class MonitorSettings:
    enabled: bool = True
    window: int = 20_000
    alert: float | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "MonitorSettings":
        return cls(not args.no_monitor, args.kld_window, args.kld_alert)

    def build(self, seed: int, read_at_end_of: int | None = None):
        """The streaming privacy monitor, or None when turned off. ``read_at_end_of``: the
        ratings of a stream whose figures are read at its end only (no alert threshold either):
        its probes that a later one replaces are skipped (``replay.monitor``)."""
        if not self.enabled:
            return None
        if read_at_end_of is not None and self.alert is None:
            from sketchrec.replay.monitor import EndOfStreamMonitor
            return EndOfStreamMonitor(read_at_end_of, window=self.window, seed=seed)
        from sketchrec.privacy.monitor import PrivacyMonitor
        return PrivacyMonitor(window=self.window, alert_kld=self.alert, seed=seed)


@dataclass(frozen=True)
class ServingSettings:
    listen: tuple[str, int] | None = None   # --serve HOST:PORT
    admin_token: str | None = None
    checkpoint: Path | None = None
    access: str | bool = "auto"             # create_app's ``access``: "auto", True or False
    workers: int | None = None              # --workers; None: one per core
    worker_nice: int = 0                    # --worker-nice
    items: Path | None = None               # --items: titles on the served answers
    max_items: int | None = None            # --max-items; None: what the model is sized for

    @property
    def explicit_workers(self) -> str | None:
        """"workers" when --workers N > 1 was given with --serve (the table may refuse it; the
        default, one per core, falls back to one process with a logged line instead)."""
        return "workers" if self.listen and self.workers and self.workers > 1 else None

    @classmethod
    def from_args(cls, args: argparse.Namespace, prog: str = "sketchrec") -> "ServingSettings":
        items = getattr(args, "items", None)
        if items and not args.serve:   # titles are for the served answers only
            refuse(prog, ["--items names the titles of the served answers; give --serve with it"])
        return cls(parse_host_port(args.serve) if args.serve else None, args.admin_token,
                   args.checkpoint, ACCESS[args.access_control], args.workers, args.worker_nice,
                   Path(items) if items else None, getattr(args, "max_items", None))

    def bound(self, service):
        """``service`` with its catalogue held to --max-items (one restored from a checkpoint or a
        snapshot with more items is compacted now); unchanged without the option."""
        if self.max_items is not None:
            service.recommender.catalogue.resize(self.max_items)
        return service


@dataclass(frozen=True)
class EvaluationSettings:
    """The prequential protocol's extra measures (--window, --plot, --topn) and the synthetic
    stream's ground truth (--change-point, --synthetic-taste, --synthetic-noise)."""

    window: int | None = None        # None: 1% of the stream (replay.curve.default_window)
    plot: Path | None = None
    topn: int | None = None          # events sampled for top-N; None: not measured
    change_point: float | None = None
    taste: float | None = None       # the synthetic stream's --synthetic-taste, --synthetic-noise
    noise: float = 0.5

    @classmethod
    def from_args(cls, args: argparse.Namespace, prog: str = "replay") -> "EvaluationSettings":
        settings = cls(args.window, Path(args.plot) if args.plot else None, args.topn,
                       args.change_point, args.synthetic_taste, args.synthetic_noise)
        asked = [flag for flag, value in (("--window", args.window), ("--plot", args.plot),
                                          ("--topn", args.topn)) if value is not None]
        if asked and args.holdout is not None:
            refuse(prog, [f"{asked[0]} belongs to the prequential protocol; leave out --holdout"])
        refuse_inapplicable(prog, args, replay_rules(args))
        if settings.plot is not None:
            writable_file(prog, "--plot", settings.plot)
        given = [flag for flag, value in (("--change-point", args.change_point),
                                          ("--synthetic-taste", args.synthetic_taste)) if value is not None]
        if given and args.path:
            refuse(prog, [f"{given[0]} is a property of the synthetic stream; leave out PATH"])
        return settings


def writable_dir(prog: str, option: str, directory: Path, named: Path | None = None) -> None:
    """Before any learning (no result lost at the end): ``directory`` made if missing, writable."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        refuse(prog, [f"{option} {named or directory}: cannot make "
                      f"{'its directory' if named else 'it'} ({exc.strerror or exc})"])
    if not os.access(directory, os.W_OK):
        refuse(prog, [f"{option} {named or directory}: not writable; give a writable path"])


def writable_file(prog: str, option: str, path: Path) -> None:
    writable_dir(prog, option, path.parent, path)
    if path.is_dir() or path.exists() and not os.access(path, os.W_OK):
        refuse(prog, [f"{option} {path}: " + ("a directory, not a file" if path.is_dir()
                                               else "not writable") + "; give a writable file path"])


def replay_rules(args: argparse.Namespace) -> list[tuple[str, bool, str]]:
    """replay's options that apply to one protocol or one source only (``refuse_inapplicable``)."""
    holdout, synthetic = args.holdout is not None, not args.path
    monitor = "belongs to the prequential protocol's streaming monitor (a holdout run reports a train/test KLD)"
    return [("--speed", holdout, "paces the prequential stream; the holdout protocol trains epochs: leave out one"),
            ("--epochs", not holdout, "belongs to the holdout protocol (--holdout F); a prequential replay is one pass"),
            ("--order", holdout, "orders the prequential stream; the holdout protocol draws a seeded split and "
             "shuffles every epoch: leave out one"),
            *((flag, holdout, monitor) for flag in ("--kld-window", "--kld-alert")),
            *((flag, not synthetic, "is a property of the synthetic stream; leave out PATH")
              for flag in ("--synthetic-ratings", "--synthetic-users", "--synthetic-items", "--synthetic-noise")),
            *((flag, synthetic, "describes a ratings file; give PATH") for flag in ("--columns", "--sep")),
            ("--max-items", not (args.serve or args.checkpoint), "bounds what a service keeps for "
             "serving: give --serve or --checkpoint with it"),
            *((flag, args.ldp_epsilon is None, "describes --ldp-epsilon's mechanism; give it too") for flag in
              ("--ldp-range", "--ldp-debias"))]


@dataclass(frozen=True)
class ReplayConfig:
    """Everything `replay` was asked for."""

    path: str | None
    order: str
    speed: float | None        # multiple of real time; None: as fast as possible
    quiet: bool
    json: bool
    holdout: float | None
    epochs: int
    seed: int
    batch_size: int
    audit_canaries: int
    ldp_epsilon: float | None
    ldp_range: tuple[float, float] | None   # declared; None: the file format's scale
    ldp_debias: bool
    synthetic: tuple[int, int, int]   # ratings, users, items
    rating_range: tuple[float, float] | str | None   # --rating-range; None: the format's, or learned
    model: ModelSettings
    dp: DPSettings
    monitor: MonitorSettings
    serving: ServingSettings
    capacity: int | None = None   # --capacity; None: counted from the data (never in DP modes)
    evaluation: EvaluationSettings = EvaluationSettings()
    columns: dict | None = None   # --columns (sketchrec.formats.parse_columns); None: told from the file
    sep: str | None = None        # --sep; None: told from the first line

    @classmethod
    def from_args(cls, args: argparse.Namespace, prog: str = "replay") -> "ReplayConfig":
        dp = DPSettings.from_args(args)
        holdout = args.holdout is not None
        mode = dp.mode(holdout, args.ldp_epsilon is not None, args.sgld,
                       args.clip_loss)
        model = ModelSettings.from_args(args, dp.enabled, prog)
        serving = ServingSettings.from_args(args, prog)
        listen = ("joint-read-only" if mode in JOINT else "thread") if args.serve else None
        check(prog, Ask(
            "joint" if mode in JOINT and args.model is None else model.kind, mode, args.optimizer,
            "file" if args.path else "synthetic", "holdout" if holdout else "prequential",
            tuple(s for s in (listen, serving.explicit_workers) if s),
            features_of(args, model)))
        evaluation = EvaluationSettings.from_args(args, prog)   # then the options' own checks
        if serving.checkpoint is not None:
            writable_dir(prog, "--checkpoint", serving.checkpoint)
        if dp.problems(holdout):
            refuse(prog, dp.problems(holdout))
        return cls(args.path, args.order, args.speed, args.quiet, args.json, args.holdout,
                   args.epochs, args.seed, args.batch_size, args.audit_canaries, args.ldp_epsilon,
                   args.ldp_range, args.ldp_debias,
                   (args.synthetic_ratings, args.synthetic_users, args.synthetic_items),
                   args.rating_range, model, dp, MonitorSettings.from_args(args),
                   serving, args.capacity, evaluation)


JOINT = (PrivacyMode.JOINT_RATING, PrivacyMode.JOINT_USER)


def features_of(args: argparse.Namespace, model: ModelSettings) -> frozenset[str]:
    """The table's features (and the learner features a privacy mode may forbid) asked for."""
    asked = {"checkpoint": getattr(args, "checkpoint", None), "implicit": model.implicit,
             "canaries": getattr(args, "audit_canaries", 0), "topn": getattr(args, "topn", None),
             "heavy_slots": args.heavy_fraction, "light_dim": args.light_dim is not None
             and args.light_dim != model.dim}
    return frozenset(name for name, value in asked.items() if value)

