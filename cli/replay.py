"""`replay`: a ratings file (or the built-in synthetic stream) replayed as a stream into an online
learner, reporting its accuracy, speed, memory and privacy figures."""

from __future__ import annotations

import argparse
import math
import os
import sys
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from sketchrec.data import Ratings
from sketchrec.cli.config import ReplayConfig, refuse
from sketchrec.cli.display import ProgressBar, say, summary, to_json
from sketchrec.cli.options import (Parser, add_evaluation_args, add_model_args, add_model_kind_arg,
                                          add_monitor_args, add_serving_args, nonnegative_int, positive_float, positive_int, rating_range,
                                          speed, unit_fraction, value_range)
from sketchrec.cli.fetch import resolve_data
from sketchrec.cli.feedback import replay_feedback
from sketchrec.cli.serving import serve_until_interrupted, start_server
from sketchrec.cli.source import Source, add_data_args, open_source, path_problem, scale_free
from sketchrec.replay.batches import hashed_once, rss_mb, sample_rss, with_canaries

if TYPE_CHECKING:  # the run's parts, imported when a command needs them
    from sketchrec.models.private.dp_sgd import DPConfig
    from sketchrec.privacy.accounting import PrivacyLedger
    from sketchrec.privacy.audit import Canaries
    from sketchrec.privacy.ldp import LDPSettings
    from sketchrec.privacy.monitor import PrivacyMonitor
    from sketchrec.stream.service import LearningService

SYNTHETIC = {"ratings": 500_000, "users": 10_000, "items": 3_000}


def build_parser(prog: str = "replay") -> argparse.ArgumentParser:
    ap = Parser(
        prog=prog, description="Replay a ratings file (or the built-in synthetic stream) as a stream "
        "into an online recommender and report its accuracy and speed.")
    ap.add_argument("path", nargs="?", help="ratings file: MovieLens ratings.csv, ml-100k u.data or "
                    "ml-1m/10m ratings.dat (auto-detected, plain or .gz), or a data-set name "
                    "(ml-100k, ml-1m, ml-10m, ml-20m, ml-25m, ml-latest-small: fetched and cached on "
                    "first use, see `sketchrec fetch`); omitted: the synthetic stream")
    ap.add_argument("--order", choices=("time", "file", "shuffle"), default="time",
                    help="prequential: by timestamp, as in the file, or shuffled (seeded)")
    ap.add_argument("--rating-range", type=rating_range, metavar="L,U|none",
                    help="ratings outside [L, U] are set aside by reason (default: the format's "
                    "declared scale, 1,5 for u.data and ratings.dat, 0.5,5 for MovieLens "
                    "ratings.csv; else learned from the first ratings); 'none': any finite rating")
    add_data_args(ap)   # --columns, --sep
    ap.add_argument("--speed", type=speed, default=None, help="'max', or X = multiple of real time (timestamps)")
    ap.add_argument("--quiet", action="store_true", help="no progress bar")
    ap.add_argument("--json", action="store_true",
                    help="stdout: one JSON object of results, nothing else (the summary goes to stderr)")
    ap.add_argument("--holdout", type=unit_fraction, metavar="F", help="holdout protocol: test fraction F")
    ap.add_argument("--epochs", type=positive_int, default=20, help="epochs of the holdout protocol")
    ap.add_argument("--seed", type=nonnegative_int, default=0, help="seeds the model, split and shuffles")
    add_model_kind_arg(ap, ("mix", "sketch", "dense", "river", "bias"))
    add_model_args(ap)
    ap.add_argument("--batch-size", type=positive_int, default=10_000, help="ratings learned per batch")
    ap.add_argument("--capacity", type=positive_int, metavar="N",
                    help="distinct users + items the sketch is sized for (default: counted from the "
                    "data; in the DP modes a public default, never the data's count)")
    add_monitor_args(ap)
    ap.add_argument("--audit-canaries", type=nonnegative_int, metavar="M", default=0,
                    help="one-run canary audit: M canary ratings, each trained on with probability 1/2")
    ap.add_argument("--ldp-epsilon", type=positive_float, metavar="E",
                    help="holdout only: perturb each training rating with Bounded Laplace, as a "
                    "device would (test ratings stay raw)")
    ap.add_argument("--ldp-range", type=value_range, metavar="L,U", help="declared rating range of --ldp-epsilon "
                    "(default: the file format's scale, e.g. 1,5 for u.data, 0.5,5 for ratings.csv)")
    ap.add_argument("--ldp-debias", action="store_true",
                    help="map predictions back through the mechanism's mean (undo its centre bias)")
    ap.add_argument("--synthetic-ratings", type=positive_int, default=SYNTHETIC["ratings"], help="synthetic: its length")
    ap.add_argument("--synthetic-users", type=positive_int, default=SYNTHETIC["users"], help="synthetic: distinct users")
    ap.add_argument("--synthetic-items", type=positive_int, default=SYNTHETIC["items"], help="synthetic: distinct items")
    add_evaluation_args(ap)
    add_serving_args(ap)
    return ap


