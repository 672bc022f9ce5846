"""The `replay` command (a ratings file, or the synthetic stream, replayed as a stream) and the
`sketchrec` umbrella command."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

import numpy as np

from sketchrec.models.sketch_mf import DEFAULT_HEAVY_FRACTION
from sketchrec.privacy.audit import Canaries
from sketchrec.privacy.monitor import PrivacyMonitor
from sketchrec.replay.protocols import holdout, prequential
from sketchrec.stream.serving.recommender import Monitored
from sketchrec.privacy.report import privacy_figures
from sketchrec.data import ParseReport, Ratings, SyntheticStream, order_ratings, read_ratings

# Defaults tuned on ../shared/data/ml-100k (see README "Defaults").
DEFAULTS = {"dim": 64, "depth": 4, "space_gain": 1.0, "lr": 0.03, "reg": 0.085, "bias_reg": 0.05,
            "init_std": 0.05}
# DP-SGD was tuned on its own (d, lr, reg); it keeps no heavy-hitter filter (membership in it is
# decided by the data, which its accountant does not cover)
DP_DEFAULTS = {"lr": 0.01, "dim": 16, "reg": 0.1, "clip": 1.0, "batch": 1000, "delta": 1e-5}
SYNTHETIC = {"ratings": 500_000, "users": 10_000, "items": 3_000}


def build_parser(prog: str = "replay") -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog=prog, description="Replay a ratings file (or the built-in synthetic stream) as a stream "
        "into an online recommender and report its accuracy and speed.")
    ap.add_argument("path", nargs="?", help="ratings file: MovieLens ratings.csv, ml-100k u.data or "
                    "ml-1m/10m ratings.dat (auto-detected); omitted: the synthetic stream")
    ap.add_argument("--order", choices=("time", "file", "shuffle"), default="time")
    ap.add_argument("--speed", default="max", help="'max', or X = multiple of real time (timestamps)")
    ap.add_argument("--quiet", action="store_true", help="no progress bar")
    ap.add_argument("--json", action="store_true", help="last stdout line: one JSON object of results")
    ap.add_argument("--holdout", type=float, metavar="F", help="holdout protocol: test fraction F")
    ap.add_argument("--epochs", type=int, default=20, help="epochs of the holdout protocol")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model", choices=("sketch", "dense", "river"), default="sketch")
    add_model_args(ap)
    ap.add_argument("--batch-size", type=int, default=10_000)
    add_monitor_args(ap)
    ap.add_argument("--audit-canaries", type=int, metavar="M", default=0,
                    help="one-run canary audit: M canary ratings, each trained on with probability 1/2")
    ap.add_argument("--ldp-epsilon", type=float, metavar="E",
                    help="holdout only: perturb each training rating with Bounded Laplace, as a "
                    "device would (test ratings stay raw)")
    ap.add_argument("--ldp-range", default="1,5", metavar="L,U", help="rating range of --ldp-epsilon")
    ap.add_argument("--ldp-debias", action="store_true",
                    help="map predictions back through the mechanism's mean (undo its centre bias)")
    ap.add_argument("--synthetic-ratings", type=int, default=SYNTHETIC["ratings"])
    ap.add_argument("--synthetic-users", type=int, default=SYNTHETIC["users"])
    ap.add_argument("--synthetic-items", type=int, default=SYNTHETIC["items"])
    add_serving_args(ap)
    return ap


def add_model_args(ap: argparse.ArgumentParser) -> None:
    """The learner's options, shared by replay and consume."""
    ap.add_argument("--dim", type=int, help=f"latent dimension d (default {DEFAULTS['dim']}; "
                    f"{DP_DEFAULTS['dim']} with DP-SGD)")
    ap.add_argument("--depth", type=int, default=DEFAULTS["depth"], help="sketch rows k (1 = feature hashing)")
    width = ap.add_mutually_exclusive_group()
    width.add_argument("--space-gain", type=float, default=DEFAULTS["space_gain"],
                       help="gamma: width = ceil((|U|+|I|) d / (gamma k)) (eq. 4.9)")
    width.add_argument("--width", type=int, help="sketch width w, given directly")
    ap.add_argument("--heavy-fraction", type=float, help="share of the sketch's memory given to "
                    f"exact slots of heavy users and items (default {DEFAULT_HEAVY_FRACTION}; "
                    "0 = the thesis's pure count sketch, and always 0 with DP-SGD)")
    ap.add_argument("--light-dim", type=int, help="components the other ids keep in the sketch "
                    "(default: as many as fill it about once, at most d)")
    ap.add_argument("--lr", type=float, help=f"learning rate eta (default {DEFAULTS['lr']}; "
                    f"{DP_DEFAULTS['lr']} with DP-SGD)")
    ap.add_argument("--reg", type=float, help=f"L2 regularisation lambda (default {DEFAULTS['reg']}; "
                    f"{DP_DEFAULTS['reg']} with DP-SGD)")
    ap.add_argument("--bias-reg", type=float, default=DEFAULTS["bias_reg"], help="L2 weight of the biases")
    ap.add_argument("--init-std", type=float, default=DEFAULTS["init_std"], help="std of start vectors")
    ap.add_argument("--sgld", type=float, metavar="TAU", help="SGLD with temperature TAU")
    ap.add_argument("--clip-loss", type=float, metavar="EPS",
                    help="thesis data clipping: skip a rating when (r - r^)^2 > EPS")
    dp = ap.add_argument_group("DP-SGD (a proven (epsilon, delta) bound; see README 'Privacy')")
    noise = dp.add_mutually_exclusive_group()
    noise.add_argument("--dp-epsilon", type=float, metavar="E",
                       help="train with DP-SGD, noise calibrated so the planned run costs E "
                       "('inf': clipping without noise)")
    noise.add_argument("--dp-noise", type=float, metavar="SIGMA",
                       help="train with DP-SGD at this noise multiplier; epsilon is accounted")
    noise.add_argument("--sgld-dp", type=float, metavar="TAU",
                       help="SGLD at temperature TAU with clipped gradients: the Langevin noise "
                       "(sqrt(k lr TAU) per cell per step) is a Gaussian mechanism, accounted "
                       "like DP-SGD's with sigma = sqrt(k TAU / lr) / C")
    dp.add_argument("--dp-delta", type=float, default=DP_DEFAULTS["delta"])
    dp.add_argument("--dp-clip", type=float, default=DP_DEFAULTS["clip"], metavar="C",
                    help="L2 bound of one rating's update in sketch-cell space")
    dp.add_argument("--dp-batch", type=int, default=DP_DEFAULTS["batch"], metavar="B",
                    help="ratings per noisy step (expected, with Poisson sampling in epochs)")
    dp.add_argument("--dp-unit", choices=("rating", "user"), default="rating",
                    help="what is protected: one rating, or one user's whole history")
    dp.add_argument("--dp-user-cap", type=int, metavar="M",
                    help="ratings kept per user (required with --dp-unit user)")
    dp.add_argument("--dp-range", default="0.5,5", metavar="L,U",
                    help="public rating range: predictions are clipped to it")
    dp.add_argument("--budget-epsilon", type=float, metavar="E",
                    help="stop learning (keep serving) before the spent epsilon would exceed E")


