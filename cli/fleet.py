"""The fleet side of `sketchrec consume --fleet` and `sketchrec serve --bootstrap … --topic T`."""

from __future__ import annotations

import json
import sys
import threading

from sketchrec.cli.feedback import topic_feedback
from sketchrec.cli.serving import on_stop_signal, serve_until_interrupted, start_server


def run_member(config) -> int:
    """One fleet member (``config``: a ``consume.ConsumeConfig`` with ``fleet`` set) until stopped
    or idle. A fenced member (its delta refused: it was evicted from the group and published
    late) rebuilds its replica and rejoins as a new member, trying again while the broker is
    away; the endpoint keeps serving. 2 when the broker cannot be reached at start."""
    from kafka.errors import KafkaError

    from sketchrec.privacy.keys import key_local_ids
    from sketchrec.stream.fleet.member import FleetLearner, new_member_id, open_replica, rebuild
    from sketchrec.stream.fleet.replicas import NoExactReplica
    from sketchrec.stream.fleet.views import Diverged
    from sketchrec.stream.recommender import Recommender
    prog, settings, fleet = "sketchrec consume", config.model, config.fleet
    member = new_member_id()
    if config.dp.enabled and config.dp.budget is not None:
        print(f"{prog}: --budget-epsilon stops one learner's passes; a fleet's passes are charged on "
              "its model topic (every replica's /privacy reports them); leave it out", file=sys.stderr)
        return 2
    dp, ledger = fleet_dp(config)

    def empty() -> Recommender:  # the first member's model is every member's starting point
        model = settings.build(config.capacity, dp, prog)
        if config.ldp_debias:   # a local-DP fleet keys ids: one key, in the first snapshot
            key_local_ids(model)
        return Recommender(model, seed=settings.seed,
                           pair_capacity=config.expected_ratings, max_items=config.serving.max_items)

    def join(service) -> FleetLearner:
        return FleetLearner(service, config.bootstrap, config.topic, config.group,
                            fleet.model_topic, fleet.sync_ms, fleet.snapshot_seconds, fleet.sync_ratings,
                            dead_topic=config.dead_topic, rating_range=config.rating_range)

    def rejoin(service, as_member: str, stopping: threading.Event) -> FleetLearner | None:
        """``service``'s replica rebuilt from the newest snapshot and the model topic, joined as
        ``as_member`` (``_rejoin``: tried again while the broker is away, None once ``stopping``)."""
        return _rejoin(lambda: rebuild(service, config.bootstrap, fleet.model_topic, as_member,
                                       bound=config.serving.bound),
                       lambda: join(service), stopping, service.health)

    try:
        service = config.serving.bound(open_replica(config.bootstrap, fleet.model_topic, empty, member,
                                                    dp=ledger, ldp_debias=config.ldp_debias))
        state = service.fleet   # its first member's options decided the fleet's model
        if (state.dp, state.ldp_debias) != (ledger, config.ldp_debias):
            print(f"{prog}: the fleet on {fleet.model_topic} learns "
                  f"{_mode_words(state.dp, state.ldp_debias)}, this member was asked for "
                  f"{_mode_words(ledger, config.ldp_debias)}; start every member with the same "
                  "privacy options (or use another --model-topic)", file=sys.stderr)
            return 2
        service.health.broker_lost_after = config.broker_lost_after
        service.feedback = topic_feedback(config.bootstrap, config.topic, config.rating_range)
        try:
            learner = join(service)
        except Diverged as exc:   # its snapshot's writer had read the model topic otherwise
            print(f"{prog}: {exc}", file=sys.stderr, flush=True)
            learner = rejoin(service, member, threading.Event())
    except (KafkaError, RuntimeError, TimeoutError) as exc:
        print(f"{prog}: cannot join the fleet on {config.topic!r} at {config.bootstrap}: {exc}",
              file=sys.stderr)
        return 2
    server = start_server(service, config.serving) if config.serving.listen else None
    stopping, current = threading.Event(), [learner]
    on_stop_signal(lambda: (stopping.set(), current[0].stop.set()))
    print(f"fleet member {member} consuming {config.topic} (group {config.group}, model topic "
          f"{fleet.model_topic}); the fleet's model holds {service.ratings_learned:,} ratings",
          file=sys.stderr, flush=True)
    rebuilt = 0
    try:
        while True:
            learner.run(idle_exit=config.exit_when_idle)
            if learner.refusal is not None:
                print(f"{prog}: {learner.refusal}", file=sys.stderr, flush=True)
                if server is not None:
                    server.stop()
                return 2
            if learner.fenced is None or stopping.is_set():
                break
            member = new_member_id()
            print(f"{prog}: fenced ({learner.fenced}); rebuilding the replica from the newest "
                  f"snapshot and the model topic, rejoining as {member}", file=sys.stderr, flush=True)
            # a fleet member serves from its own process (serving.shared.shareable), whose
            # endpoint reads service.recommender at every request: the swap is all it needs
            rejoined = rejoin(service, member, stopping)
            if rejoined is None:
                break   # stopped while the broker was still away
            learner = current[0] = rejoined
            rebuilt += 1
            if stopping.is_set():
                learner.stop.set()
    except NoExactReplica as exc:   # fenced or truncated, and the newest snapshot is gone too
        print(f"{prog}: {exc}", file=sys.stderr, flush=True)
        if server is not None:
            server.stop()
        return 2
    except BaseException:
        # an error nobody foresaw still stops the endpoint's threads before the interpreter
        # goes down under them (the traceback, then a crash in a thread of a half-torn-down
        # process, was how such a member ended)
        if server is not None:
            server.stop()
        raise
    stats = service.stats()
    print(json.dumps({"model": config.model.kind,
                      **{k: stats[k] for k in ("ratings_learned", "skipped", "offsets", "prequential_rmse")},
                      "privacy": service.privacy(),
                      "member": member, "own_ratings": learner.own, "first_at": learner.first_at,
                      "last_at": learner.last_at, "published_bytes": learner.bytes_published,
                      "progress": learner.progress + [(learner.last_at, learner.own)],
                      "model_position": service.fleet.position, "refused": service.fleet.refused,
                      "rebuilt": rebuilt}, default=float), flush=True)
    if server is not None:
        server.stop()
    return 0


