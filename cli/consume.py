"""`sketchrec consume`: learn from a Kafka topic of ratings, with exactly-once-in-state checkpoints."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass

from sketchrec.cli.config import (JOINT, DPSettings, ModelSettings, MonitorSettings, ServingSettings,
                                  check, features_of, refuse)
from sketchrec.cli.options import Parser, add_model_args, add_model_kind_arg, add_monitor_args, add_serving_args
from sketchrec.models.capabilities import DEFAULT_KIND, PRIVATE_KIND, Ask
from sketchrec.cli.feedback import topic_feedback
from sketchrec.cli.serving import on_stop_signal, start_server
from sketchrec.stream.health import BROKER_LOST_AFTER

PROG = "sketchrec consume"


def build_parser() -> argparse.ArgumentParser:
    ap = Parser(prog=PROG, description="Learn from a Kafka topic of "
                                 "ratings, with exactly-once-in-state checkpoints (docs/kafka.md).")
    ap.add_argument("--bootstrap", required=True, metavar="HOST:PORT")
    ap.add_argument("--topic", required=True)
    ap.add_argument("--group", help="consumer group (without: all partitions, offsets in checkpoints only)")
    ap.add_argument("--dead-topic", help="dead-letter topic (default: TOPIC.dead)")
    ap.add_argument("--rating-range", default="0.5,5", metavar="L,U",
                    help="ratings outside [L, U] are dead letters; 'none' accepts any finite rating")
    ap.add_argument("--checkpoint-every", type=int, default=50_000, metavar="N",
                    help="ratings (and dead letters) between checkpoints")
    ap.add_argument("--checkpoint-seconds", type=float, default=30.0, metavar="T")
    ap.add_argument("--on-new-topic", choices=("restart", "refuse"), default="restart",
                    help="when the topic was deleted and created again since the checkpoint (a "
                    "new topic id, or offsets beyond its end): consume it from its start "
                    "(default), or refuse to start")
    ap.add_argument("--broker-lost-after", type=float, default=BROKER_LOST_AFTER, metavar="S",
                    help="/healthz answers 503 once no broker was reachable for S seconds "
                    f"(default {BROKER_LOST_AFTER:g})")
    ap.add_argument("--exit-when-idle", type=float, metavar="S",
                    help="stop (with a final checkpoint) after S seconds without messages, once "
                    "every assigned partition is read to its end (a stalled fetch, or a broker that cannot "
                    "say where the partitions end, is waited for up to 30 s more)")
    ap.add_argument("--capacity", type=int, default=100_000,
                    help="expected distinct users + items: sets the sketch width (with --space-gain)")
    ap.add_argument("--expected-ratings", type=int, default=10_000_000,
                    help="sizes the Bloom filter of seen (user, item) pairs")
    ap.add_argument("--seed", type=int, default=0)
    add_model_kind_arg(ap, ("mix", "sketch", "dense", "river", "bias"))
    add_model_args(ap)
    add_monitor_args(ap)
    add_serving_args(ap)
    ap.add_argument("--reset-checkpoints", action="store_true",
                    help="when no checkpoint in --checkpoint verifies: set them aside (renamed "
                    "*.corrupt) and start over from the beginning of every partition; without it "
                    "consume refuses to start (an empty model at the group's offsets would learn "
                    "nothing of the past)")
    fleet = ap.add_argument_group("fleet (docs/fleet.md): many processes of one group share one model")
    fleet.add_argument("--fleet", action="store_true",
                       help="join a fleet: with --group and without --checkpoint; learn from the "
                       f"partitions the group gives this process, share the model over --model-topic; "
                       f"the learner is --model's (default {DEFAULT_KIND}, the default learner; "
                       f"{PRIVATE_KIND} in the privacy modes)")
    fleet.add_argument("--model-topic", metavar="TOPIC", help="the fleet's model topic (default TOPIC.model)")
    fleet.add_argument("--sync-ms", type=float, default=200.0, metavar="MS",
                       help="publish this member's delta every MS milliseconds")
    fleet.add_argument("--sync-ratings", type=int, metavar="N",
                       help="... or after N ratings, whichever comes first (replicas drift apart "
                       "the more each learns alone: see docs/scaling.md). Default: two members 6,000 "
                       "(--model sketch 8,000); "
                       "from three on the model's drift budget over the other members (--model sketch "
                       "6,000, the others 3,000), at least 500, shorter while a few items take most "
                       "ratings; a DP-SGD fleet: 2,000 in whole --dp-batch "
                       "batches (a lone member: 10,000). N sets the interval (no rounding to "
                       "batches), still shortened from three members on while a few items take "
                       "most ratings")
    fleet.add_argument("--snapshot-seconds", type=float, default=60.0, metavar="S",
                       help="the member holding partition 0 writes a snapshot every S seconds")
    ap.add_argument("--ldp-debias", action="store_true",
                    help="map predictions back through the mean of the local-DP mechanism the "
                    "producer's message headers name (docs/privacy/local.md)")
    return ap


@dataclass(frozen=True)
class ConsumeConfig:
    """Everything `sketchrec consume` was asked for."""

    bootstrap: str
    topic: str
    group: str | None
    dead_topic: str | None
    rating_range: tuple[float, float] | None   # None: any finite rating
    checkpoint_every: int
    checkpoint_seconds: float
    exit_when_idle: float | None
    broker_lost_after: float
    capacity: int
    expected_ratings: int
    ldp_debias: bool
    reset: bool
    fleet: "FleetSettings | None"
    model: ModelSettings
    dp: DPSettings
    monitor: MonitorSettings
    serving: ServingSettings
    on_new_topic: str = "restart"   # a re-created topic: "restart" from its start, or "refuse"

    @classmethod
    def from_args(cls, args: argparse.Namespace, ap: argparse.ArgumentParser) -> "ConsumeConfig":
        dp = DPSettings.from_args(args)
        model = ModelSettings.from_args(args, dp.enabled, PROG)
        mode = dp.mode(False, args.ldp_debias, args.sgld, args.clip_loss)
        serving = ServingSettings.from_args(args, PROG)
        # the capability table first: a combination that cannot run is refused before the options
        joint = mode in JOINT and args.model is None   # asked by --dp-model joint
        check(PROG, Ask("joint" if joint else model.kind, mode, args.optimizer, "fleet" if args.fleet else "kafka", None,
                        tuple(s for s in ("thread" if args.serve else None, serving.explicit_workers) if s),
                        features_of(args, model) - {"checkpoint"}))
        if dp.problems(False):
            refuse(PROG, dp.problems(False))
        fleet = FleetSettings.from_args(args, ap)
        if args.checkpoint is None and fleet is None:
            refuse(PROG, ["--checkpoint DIR is required: it holds the model state and the offsets "
                          "together; give it (or --fleet with --group: the model topic holds them)"])
        try:
            rating_range = (None if args.rating_range == "none"
                            else tuple(float(x) for x in args.rating_range.split(",", 1)))
        except ValueError:
            refuse(PROG, ["--rating-range takes L,U or 'none'; e.g. --rating-range 0.5,5"])
        return cls(args.bootstrap, args.topic, args.group, args.dead_topic, rating_range,
                   args.checkpoint_every, args.checkpoint_seconds, args.exit_when_idle,
                   args.broker_lost_after, args.capacity,
                   args.expected_ratings, args.ldp_debias, args.reset_checkpoints, fleet,
                   model, dp, MonitorSettings.from_args(args), serving, args.on_new_topic)


@dataclass(frozen=True)
class FleetSettings:
    """`consume --fleet`: where the fleet's model lives and how often members share."""

    model_topic: str
    sync_ms: float
    snapshot_seconds: float
    sync_ratings: int | None   # None: by the fleet's size (FleetLearner)

    @classmethod
    def from_args(cls, args: argparse.Namespace, ap: argparse.ArgumentParser) -> "FleetSettings | None":
        from sketchrec.stream.fleet.model_topic import model_topic
        if not args.fleet:
            if args.model_topic:
                refuse(PROG, ["--model-topic is for --fleet; give --fleet with it, or leave it out"])
            return None
        if not args.group:
            refuse(PROG, ["--fleet needs --group: the group spreads the partitions over the members; "
                          "give --group G"])
        if args.checkpoint is not None:
            refuse(PROG, ["--fleet keeps its state in the model topic and its snapshots, not in "
                          "--checkpoint; leave --checkpoint out"])
        given = [args.sync_ratings] if args.sync_ratings is not None else []
        if min(args.sync_ms, args.snapshot_seconds, *given) <= 0:
            refuse(PROG, ["--sync-ms, --sync-ratings and --snapshot-seconds must be positive; give "
                          "numbers above 0"])
        return cls(model_topic(args.topic, args.model_topic), args.sync_ms, args.snapshot_seconds,
                   args.sync_ratings)