def add_monitor_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--no-monitor", action="store_true", help="turn the privacy monitor off")
    ap.add_argument("--kld-window", type=int, default=20_000, help="ratings in the monitor's KLD window")
    ap.add_argument("--kld-alert", type=float, help="log a warning when the windowed KLD exceeds this")


def add_serving_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--serve", metavar="HOST:PORT",
                    help="serve the live HTTP endpoint while learning (replay: and after it ends, "
                    "until interrupted)")
    ap.add_argument("--admin-token", default=os.environ.get("SKETCHREC_ADMIN_TOKEN"),
                    help="bearer token for POST /checkpoint, /pause, /resume (default: "
                    "$SKETCHREC_ADMIN_TOKEN; none: admin endpoints disabled)")
    ap.add_argument("--checkpoint", metavar="DIR", type=Path,
                    help="checkpoint directory (replay: written at the end and on POST /checkpoint)")


def _pair(text: str, ap=None) -> tuple[float, float]:
    try:
        lo, hi = (float(x) for x in text.split(",", 1))
    except ValueError:
        (ap.error if ap else sys.exit)(f"expected L,U, got {text!r}")
    return lo, hi


def uses_dp(args) -> bool:
    return any(getattr(args, a, None) is not None for a in ("dp_epsilon", "dp_noise", "sgld_dp"))


def resolve_defaults(args) -> None:
    """Fill the options whose default depends on the training mode."""
    private = uses_dp(args)
    if args.dim is None:
        args.dim = DP_DEFAULTS["dim"] if private else DEFAULTS["dim"]
    if args.lr is None:
        args.lr = DP_DEFAULTS["lr"] if private else DEFAULTS["lr"]
    if args.reg is None:
        args.reg = DP_DEFAULTS["reg"] if private else DEFAULTS["reg"]