def replay_main(argv: list[str] | None = None, prog: str = "replay") -> int:
    """Run `replay`: 0 when done, 130 when interrupted (Ctrl-C: the partial summary of what was
    learned); a bad option or file ends it with a one-line message on stderr (SystemExit)."""
    args = build_parser(prog).parse_args(argv)
    try:
        args.path = resolve_data(args.path, prog)   # a data-set name becomes its cached file
    except SystemExit as exc:
        print(exc, file=sys.stderr)
        return 2
    problem = path_problem(args.path) if args.path else None
    if problem:
        print(f"{prog}: {problem}", file=sys.stderr)
        return 2
    started: list = []   # the server, once started: stopped on every way out of the command
    try:
        return _replay(args, prog, started)
    finally:
        for server in started:   # never left running into the interpreter's exit: a server
            server.stop()        # thread still ticking there (uvloop's timer) crashed it (SIGSEGV)


def _replay(args, prog: str, started: list) -> int:
    try:  # the checks below end the command by SystemExit with a one-line message
        config = ReplayConfig.from_args(args, prog)
        config = replace(config, columns=args.columns, sep=args.sep)   # the file's layout
        if config.dp.joint(config.holdout is not None):
            result, server = _joint(config)
        else:
            run = prepare(config, prog)
            if run.service is not None:   # POST /ratings: this run's way to take them
                run.service.feedback = replay_feedback(run)
            server = start_server(run.service, config.serving) if config.serving.listen else None
            started += [server] if server is not None else []
            result = execute(run)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted before any rating was learned", file=sys.stderr)
        return 130
    if server is not None:
        started[:] = [server]
        result["serving"] = server.url
    return _report(config, result, server, prog)


def _report(config: ReplayConfig, result: dict, server, prog: str) -> int:
    """Print the result (and its plot); with a server and a complete result, serve on until
    interrupted. The exit code: 0, 130 for an interrupted replay, 1 for a diverged model."""
    if config.evaluation.plot and "curve" in result:
        from sketchrec.replay.curve import plot_curves
        label = f"{result['model']} ({os.path.basename(result['source'])})"
        try:
            plot_curves({label: result["curve"]}, config.evaluation.plot,
                        change_at=(result.get("synthetic") or {}).get("change_at"))
        except OSError as exc:   # the result is still reported below
            print(f"{prog}: --plot {config.evaluation.plot}: not written ({exc.strerror or exc})",
                  file=sys.stderr)
    # with --json stdout carries the JSON object only, so `replay ... --json | jq` works
    print(summary(result), file=sys.stderr if config.json else sys.stdout, flush=True)
    if config.json:
        print(to_json(result), flush=True)
    if result.get("interrupted"):
        return 130
    if not math.isfinite(result["rmse"]):   # a result, but not a usable one: never exit 0
        print(f"{prog}: the model diverged (RMSE is not finite); try a smaller --lr or --init-std, "
              "or check the ratings (--rating-range)", file=sys.stderr)
        return 1
    if server is not None:
        print(f"replay finished; still serving {server.url} until interrupted (Ctrl-C)",
              file=sys.stderr, flush=True)
        serve_until_interrupted(server)
    return 0


