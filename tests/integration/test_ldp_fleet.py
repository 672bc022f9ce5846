"""A local-DP topic learned by a fleet: `sketchrec produce`'s device randomiser perturbs every rating
(and names the mechanism in each message's header); two `consume --fleet --ldp-debias` members and
a read-only `serve` replica. Every rating is learned once on every replica, every /privacy makes
the same claim (the producer's epsilon per rating: the fleet learns post-processed data), and the
replicas, keyed by the fleet's one id key and debiased through the topic's mechanism, predict alike.

The counts and the mechanism travel with the deltas (``FleetState.origin``); without a broker below,
a member's own id key (what one learner draws on its first perturbed rating) is shown to orphan
what another member learned."""

import sys
import uuid

import httpx
import numpy as np

from sketchrec.data import SyntheticStream
from test_fleet import Fleet, compiled_kernels, end_offsets  # noqa: F401 - the kernels compiled first

N = 6000
TOKEN = "ldp-fleet-token"
MODEL = ["--model", "sketch", "--dim", "8", "--capacity", "4000", "--seed", "3"]
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def member_cmd(bootstrap, topic, port):
    return [sys.executable, "-m", "sketchrec", "consume", "--bootstrap", bootstrap, "--topic", topic,
            "--group", f"g-{topic}", "--fleet", "--sync-ms", "100", "--snapshot-seconds", "3",
            "--expected-ratings", str(2 * N), *MODEL, "--ldp-debias",
            "--serve", f"127.0.0.1:{port}", "--workers", "1", "--admin-token", TOKEN]


def serve_cmd(bootstrap, topic, port):
    return [sys.executable, "-m", "sketchrec", "serve", "--bootstrap", bootstrap, "--topic", topic,
            "--listen", f"127.0.0.1:{port}", "--admin-token", TOKEN]


def get(port: int, route: str, **params) -> dict:
    try:
        return httpx.get(f"http://127.0.0.1:{port}{route}", params=params, headers=AUTH,
                         timeout=5).json()
    except (httpx.TransportError, ValueError):
        return {}


def test_an_ldp_topic_is_learned_once_by_a_fleet_with_one_claim(kafka_bootstrap, tmp_path):
    from sketchrec.privacy.ldp import DeviceRandomiser
    from sketchrec.stream.kafka.producer import produce
    topic = f"ldpfleet-{uuid.uuid4().hex[:8]}"
    data = SyntheticStream(n_ratings=N, n_users=400, n_items=200, seed=9).all()
    produce(data, kafka_bootstrap, topic, batch=20, partitions=4,
            randomiser=DeviceRandomiser(2.0, 1.0, 5.0))
    fleet = Fleet(kafka_bootstrap, topic, tmp_path)
    stats = lambda port: get(port, "/stats")   # noqa: E731
    try:
        ports = [fleet.start(member_cmd) for _ in range(2)] + [fleet.start(serve_cmd)]
        ends = end_offsets(kafka_bootstrap, topic)

        def agreed() -> bool:
            figures = [stats(p) for p in ports]
            return all(f.get("ratings_learned") == N and f.get("offsets") == figures[0].get("offsets")
                       for f in figures)
        # long: on a cold kernel cache each member compiles the delta kernels (minutes on a loaded
        # 2-core machine); about 40 s once they are cached
        fleet.wait(agreed, f"{N:,} ratings and the same offsets on every replica", 420)
        for figures in map(stats, ports):   # exactly once: every offset covered, every rating once
            assert all(figures["offsets"][p] >= end for p, end in ends.items())
        fleet.mark("every replica holds every rating")
        answers = [get(p, "/privacy") for p in ports]
        for figures in answers:
            assert figures["mode"] == "ldp" and figures["epsilon"] == 2.0
            assert figures["range"] == [1.0, 5.0] and figures["proven_bound"] is True
            assert figures["local_dp"]["perturbed_on_device"] == N
            assert figures["local_dp"]["raw"] == 0 and figures["local_dp"]["debiased"] is True
        claims = [{k: a[k] for k in ("mode", "epsilon", "guarantee", "privacy_unit", "local_dp")}
                  for a in answers]
        assert all(claim == claims[0] for claim in claims)
        pairs = list(zip(data.users[:100].tolist(), data.items[:100].tolist()))
        predicted = [np.array([get(p, "/predict", user=u, item=i)["rating"] for u, i in pairs])
                     for p in ports]
        for values in predicted[1:]:
            assert np.max(np.abs(values - predicted[0])) < 1e-4
        assert np.ptp(predicted[0]) > 0.1   # learned, not one constant answer
    finally:
        fleet.stop()


def _header(epsilon=2.0):
    from sketchrec.privacy.ldp import HEADER, DeviceRandomiser
    return [(HEADER, DeviceRandomiser(epsilon, 1.0, 5.0).header())]