def dp_config(args, stream: bool):
    """The DP-SGD configuration of the options, or None. With --dp-epsilon and ``stream`` (one
    pass) the noise multiplier is calibrated here; for epoch training it is calibrated by
    ``train_private_epochs`` once the (capped) training set, hence q and the steps, are known."""
    if not uses_dp(args):
        return None
    from sketchrec.models.dp_sgd import DPConfig
    from sketchrec.privacy.accounting import calibrate_noise
    lo, hi = _pair(args.dp_range)
    if args.dp_unit == "user" and not args.dp_user_cap:
        raise SystemExit("--dp-unit user needs --dp-user-cap M")
    factor = 1 if args.dp_unit == "rating" else args.dp_user_cap
    mode = "dp-sgd"
    if args.dp_noise is not None:
        sigma = args.dp_noise
    elif args.sgld_dp is not None:  # the same noise the SGLD kernel puts on a cell, as a multiplier
        sigma, mode = float(np.sqrt(args.depth * args.sgld_dp / args.lr)) / args.dp_clip, "sgld-dp"
    elif np.isinf(args.dp_epsilon) or not stream:
        sigma = 0.0
    else:  # one pass over a stream: replace-one, sensitivity 2C per unit
        sigma = 2 * factor * calibrate_noise(args.dp_epsilon, args.dp_delta)
    return DPConfig(noise_multiplier=sigma, clip=args.dp_clip, batch_size=args.dp_batch,
                    unit=args.dp_unit, user_cap=args.dp_user_cap, rating_range=(lo, hi), mode=mode)


def dp_target(args) -> float | None:
    """The epsilon epoch training must calibrate to (None: the noise was given, or no noise)."""
    eps = getattr(args, "dp_epsilon", None)
    return None if eps is None or np.isinf(eps) else eps


def make_model(args, capacity: int, dp=None):
    common = dict(dim=args.dim, lr=args.lr, reg=args.reg, init_std=args.init_std, seed=args.seed)
    if args.model == "river":
        from sketchrec.models.river_adapters import RiverBiasedMF
        return RiverBiasedMF(**common)
    extra = dict(bias_reg=args.bias_reg, sgld_temperature=args.sgld, clip_loss=args.clip_loss)
    if args.model == "dense":
        from sketchrec.models import DenseMF
        return DenseMF(**common, **extra)
    from sketchrec.models import SketchMF
    try:  # the model checks its own options (heavy_fraction, light_dim, dp): say why, no traceback
        return SketchMF(depth=args.depth, width=args.width, space_gain=args.space_gain,
                        capacity=capacity, dp=dp, heavy_fraction=args.heavy_fraction,
                        light_dim=args.light_dim, **common, **extra)
    except ValueError as exc:
        raise SystemExit(f"replay: {exc}") from exc


def _rss_mb() -> float:
    try:
        with open("/proc/self/statm") as fh:
            import os
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        return float("nan")


class _Display:
    """A rich progress bar on stderr with live RMSE and ratings/s (or nothing when quiet)."""

    def __init__(self, total: int, quiet: bool, label: str):
        self.progress = None
        if not quiet:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
            self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                     TextColumn("RMSE {task.fields[rmse]:.4f}"),
                                     TextColumn("{task.fields[rate]:,.0f} ratings/s"), TimeElapsedColumn(),
                                     console=Console(stderr=True), transient=False)
            self.task = self.progress.add_task(label, total=total, rmse=float("nan"), rate=0.0)

    def __enter__(self):
        if self.progress:
            self.progress.start()
        return self

    def __exit__(self, *exc):
        if self.progress:
            self.progress.stop()

    def __call__(self, done: int, rmse: float, rate: float) -> None:
        if self.progress:
            self.progress.update(self.task, completed=done, rmse=rmse, rate=rate)


def _capacity(data: Ratings) -> int:
    return len(np.unique(data.users)) + len(np.unique(data.items))