def _joint(config: ReplayConfig):
    """The joint-DP mode (cli/joint.py) on the whole data set: its result, and with
    --serve the server over the fitted model (read-only; else None)."""
    from sketchrec.cli.joint import check_joint, run_joint
    check_joint(config, "replay")
    source = open_source(config, "replay")
    data = source.data if source.data is not None else Ratings.concat(list(source.batches))
    result, service = run_joint(config, data, source.name, config.path, source.report)
    server = start_server(service, config.serving) if service is not None else None
    return {**result, "rss_mb": round(rss_mb(), 1)}, server


@dataclass
class Run:
    """Everything one replay uses, built complete before the first rating is learned."""

    config: ReplayConfig
    source: Source
    model: object        # SketchMF, DenseMF or RiverBiasedMF
    learner: object      # the model itself, the service's recommender, or the model Wrapped with its monitor
    monitor: PrivacyMonitor | None
    dp: DPConfig | None
    ledger: PrivacyLedger | None
    canaries: Canaries | None
    service: LearningService | None
    ldp: LDPSettings | None = None   # the simulated device-side LDP of the holdout protocol


def prepare(config: ReplayConfig, prog: str = "replay") -> Run:
    """Check the options against each other and build the source, model, ledger and service."""
    source = open_source(config, prog)
    settings = config.model   # checked against the capability table by ReplayConfig.from_args
    stream = config.holdout is None
    canaries = None
    if config.audit_canaries:
        from sketchrec.privacy.audit import Canaries
        canaries = Canaries.make(config.audit_canaries, seed=config.seed + 7)
    dp, ledger = None, None
    if config.dp.enabled:
        dp = config.dp.config(stream=stream, depth=settings.depth, lr=settings.lr)
        if dp.noise_multiplier > 0 or config.dp.target:
            ledger = _ledger(config)
    # compile numba's kernels on a throwaway model first: compiling is not learning time, and the
    # real model is built after it (its constructor seeds the kernels' random generator)
    predicts = not stream or dp is not None or config.evaluation.topn is not None or bool(
        config.monitor.enabled or config.serving.listen or config.serving.checkpoint)   # these predict
    settings.warm(dp, None if config.quiet else say, predicts=predicts, epochs=1 if stream else config.epochs)
    model = settings.build(source.capacity, dp, prog)
    from sketchrec.models.private.fallback import with_fallback
    model = with_fallback(model, source.capacity)   # DP: never worse than the private baseline
    if ledger is not None and stream and not ledger.begin_pass(dp.stream_multiplier(), config.dp.budget):
        refuse(prog, [f"one pass at noise multiplier {dp.noise_multiplier:.4g} would spend more "
                      f"than --budget-epsilon {config.dp.budget}; raise the budget or the noise"])
    # prequential errors: one pass only (holdout has its KLD); unless served, read at the end
    served = config.serving.listen or config.serving.checkpoint
    monitor = config.monitor.build(config.seed, None if served else source.total) if stream else None
    learner, service = model, None
    if config.serving.listen or config.serving.checkpoint:
        from sketchrec.stream.service import FeedingLearner
        service = make_service(model, source, config, monitor, ledger)
        learner = service.recommender if not stream else FeedingLearner(service)
    elif monitor is not None:
        from sketchrec.models.wrapped import Wrapped
        learner = Wrapped(model, monitor)
    learner = scale_free(learner, source, config)   # another scale: learned as on 1..5
    return Run(config, source, model, learner, monitor, dp, ledger, canaries, service,
               _ldp(config, source))


def _ledger(config: ReplayConfig) -> PrivacyLedger:
    """A new ledger, or the one the checkpoint directory holds: a DP checkpoint directory never
    starts a fresh ledger (the budget spent there stays spent)."""
    from sketchrec.stream.checkpoint import continue_ledger
    try:
        return continue_ledger(config.serving.checkpoint, config.dp.unit, config.dp.delta)
    except ValueError as exc:  # LedgerIntegrityError included: a tampered ledger is refused
        raise SystemExit(f"replay: {exc}") from None