def fleet_dp(config):
    """(the members' ``DPConfig``, the fleet ledger's terms ``{"unit", "delta", "multiplier"}``),
    or (None, None) without DP. A fleet runs DP-SGD without the private fallback (its windowed
    releases are one learner's), so a pass's whole budget goes to the steps: the noise of
    --dp-epsilon E is calibrated with no fallback share. ``multiplier`` is what one pass over
    a partition costs (``DPConfig.stream_multiplier``); None when no noise is added."""
    if not config.dp.enabled:
        return None, None
    from dataclasses import replace

    from sketchrec.privacy.budget import stream_noise_multiplier
    dp = config.dp.config(stream=True, depth=config.model.depth, lr=config.model.lr)
    dp = replace(dp, fallback_share=0.0)
    if config.dp.noise is None and config.dp.sgld_temperature is None and config.dp.target is not None:
        dp = replace(dp, noise_multiplier=stream_noise_multiplier(
            config.dp.target, config.dp.delta, dp.sensitivity_factor, fallback_share=0.0))
    if dp.noise_multiplier == 0:
        return dp, None
    return dp, {"unit": dp.unit, "delta": config.dp.delta, "multiplier": dp.stream_multiplier()}


def _mode_words(ledger: dict | None, ldp_debias: bool) -> str:
    words = "without a privacy ledger" if ledger is None else (
        f"with DP-SGD at the {ledger['unit']} unit (delta {ledger['delta']:g}, noise multiplier "
        f"{ledger['multiplier']:.6g} per pass)")
    return words + (" and --ldp-debias" if ldp_debias else " without --ldp-debias")


def _rejoin(rebuild, join, stopping: threading.Event, health):
    """A fenced member's replica rebuilt and the member rejoined: tried again after the back-off
    (``fleet.outage``) while the broker is stalled or gone, until it works or ``stopping``."""
    from sketchrec.stream.fleet.outage import Outages
    from sketchrec.stream.fleet.replicas import NoExactReplica
    outages = Outages(health)
    while not stopping.is_set():
        try:
            rebuild()
            learner = join()
        except NoExactReplica:
            raise   # no snapshot the model topic still follows: trying again cannot help
        except Exception as exc:  # noqa: BLE001 - a broker away: KafkaError, TimeoutError, OSError
            outages.failed("rebuild", exc)
            continue
        outages.ok("rebuild")
        return learner
    return None


def serve_replica(args, serving) -> int:
    """`sketchrec serve --bootstrap … --topic T`: the newest snapshot plus the model topic, read-only."""
    from kafka.errors import KafkaError

    from sketchrec.cli.serving import accountant_first
    from sketchrec.stream.fleet.member import FleetReplica, open_replica
    from sketchrec.stream.fleet.model_topic import model_topic
    from sketchrec.stream.fleet.replicas import NoExactReplica
    topic = model_topic(args.topic, args.model_topic)
    try:
        service = serving.bound(open_replica(args.bootstrap, topic, wait=args.wait))
        accountant_first(service)   # before the model topic's thread starts (start_server's own call finds it loaded)
        replica = FleetReplica(service, args.bootstrap, topic, bound=serving.bound).start()
    except (KafkaError, TimeoutError, NoExactReplica) as exc:
        print(f"sketchrec serve: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    server = start_server(service, serving)
    serve_until_interrupted(server)
    replica.stop.set()
    return 0