def run(args) -> dict:
    speed = None if args.speed == "max" else float(args.speed)
    if speed is not None and speed <= 0:
        raise SystemExit("replay: --speed must be 'max' or a positive number")
    report = ParseReport()
    rss = []
    if args.path:
        data, report = read_ratings(args.path)
        if len(data) == 0:
            raise SystemExit(f"replay: no valid ratings in {args.path}")
        if args.holdout is None:  # a holdout split depends on the data set and seed only
            data = order_ratings(data, args.order, args.seed)
        capacity, total, source = _capacity(data), len(data), str(args.path)
        batches = data.batches(args.batch_size if speed is None else 100)
    else:
        synth = SyntheticStream(args.synthetic_ratings, args.synthetic_users, args.synthetic_items,
                                seed=args.seed)
        capacity, total, source = synth.n_users + synth.n_items, synth.n_ratings, "synthetic"
        data = None
        batches = synth.batches(args.batch_size)
    if args.checkpoint and args.model == "river":
        raise SystemExit("replay: --checkpoint needs a sketchrec model (sketch or dense)")
    resolve_defaults(args)
    canaries = Canaries.make(args.audit_canaries, seed=args.seed + 7) if args.audit_canaries else None
    dp, ledger = None, None
    if uses_dp(args):
        if args.model != "sketch":
            raise SystemExit("replay: DP-SGD is implemented for the sketch model (--model sketch)")
        dp = dp_config(args, stream=args.holdout is None)
        if dp.noise_multiplier > 0 or dp_target(args):
            from sketchrec.privacy.accounting import PrivacyLedger
            ledger = PrivacyLedger(args.dp_unit, args.dp_delta)
    model = make_model(args, capacity, dp)
    # the streaming monitor reads prequential errors: meaningful in one pass only (holdout
    # reports the thesis's train/test KLD instead)
    monitor = None
    if args.holdout is None and not args.no_monitor:
        monitor = PrivacyMonitor(window=args.kld_window, alert_kld=args.kld_alert, seed=args.seed)
    learner, service, server = model, None, None
    if args.serve or args.checkpoint:
        learner, service = make_service(model, total, args.checkpoint, args.seed, monitor)
        service.ledger = ledger
        service.record_skipped(report.skipped)
        if args.serve:
            server = start_server(service, args.serve, args.admin_token)
    elif monitor is not None:
        learner = Monitored(model, monitor)
    if canaries is not None and args.holdout is None:
        batches = with_canaries(batches, canaries, total, args.seed)
    every = 1_000_000

    def sampled(stream):
        seen = 0
        for batch in stream:
            yield batch
            before, seen = seen, seen + len(batch)
            if seen // every > before // every or seen == total:
                rss.append((seen, round(_rss_mb(), 1)))

    if args.holdout is not None:
        if data is None:
            data = Ratings.concat(list(batches))
        with _Display(args.epochs * int(round(len(data) * (1 - args.holdout))), args.quiet,
                      f"{args.model} holdout") as show:
            extra = None
            if canaries is not None:
                users, items, ratings = canaries.training_part()
                extra = Ratings(users, items, ratings, np.zeros(len(ratings), dtype=np.int64))
            perturb, debias = None, None
            if args.ldp_epsilon is not None:
                from sketchrec.privacy.ldp import Debias, DeviceRandomiser
                lo, hi = _pair(args.ldp_range)
                perturb = DeviceRandomiser(args.ldp_epsilon, lo, hi, seed=args.seed + 3).perturb
                debias = Debias(args.ldp_epsilon, lo, hi) if args.ldp_debias else None
            result = holdout(learner, data, args.holdout, args.epochs, args.seed, args.batch_size, show,
                             extra_train=extra, ledger=ledger, budget=args.budget_epsilon,
                             target_epsilon=dp_target(args), perturb=perturb, predict_map=debias)
    else:
        if args.ldp_epsilon is not None:
            raise SystemExit("replay: --ldp-epsilon is simulated in the holdout protocol (--holdout F); "
                             "for a stream, use `sketchrec produce --ldp-epsilon`")
        if ledger is not None and not ledger.begin_pass(dp.stream_multiplier(), args.budget_epsilon):
            raise SystemExit(f"replay: one pass at noise multiplier {dp.noise_multiplier:.4g} would "
                             f"spend more than --budget-epsilon {args.budget_epsilon}")
        with _Display(total, args.quiet, f"{args.model} prequential") as show:
            result = prequential(learner, sampled(batches), show, speed)
    result.update({
        "model": args.model, "source": source, "order": args.order,
        "skipped": dict(report.skipped), "skipped_total": report.n_skipped,
        "skipped_examples": [{"line": n, "reason": r, "text": t} for n, r, t in report.examples],
        "model_bytes": int(model.nbytes), "rss_mb": round(_rss_mb(), 1), "rss_samples": rss,
        "params": {"dim": args.dim, "lr": args.lr, "reg": args.reg, "bias_reg": args.bias_reg,
                   "init_std": args.init_std,
                   "seed": args.seed, "capacity": capacity,
                   **({"depth": args.depth, "width": model.width, "space_gain": args.space_gain,
                       "heavy_fraction": model.heavy_fraction, "heavy_slots": model.heavy.n_slots,
                       "heavy_used": model.heavy.n_used, "light_dim": model.light_dim}
                      if args.model == "sketch" else {}),
                   **({"sgld": args.sgld, "clip_loss": args.clip_loss,
                       "skipped_by_clip_loss": model.n_skipped_clip,
                       "skipped_diverged": model.n_skipped_diverged} if args.model != "river" else {})},
    })
    audit = canaries.audit(model) if canaries is not None else None
    if service is not None:
        service.audit = audit
    holdout_kld = result.pop("kld", None)
    result["privacy"] = privacy_figures(model, monitor, audit, ledger)
    if dp is not None:
        result["privacy"]["dp"] = {**model.dp.to_dict(), "budget_epsilon": args.budget_epsilon,
                                   **result.pop("dp_training", {})}
    result["kld"] = holdout_kld if holdout_kld is not None else result["privacy"].get("kld")
    if service is not None and service.checkpoints is not None:
        result["checkpoint"] = service.checkpoint()
    if server is not None:
        result["serving"] = f"http://{server.server.config.host}:{server.port}"
        result["_server"] = server
    return result