def open_service(config: ConsumeConfig):
    """The service resumed from the newest checkpoint, or a fresh one; with the monitor (in
    memory only: its reservoir of learned ratings is never checkpointed) and LDP debiasing."""
    from sketchrec.stream.kafka.consumer import resume_or_create
    settings = config.model
    dp = config.dp.config(stream=True, depth=settings.depth, lr=settings.lr) if config.dp.enabled else None
    from sketchrec.models.private.fallback import with_fallback  # DP: never worse than the baseline
    from sketchrec.cli.display import say
    settings.warm(dp, say, PROG)   # compiled before the service's clock starts: not in its ratings/s
    return config.serving.bound(resume_or_create(
        config.serving.checkpoint,
        lambda: with_fallback(settings.build(config.capacity, dp, PROG), config.capacity),
        pair_capacity=config.expected_ratings, seed=settings.seed,
        monitor=config.monitor.build(settings.seed), debias_ldp=config.ldp_debias))


def start(config: ConsumeConfig):
    """The service, its checkpoint directory checked: (service, starting over) or a one-line error
    (text) when no checkpoint verifies (unless ``reset``), the ledger is refused, or the directory
    cannot be written."""
    from sketchrec.stream.checkpoint import CheckpointStore
    from sketchrec.stream.service import UnreadableCheckpoints
    directory = config.serving.checkpoint
    try:
        store = CheckpointStore(directory)
        store.check_writable()
        try:
            return open_service(config), False
        except UnreadableCheckpoints as exc:
            if not config.reset:
                return f"{exc}; --reset-checkpoints sets them aside and starts over", None
            moved = store.set_aside()
            print(f"{PROG}: set aside {len(moved)} unreadable checkpoints (*.corrupt); starting over "
                  "from the beginning of every partition", file=sys.stderr)
            return open_service(config), True
    except OSError as exc:
        return f"checkpoint directory {directory} is not writable: {exc.strerror or exc}", None
    except ValueError as exc:  # the privacy ledger refused (checkpoint.LedgerIntegrityError)
        return str(exc).splitlines()[0], None