def _ldp(config: ReplayConfig, source: Source) -> LDPSettings | None:
    """The LDP mechanism's settings, on the declared range (the option, else the format's scale;
    never a silent 1-5)."""
    if config.ldp_epsilon is None:
        return None
    from sketchrec.privacy.ldp import LDPSettings, declared_range
    try:
        return LDPSettings(config.ldp_epsilon, *declared_range(config.ldp_range, source.fmt))
    except ValueError as exc:
        raise SystemExit(f"replay: {exc}") from None


def make_service(model, source: Source, config: ReplayConfig, monitor: PrivacyMonitor | None,
                 ledger: PrivacyLedger | None) -> LearningService:
    """The model wrapped for serving, sized for the stream, in a service that owns its ledger."""
    from sketchrec.stream.checkpoint import CheckpointStore
    from sketchrec.stream.recommender import Recommender
    from sketchrec.stream.service import LearningService
    recommender = Recommender(model, pair_capacity=max(source.total, 1000), seed=config.seed,
                              monitor=monitor, max_items=config.serving.max_items)
    store = CheckpointStore(config.serving.checkpoint) if config.serving.checkpoint else None
    service = LearningService(recommender, store, ledger=ledger)
    service.record_skipped(source.report.skipped)
    return service


def execute(run: Run) -> dict:
    """Learn (prequential or holdout), then the result: accuracy, speed, memory, privacy."""
    config = run.config
    rss: list[tuple[int, float]] = []
    if config.holdout is not None:
        result = _holdout(run)
    else:
        batches = run.source.batches
        if run.canaries is not None:
            batches = with_canaries(batches, run.canaries, run.source.total, config.seed)
        elif _hashes_as_wrapped(run):   # each id hashed once: the keys the learner would make
            batches = hashed_once(batches, run.source.data)
        with ProgressBar(run.source.total, config.quiet, f"{config.model.kind} prequential") as show:
            from sketchrec.replay.curve import default_window
            from sketchrec.replay.protocols import prequential
            result = prequential(run.learner, sample_rss(batches, run.source.total, rss), show,
                                 config.speed, config.evaluation.window or default_window(run.source.total),
                                 _topn(run))
    return _finish(run, result, rss)


def _hashes_as_wrapped(run: Run) -> bool:
    """Whether batches of the ids' public keys reach the learner as its ids would: a monitored
    learner (models.wrapped.Wrapped hashes a batch's ids, and takes keys as they are) under the
    public hash, with nothing that reads a batch's ids (top-N, canaries)."""
    from sketchrec.models.wrapped import Wrapped
    inner = getattr(run.learner, "learner", run.learner)   # through ScaleFree
    return isinstance(inner, Wrapped) and not inner.id_keys.keyed and run.config.evaluation.topn is None


def _topn(run: Run):
    """The top-N evaluator of --topn (replay.topn), scoring with the model itself, or None."""
    if run.config.evaluation.topn is None:
        return None
    from sketchrec.replay.topn import TopN, sample_positions
    data = run.source.data
    positions = sample_positions(run.source.total, run.config.evaluation.topn, run.config.seed,
                                 None if data is None else data.ratings)
    if hasattr(run.model, "score_items"):   # compiles its kernel: not evaluation time (read-only)
        run.model.score_items(0, np.arange(2))
    return TopN(run.model, positions)


def _holdout(run: Run) -> dict:
    from sketchrec.replay.protocols import holdout
    config, data = run.config, run.source.data
    if data is None:
        data = Ratings.concat(list(run.source.batches))
    total = config.epochs * int(round(len(data) * (1 - config.holdout)))
    with ProgressBar(total, config.quiet, f"{config.model.kind} holdout") as show:
        extra = None
        if run.canaries is not None:
            users, items, ratings = run.canaries.training_part()
            extra = Ratings(users, items, ratings, np.zeros(len(ratings), dtype=np.int64))
        perturb, debias = None, None
        if run.ldp is not None:
            from sketchrec.privacy.ldp import Debias
            eps, lo, hi = run.ldp.epsilon, run.ldp.lower, run.ldp.upper
            perturb = run.ldp.randomiser().perturb   # fresh secret noise (privacy.entropy)
            debias = Debias(eps, lo, hi) if config.ldp_debias else None
        return holdout(run.learner, data, config.holdout, config.epochs, config.seed,
                       config.batch_size, show, extra_train=extra, ledger=run.ledger,
                       budget=config.dp.budget, target_epsilon=config.dp.target, perturb=perturb,
                       predict_map=debias)