def with_canaries(batches, canaries, total: int, seed: int):
    """The stream with the included audit canaries inserted at random positions."""
    users, items, ratings = canaries.training_part()
    at = np.sort(np.random.default_rng(seed + 11).integers(0, max(total, 1), len(ratings)))
    seen, c = 0, 0
    for batch in batches:
        end = seen + len(batch)
        take = np.flatnonzero((at >= seen) & (at < end)) if c < len(at) else np.empty(0, dtype=np.int64)
        if len(take):
            pos = at[take] - seen  # insert each canary at its position; the stream keeps its order
            stamp = batch.timestamps[np.minimum(pos, len(batch) - 1)] if len(batch) else np.zeros(len(take))
            batch = Ratings(np.insert(batch.users.astype(object), pos, users[take]),
                            np.insert(batch.items.astype(object), pos, items[take]),
                            np.insert(batch.ratings, pos, ratings[take]),
                            np.insert(batch.timestamps, pos, stamp))
            c += len(take)
        seen = end
        yield batch


def make_service(model, expected_ratings: int, checkpoint_dir: Path | None, seed: int, monitor=None):
    """The model wrapped for serving, sized for the stream, and its service."""
    from sketchrec.stream.checkpoint import CheckpointStore
    from sketchrec.stream.serving.recommender import Recommender
    from sketchrec.stream.serving.service import LearningService
    recommender = Recommender(model, pair_capacity=max(expected_ratings, 1000), seed=seed, monitor=monitor)
    store = CheckpointStore(checkpoint_dir) if checkpoint_dir else None
    return recommender, LearningService(recommender, store)