def consume_main(argv: list[str] | None = None) -> int:
    from kafka.errors import KafkaError

    from sketchrec.stream.kafka.consumer import KafkaLearner
    from sketchrec.stream.health import configure_logging
    ap = build_parser()
    config = ConsumeConfig.from_args(ap.parse_args(argv), ap)
    configure_logging()
    if config.fleet is not None:
        from sketchrec.cli.fleet import run_member
        return run_member(config)
    service, reset = start(config)
    if isinstance(service, str):
        print(f"{PROG}: {service}", file=sys.stderr)
        return 2
    service.health.broker_lost_after = config.broker_lost_after
    # POST /ratings: produced to the topic, learned when consumed (exactly once, as every rating)
    service.feedback = topic_feedback(config.bootstrap, config.topic, config.rating_range)
    # a DP model (new, or as its checkpoint was built) accounts this pass before learning from
    # it, and the pass is made durable first: a crash can never lose it from the ledger
    if not service.begin_private_pass(config.dp.unit, config.dp.delta, config.dp.budget):
        print(f"{PROG}: one more pass would spend more than --budget-epsilon "
              f"{config.dp.budget}; serving without learning", file=sys.stderr)
    if service.ledger is not None:
        service.checkpoint()
    try:
        learner = KafkaLearner(service, config.bootstrap, config.topic, config.group, config.dead_topic,
                               config.rating_range, config.checkpoint_every, config.checkpoint_seconds,
                               from_beginning=reset, on_new_topic=config.on_new_topic)
    except (KafkaError, RuntimeError) as exc:
        print(f"{PROG}: cannot consume {config.topic!r} from {config.bootstrap}: {exc} (nothing was "
              f"learned; the checkpoint in {config.serving.checkpoint} is untouched)", file=sys.stderr)
        return 2
    serving = config.serving
    server = start_server(service, serving) if serving.listen else None
    on_stop_signal(learner.stop.set)
    print(f"consuming {config.topic} from {config.bootstrap}; resumed at {service.ratings_learned:,} "
          f"ratings, offsets {service.offsets}", file=sys.stderr, flush=True)
    try:
        learner.run(idle_exit=config.exit_when_idle)
        stats = service.stats()
        print(json.dumps({"model": config.model.kind,
                          **{k: stats[k] for k in ("ratings_learned", "skipped", "offsets", "checkpoint",
                                                   "prequential_rmse")}, "privacy": service.privacy()},
                         default=float), flush=True)
    finally:  # the server's threads are stopped on an error too: left to the interpreter's exit,
        if server is not None:   # they run on while it tears the modules down under them
            server.stop()
    if not learner.last_checkpoint_ok:
        print(f"{PROG}: the final checkpoint could not be written ({service.health.checkpoint_error}); "
              "what was learned since the last one is consumed again on restart", file=sys.stderr)
        return 1
    return 0