def test_a_member_drawing_its_own_id_key_orphans_the_others_learning():
    """Broken variant: a member counting a perturbed message as one learner does draws its own id
    key, and two replicas keyed apart answer each other's ratings with the untrained prior; a
    fleet member only counts it (the key is the first snapshot's) and the replicas answer alike."""
    from sketchrec.models import SketchMF
    from sketchrec.privacy.keys import IdKey, IdKeys, id_keys_of
    from sketchrec.stream.fleet.model_replicas import replica_for
    from sketchrec.stream.fleet.model_topic import FleetState
    from sketchrec.stream.fleet.replicas import FleetService
    from sketchrec.stream.recommender import Recommender
    from sketchrec.stream.service import LearningService
    data = SyntheticStream(n_ratings=2000, n_users=60, n_items=40, seed=4).all()
    shared = IdKeys(IdKey.fresh())   # the first snapshot's

    def replica(service_cls, keys=None):
        model = SketchMF(dim=8, capacity=500, seed=3)
        if keys is not None:
            model.id_keys = keys
        service = service_cls(Recommender(model, pair_capacity=1000))
        service.fleet = FleetState(ldp_debias=True)
        service.record_origin(_header(), 20)   # its first perturbed message
        return model

    def gap(a, b):
        ra, rb = replica_for(a), replica_for(b)
        a.learn_many(data.users, data.items, data.ratings)
        rb.apply(ra.take())
        return np.max(np.abs(a.predict_many(data.users[:50], data.items[:50])
                             - b.predict_many(data.users[:50], data.items[:50])))

    a, b = replica(FleetService, shared), replica(FleetService, shared)
    assert id_keys_of(a) is shared and gap(a, b) < 1e-6
    a, b = replica(LearningService), replica(LearningService)   # broken: each draws its own key
    assert id_keys_of(a).keyed and id_keys_of(a) is not id_keys_of(b) and gap(a, b) > 0.1


def test_the_origin_travels_with_the_deltas_and_every_replica_debiases():
    """A member's counts go into its next delta's header (and are taken once); every replica
    settling the deltas sums them, names the mechanism and maps predictions back through it."""
    from collections import Counter

    from sketchrec.models import SketchMF
    from sketchrec.models.metrics import ErrorStats
    from sketchrec.stream.fleet.model_topic import FleetState, decode_meta, encode_meta, HEADER
    from sketchrec.stream.fleet.replicas import FleetService
    from sketchrec.stream.recommender import Recommender
    member = FleetService(Recommender(SketchMF(dim=4, capacity=200), pair_capacity=100))
    member.fleet = FleetState("m1", ldp_debias=True)
    member.record_origin(_header(), 20)
    member.record_origin(None, 3)
    metas = [decode_meta([(HEADER, encode_meta("m1", seq, {0: (seq, seq + 1)}, ErrorStats(),
                                               Counter(), origin=member.take_origin()))])
             for seq in range(2)]
    assert metas[0]["origin"]["perturbed_on_device"] == 20 and metas[0]["origin"]["raw"] == 3
    assert "origin" not in metas[1]   # taken once
    replica = FleetService(Recommender(SketchMF(dim=4, capacity=200), pair_capacity=100))
    replica.fleet = FleetState.from_dict(FleetState(ldp_debias=True).to_dict())
    for offset, meta in enumerate(metas):
        replica.fleet.settle(meta, offset)
    replica.follow_origin()
    assert replica.origin == {**metas[0]["origin"]} and replica.debias_ldp
    assert replica.recommender.debias is not None
    assert replica.privacy()["local_dp"]["server_saw_raw_ratings"] is True
    undebiased = FleetService(Recommender(SketchMF(dim=4, capacity=200), pair_capacity=100))
    undebiased.fleet = FleetState()
    undebiased.fleet.settle(metas[0], 0)
    undebiased.follow_origin()
    assert undebiased.recommender.debias is None   # the fleet's choice, not the header's


def test_members_starting_at_once_adopt_the_first_empty_snapshot(kafka_bootstrap):
    """Two members find no snapshot and each writes its empty model, keyed by the id key it drew:
    every replica adopts the first one written (the broken rule, the newest, would give the two
    members different keys), while a snapshot of a later model position still wins."""
    from sketchrec.models import SketchMF
    from sketchrec.privacy.keys import ID_KEY_PART, key_local_ids
    from sketchrec.stream.fleet import snapshots
    from sketchrec.stream.fleet.model_topic import FleetState
    from sketchrec.stream.fleet.replicas import ensure_fleet_topics, model_producer, write_snapshot
    from sketchrec.stream.recommender import Recommender
    model_topic = f"first-{uuid.uuid4().hex[:8]}.model"
    ensure_fleet_topics(kafka_bootstrap, model_topic)
    topic, producer = snapshots.snapshot_topic(model_topic), model_producer(kafka_bootstrap)
    keys = []
    try:
        for position in (0, 0, 0, 5):
            model = SketchMF(dim=4, capacity=100, seed=3)
            key_local_ids(model)
            rec = Recommender(model, pair_capacity=100)
            keys.append(rec.id_keys.parts()[ID_KEY_PART])
            write_snapshot(producer, topic, rec, FleetState(position=position), "SketchMF")
            if position == 0:
                assert snapshots.newest(kafka_bootstrap, topic).parts[ID_KEY_PART] == keys[0]
    finally:
        producer.close(timeout=10)
    assert len(set(keys)) == 4
    assert snapshots.newest(kafka_bootstrap, topic).parts[ID_KEY_PART] == keys[3]