def parse_host_port(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise SystemExit(f"expected HOST:PORT, got {text!r}")
    return host, int(port)


def start_server(service, where: str, admin_token: str | None, privacy=None):
    from sketchrec.stream.serving.http import create_app
    from sketchrec.stream.serving.service import ServerThread
    host, port = parse_host_port(where)
    server = ServerThread(create_app(service, admin_token, privacy), host, port).start()
    print(f"serving http://{host}:{server.port} (admin endpoints "
          f"{'enabled' if admin_token else 'disabled'})", file=sys.stderr, flush=True)
    return server


def serve_until_interrupted(server) -> None:
    """Block until SIGINT/SIGTERM, then stop the server."""
    stop = {"now": False}

    def handler(signum, frame):
        stop["now"] = True

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    while not stop["now"] and server.thread.is_alive():
        time.sleep(0.2)
    server.stop()


def summary(result: dict) -> str:
    p = result["params"]
    lines = [
        f"sketchrec replay — {result['source']} ({result['protocol']}, model={result['model']})",
        f"  ratings learned   {result['ratings']:,}"
        + (f"  (train {result['train']:,} / test {result['test']:,}, {result['epochs']} epochs)"
           if result["protocol"] == "holdout" else f"  (order: {result['order']})"),
        f"  RMSE / MAE        {result['rmse']:.4f} / {result['mae']:.4f}",
        f"  time              {result['seconds']:.2f} s  ({result['throughput_per_s']:,.0f} ratings/s)",
        f"  model memory      {result['model_bytes'] / 1e6:.2f} MB  (process RSS {result['rss_mb']:.0f} MB)",
        f"  parameters        d={p['dim']} lr={p['lr']} reg={p['reg']}"
        + (f" k={p['depth']} w={p['width']} gamma={p['space_gain']}" if "depth" in p else ""),
        *([f"  heavy filter      {p['heavy_used']:,} of {p['heavy_slots']:,} slots "
           f"({p['heavy_fraction']:g} of the memory); other ids keep {p['light_dim']} of "
           f"{p['dim']} components in the sketch"] if p.get("heavy_slots") else []),
    ]
    priv = result["privacy"]
    if priv.get("epsilon") is not None:
        lines.append(f"  guarantee         epsilon {priv['epsilon']:.4g}"
                     + (f", delta {priv['delta']:g}" if priv.get("delta") else "")
                     + f" per {priv['privacy_unit']} — "
                     + ("proven upper bound" if priv["proven_bound"] else "heuristic, not a proven bound"))
    lines.append(f"  privacy           mode {priv['mode']}; KLD "
                 + (f"{result['kld']:.4f}" if result.get("kld") is not None else "n/a")
                 + " (eq. 4.15, heuristic)"
                 + (f"; canary audit epsilon >= {priv['audit_epsilon_lower_bound']:.2f} (95%)"
                    if "audit" in priv else ""))
    if result["skipped_total"]:
        lines.append(f"  malformed lines   {result['skipped_total']:,} set aside: "
                     + ", ".join(f"{r}: {c}" for r, c in result["skipped"].items()))
        lines += [f"    line {e['line']}: {e['reason']}: {e['text']!r}" for e in result["skipped_examples"]]
    return "\n".join(lines)


def replay_main(argv: list[str] | None = None, prog: str = "replay") -> int:
    args = build_parser(prog).parse_args(argv)
    if args.path and not Path(args.path).is_file():
        print(f"{prog}: no such file: {args.path}", file=sys.stderr)
        return 2
    result = run(args)
    server = result.pop("_server", None)
    print(summary(result))
    if args.json:
        print(json.dumps(result, default=float), flush=True)
    if server is not None:
        print(f"replay finished; still serving {result['serving']} until interrupted (Ctrl-C)",
              file=sys.stderr, flush=True)
        serve_until_interrupted(server)
    return 0


def serve_main(argv: list[str] | None = None) -> int:
    from sketchrec.models import DenseMF, SketchMF
    from sketchrec.stream.serving.service import LearningService
    ap = argparse.ArgumentParser(prog="sketchrec serve", description="Serve the newest checkpoint "
                                 "read-only, reloading when a newer one is written.")
    ap.add_argument("--checkpoint", metavar="DIR", type=Path, required=True)
    ap.add_argument("--listen", metavar="HOST:PORT", default="127.0.0.1:8000")
    ap.add_argument("--reload-every", type=float, default=5.0, metavar="S",
                    help="seconds between checks for a newer checkpoint")
    args = ap.parse_args(argv)
    try:
        service = LearningService.from_checkpoint(args.checkpoint, {"SketchMF": SketchMF, "DenseMF": DenseMF})
    except FileNotFoundError as exc:
        print(f"sketchrec serve: {exc}", file=sys.stderr)
        return 2
    server = start_server(service, args.listen, admin_token=None)

    def reload_loop():
        while server.thread.is_alive():
            time.sleep(args.reload_every)
            service.reload_if_newer()  # the app reads service.recommender on every request
    import threading
    threading.Thread(target=reload_loop, daemon=True).start()
    serve_until_interrupted(server)
    return 0


def experiment_main(argv: list[str] | None = None) -> int:
    from sketchrec.replay.experiments import registry
    ap = argparse.ArgumentParser(prog="sketchrec experiment", description="Run a reproducible experiment.")
    ap.add_argument("name", nargs="?", help="experiment name (see --list)")
    ap.add_argument("--list", action="store_true", help="list the experiments")
    ap.add_argument("--data", type=Path, help="data path, where the experiment takes one")
    ap.add_argument("--out", type=Path, default=Path("out"), help="output directory")
    ap.add_argument("--quick", action="store_true", help="reduced grid (for tests)")
    args = ap.parse_args(argv)
    experiments = registry()
    if args.list or not args.name:
        for name, mod in experiments.items():
            print(f"{name:20s} {mod.DESCRIPTION}")
        return 0
    if args.name not in experiments:
        print(f"sketchrec experiment: unknown experiment {args.name!r}; see --list", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    experiments[args.name].run(args.data, args.out, args.quick)
    print(f"{args.name}: wrote {args.out} in {time.perf_counter() - t0:.1f} s")
    return 0


def consume_main(argv: list[str] | None = None) -> int:
    from kafka.errors import KafkaError

    from sketchrec.models import DenseMF, SketchMF
    from sketchrec.stream.kafka.consumer import KafkaLearner, resume_or_create
    ap = argparse.ArgumentParser(prog="sketchrec consume", description="Learn from a Kafka topic of "
                                 "ratings, with exactly-once-in-state checkpoints (see README).")
    ap.add_argument("--bootstrap", required=True, metavar="HOST:PORT")
    ap.add_argument("--topic", required=True)
    ap.add_argument("--group", help="consumer group (without: all partitions, offsets in checkpoints only)")
    ap.add_argument("--dead-topic", help="dead-letter topic (default: TOPIC.dead)")
    ap.add_argument("--rating-range", default="0.5,5", metavar="L,U",
                    help="ratings outside [L, U] are dead letters; 'none' accepts any finite rating")
    ap.add_argument("--checkpoint-every", type=int, default=50_000, metavar="N",
                    help="ratings (and dead letters) between checkpoints")
    ap.add_argument("--checkpoint-seconds", type=float, default=30.0, metavar="T")
    ap.add_argument("--exit-when-idle", type=float, metavar="S",
                    help="stop (with a final checkpoint) after S seconds without messages")
    ap.add_argument("--capacity", type=int, default=100_000,
                    help="expected distinct users + items: sets the sketch width (with --space-gain)")
    ap.add_argument("--expected-ratings", type=int, default=10_000_000,
                    help="sizes the Bloom filter of seen (user, item) pairs")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model", choices=("sketch", "dense"), default="sketch")
    add_model_args(ap)
    add_monitor_args(ap)
    add_serving_args(ap)
    ap.add_argument("--ldp-debias", action="store_true",
                    help="map predictions back through the mean of the local-DP mechanism the "
                    "producer's message headers name (see README 'Local DP')")
    args = ap.parse_args(argv)
    if args.checkpoint is None:
        ap.error("--checkpoint DIR is required: it holds the model state and the offsets together")
    try:
        rating_range = (None if args.rating_range == "none"
                        else tuple(float(x) for x in args.rating_range.split(",", 1)))
    except ValueError:
        ap.error("--rating-range takes L,U or 'none'")
    resolve_defaults(args)
    if uses_dp(args) and args.model != "sketch":
        ap.error("DP-SGD is implemented for the sketch model (--model sketch)")
    dp = dp_config(args, stream=True)
    service = resume_or_create(args.checkpoint, lambda: make_model(args, args.capacity, dp),
                               {"SketchMF": SketchMF, "DenseMF": DenseMF}, args.expected_ratings, args.seed)
    # a DP model (new, or as its checkpoint was built) accounts this pass before learning from
    # it, and the pass is made durable first: a crash can never lose it from the ledger
    if not service.begin_private_pass(args.dp_unit, args.dp_delta, args.budget_epsilon):
        print(f"sketchrec consume: one more pass would spend more than --budget-epsilon "
              f"{args.budget_epsilon}; serving without learning", file=sys.stderr)
    if service.ledger is not None:
        service.checkpoint()
    if args.ldp_debias:
        service.debias_ldp = True
        service.apply_ldp_debias()  # from the mechanism recorded in the checkpoint, if any
    if not args.no_monitor:  # in memory only: its reservoir of learned ratings is never checkpointed
        service.recommender.monitor = PrivacyMonitor(window=args.kld_window, alert_kld=args.kld_alert,
                                                     seed=args.seed)
    try:
        learner = KafkaLearner(service, args.bootstrap, args.topic, args.group, args.dead_topic,
                               rating_range, args.checkpoint_every, args.checkpoint_seconds)
    except (KafkaError, RuntimeError) as exc:
        print(f"sketchrec consume: cannot consume {args.topic!r} from {args.bootstrap}: {exc} "
              f"(nothing was learned; the checkpoint in {args.checkpoint} is untouched)", file=sys.stderr)
        return 2
    server = start_server(service, args.serve, args.admin_token) if args.serve else None

    def stop(signum, frame):
        learner.stop.set()

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    print(f"consuming {args.topic} from {args.bootstrap}; resumed at {service.ratings_learned:,} "
          f"ratings, offsets {service.offsets}", file=sys.stderr, flush=True)
    learner.run(idle_exit=args.exit_when_idle)
    stats = service.stats()
    print(json.dumps({**{k: stats[k] for k in ("ratings_learned", "skipped", "offsets", "checkpoint",
                                               "prequential_rmse")}, "privacy": service.privacy()},
                     default=float), flush=True)
    if server is not None:
        server.stop()
    return 0


def produce_main(argv: list[str] | None = None) -> int:
    from kafka.errors import KafkaError

    from sketchrec.stream.kafka.producer import order_for_topic, produce
    ap = argparse.ArgumentParser(prog="sketchrec produce", description="Publish a ratings file to a "
                                 "Kafka topic (keyed by user; the topic is created if needed).")
    ap.add_argument("path", type=Path, help="any ratings file replay reads")
    ap.add_argument("--bootstrap", required=True, metavar="HOST:PORT")
    ap.add_argument("--topic", required=True)
    ap.add_argument("--rate", type=float, help="ratings per second (default: as fast as possible)")
    ap.add_argument("--batch", type=int, default=1, help="ratings per message (1: one CSV rating each)")
    ap.add_argument("--partitions", type=int, default=2, help="partitions when creating the topic")
    ap.add_argument("--ldp-epsilon", type=float, metavar="E",
                    help="local DP: perturb every rating with Bounded Laplace before it is sent")
    ap.add_argument("--rating-range", metavar="L,U", help="the rating range of --ldp-epsilon")
    ap.add_argument("--seed", type=int, help="seed of the device-side noise (default: fresh entropy)")
    args = ap.parse_args(argv)
    if not args.path.is_file():
        print(f"sketchrec produce: no such file: {args.path}", file=sys.stderr)
        return 2
    randomiser = None
    if args.ldp_epsilon is not None:
        from sketchrec.privacy.ldp import DeviceRandomiser
        if not args.rating_range:
            ap.error("--ldp-epsilon needs --rating-range L,U")
        randomiser = DeviceRandomiser(args.ldp_epsilon, *_pair(args.rating_range, ap), seed=args.seed)
    data, report = read_ratings(args.path)
    try:
        result = produce(order_for_topic(data), args.bootstrap, args.topic, args.batch, args.rate,
                         args.partitions, randomiser)
    except KafkaError as exc:
        print(f"sketchrec produce: cannot publish to {args.bootstrap}: {exc}", file=sys.stderr)
        return 2
    result["skipped"] = dict(report.skipped)
    print(f"produced {result['ratings']:,} ratings in {result['messages']:,} messages to {args.topic} "
          f"in {result['seconds']:.1f} s ({result['ratings_per_s']:,.0f} ratings/s)", file=sys.stderr)
    print(json.dumps(result))
    return 0


COMMANDS = {
    "replay": ("replay a ratings file or the synthetic stream into the learner",
               lambda argv: replay_main(argv, prog="sketchrec replay")),
    "experiment": ("run a reproducible experiment (figures, tables, JSON)", experiment_main),
    "serve": ("serve the newest checkpoint read-only over HTTP", serve_main),
    "consume": ("learn from a Kafka topic with checkpoints and dead letters", consume_main),
    "produce": ("publish a ratings file to a Kafka topic", produce_main),
    "bench": ("throughput, memory, serving and Kafka benchmarks against river and Vowpal Wabbit",
              lambda argv: __import__("sketchrec.replay.bench.suite", fromlist=["main"]).main(argv)),
}


def sketchrec_main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(prog="sketchrec", description="Privacy-aware streaming recommender "
                                 "with count-sketch matrix factorization.")
    ap.add_argument("command", choices=sorted(COMMANDS), help="; ".join(
        f"{name}: {desc}" for name, (desc, _) in sorted(COMMANDS.items())))
    ap.add_argument("args", nargs=argparse.REMAINDER, help="the command's own arguments (see COMMAND --help)")
    if not argv or argv[0] in ("-h", "--help"):
        ap.print_help()
        return 0
    ns = ap.parse_args(argv[:1])
    return COMMANDS[ns.command][1](argv[1:])


if __name__ == "__main__":
    sys.exit(sketchrec_main())
