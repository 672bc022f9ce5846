"""A local-DP topic learned by a fleet: `sketchrec produce`'s device randomiser perturbs every rating
(and names the mechanism in each message's header); two `consume --fleet --ldp-debias` members, one
killed with SIGKILL mid-stream and restarted, and a read-only `serve` replica. Every rating is
learned once on every replica, every /privacy makes the same claim (the producer's epsilon per
rating: the fleet learns post-processed data) with the same counts of perturbed ratings, and the
replicas, keyed by the fleet's one id key and debiased through the topic's mechanism, predict alike.

Without a broker, tests/stream/fleet/test_ldp_origin.py shows the counts and the mechanism
travelling with the deltas and a member's own id key orphaning what another member learned."""

import signal
import sys
import threading
import uuid

import httpx
import numpy as np

from sketchrec.data import SyntheticStream
from conftest import agreeing_predictions, http
from test_fleet import Fleet, compiled_kernels, end_offsets  # noqa: F401 - the kernels compiled first

N = 12_000
SEND_S = 8.0   # the stream's span after its first 1,000 ratings: the kill lands mid-stream
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
        # 30 s: a bound on waiting (a busy replica may take seconds), the answer is asserted on
        return http.get(f"http://127.0.0.1:{port}{route}", params=params, headers=AUTH,
                        timeout=30).json()
    except (httpx.TransportError, ValueError):
        return {}


def test_an_ldp_topic_is_learned_once_by_a_fleet_with_one_claim_through_a_kill_9(kafka_bootstrap, tmp_path):
    from sketchrec.privacy.ldp import DeviceRandomiser
    from sketchrec.stream.kafka.producer import produce
    topic = f"ldpfleet-{uuid.uuid4().hex[:8]}"
    data = SyntheticStream(n_ratings=N, n_users=400, n_items=200, seed=9).all()
    devices = DeviceRandomiser(2.0, 1.0, 5.0)   # one mechanism for the whole topic
    produce(data.take(slice(0, 1000)), kafka_bootstrap, topic, batch=20, partitions=4, randomiser=devices)
    fleet = Fleet(kafka_bootstrap, topic, tmp_path)
    stats = lambda port: get(port, "/stats")   # noqa: E731
    learned = lambda port: stats(port).get("ratings_learned", -1)   # noqa: E731
    try:
        members, [replica] = fleet.launch(member_cmd, members=2, replica_cmd=serve_cmd, count=learned)
        failed: list = []
        killed = threading.Event()

        def send() -> None:   # the second half only after the kill: the kill lands mid-stream
            try:
                for part, gate in ((slice(1000, N // 2), None), (slice(N // 2, N), killed)):
                    if gate is not None and not gate.wait(300):
                        return
                    produce(data.take(part), kafka_bootstrap, topic, batch=20, partitions=4,
                            randomiser=devices, rate=(N - 1000) / SEND_S)
            except BaseException as exc:   # re-raised below, not lost in the thread
                failed.append(exc)
        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        fleet.wait(lambda: learned(replica) >= N // 3, f"{N // 3:,} ratings")
        victim = members[1]   # pinned: which member dies, at a third of the stream
        fleet.procs[victim].send_signal(signal.SIGKILL)
        fleet.procs[victim].wait()
        fleet.mark("kill")
        killed.set()
        members[1] = fleet.start(member_cmd)   # restarted (a new member id)
        sender.join(timeout=120)
        assert not sender.is_alive() and not failed, failed or "the producer did not finish"
        ports = members + [replica]
        ends = end_offsets(kafka_bootstrap, topic)

        def agreed() -> bool:
            figures = [stats(p) for p in ports]
            return all(f.get("ratings_learned") == N and f.get("offsets") == figures[0].get("offsets")
                       for f in figures)
        fleet.wait(agreed, f"{N:,} ratings and the same offsets on every replica", 180)
        for figures in map(stats, ports):   # exactly once: every offset covered, every rating once
            assert all(figures["offsets"][p] >= end for p, end in ends.items())
        fleet.mark("every replica holds every rating")
        answers = [get(p, "/privacy") for p in ports]
        for figures in answers:
            assert figures["mode"] == "ldp" and figures["epsilon"] == 2.0
            assert figures["range"] == [1.0, 5.0] and figures["proven_bound"] is True
            assert figures["local_dp"]["perturbed_on_device"] == N
            assert figures["local_dp"]["raw"] == 0 and figures["local_dp"]["debiased"] is True
        assert all(a == answers[0] for a in answers), answers   # one claim, the same counts
        pairs = list(zip(data.users[:100].tolist(), data.items[:100].tolist()))
        predicted = agreeing_predictions(ports, pairs, headers=AUTH)
        for values in predicted[1:]:
            assert np.max(np.abs(values - predicted[0])) < 1e-4
        assert np.ptp(predicted[0]) > 0.1   # learned, not one constant answer
    finally:
        fleet.stop()


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