def _finish(run: Run, result: dict, rss: list) -> dict:
    from sketchrec.privacy.report import privacy_figures
    config, model, report = run.config, run.model, run.source.report
    result.update({
        "model": config.model.kind, "source": run.source.name, "order": config.order,
        **report.summary(),
        "rating_range": None if report.rating_range is None else list(report.rating_range),
        "rating_range_source": report.range_source if config.path else None,
        "model_bytes": int(model.nbytes), "rss_mb": round(rss_mb(), 1), "rss_samples": rss,
        "params": _params(run),
    })
    synthetic = run.source.synthetic
    if synthetic is not None:   # the ground truth's figures, beside what was learned of it
        result["synthetic"] = {"noise_floor": synthetic.noise_floor(), "rank": synthetic.rank,
                               "noise": synthetic.noise, "taste": synthetic.taste,
                               "change_point": synthetic.change_point,
                               "change_at": synthetic.change_at if synthetic.change_point else None}
    audit = run.canaries.audit(model) if run.canaries is not None else None
    if run.service is not None:
        run.service.record_audit(audit)
    holdout_kld = result.pop("kld", None)
    result["privacy"] = privacy_figures(model, run.monitor, audit, run.ledger, ldp=run.ldp)
    if run.dp is not None:
        result["privacy"]["dp"] = {**model.dp.to_dict(), "budget_epsilon": config.dp.budget,
                                   **result.pop("dp_training", {})}
        result["privacy"].update(model.fallback_figures())
        result = {**model.component_rmse(), **result}   # holdout: its test figures win
    result["kld"] = holdout_kld if holdout_kld is not None else result["privacy"].get("kld")
    if "private_mean_rmse" in result:   # said when the private model served worse than the mean
        from sketchrec.privacy.report import versus_private_mean
        result["versus_private_mean"] = versus_private_mean(result["rmse"], result["private_mean_rmse"])
    if run.service is not None:
        run.service.finish()   # the stream ended: the dashboard says so
        if run.service.checkpoints is not None:
            try:
                result["checkpoint"] = run.service.checkpoint()
            except OSError as exc:   # a full disk: the result is still reported
                print(f"replay: --checkpoint: not written ({exc.strerror or exc})", file=sys.stderr)
    params = result["params"]  # what the model set aside (loss clipping, divergence) was not learned
    result["learned"] = result["ratings"] - (params.get("skipped_by_clip_loss") or 0) \
        - (params.get("skipped_diverged") or 0)
    return result


def _params(run: Run) -> dict:
    s, model = run.config.model, run.model
    if s.kind in ("mix", "bias"):
        mix = s.kind == "mix"
        return {"members": model.describe() if mix else "damped running user + item biases",
                **({"weights": model.weights.round(4).tolist()} if mix else {}),
                "seed": s.seed, "capacity": run.source.capacity,
                "skipped_diverged": model.n_skipped_diverged}
    return {"dim": s.dim, "lr": s.lr, "reg": s.reg, "bias_reg": s.bias_reg, "init_std": s.init_std,
            "seed": s.seed, "capacity": run.source.capacity,
            **({"depth": s.depth, "width": model.width, "space_gain": s.space_gain,
                "heavy_fraction": model.heavy_fraction, "heavy_slots": model.heavy.n_slots,
                "heavy_used": model.heavy.n_used, "light_dim": model.light_dim}
               if s.kind == "sketch" else {}),
            **({"optimizer": s.optimizer, "implicit": model.implicit} if s.kind == "sketch" else {}),
            **({"sgld": s.sgld, "clip_loss": s.clip_loss, "skipped_by_clip_loss": model.n_skipped_clip,
                "skipped_diverged": model.n_skipped_diverged} if s.kind != "river" else {})}
