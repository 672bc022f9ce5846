"""A fleet on a real broker: learners that share one model through the model topic, one killed
with SIGKILL, one added and one stalled past its session timeout mid-stream, and a read-only
serving replica.

The stream is SKETCHREC_FLEET_RATINGS ratings (default 100,000) on a 6-partition topic, produced over
SEND_S seconds while the fleet learns, so that the kill, the join and the stall land mid-stream (the
time line, not the count, is what the test needs: more ratings only cost CPU)."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import httpx
import numpy as np
import pytest

from sketchrec.data import SyntheticStream
from sketchrec.stream.kafka.messages import encode_batch
from sketchrec.stream.kafka.producer import ensure_topic
from conftest import agreeing_predictions, http, served_port, stop_processes
from fleet_topics import model_record, views_against_one_reading

N = int(os.environ.get("SKETCHREC_FLEET_RATINGS", 100_000))
SEND_S = 15.0   # the stream's span: the stalled member's 9 s and its eviction fit inside it
MODEL = ["--model", "sketch", "--dim", "8", "--capacity", "6000", "--seed", "3"]


def member_cmd(bootstrap, topic, port):
    return [sys.executable, "-m", "sketchrec", "consume", "--bootstrap", bootstrap, "--topic", topic,
            "--group", f"g-{topic}", "--fleet", "--sync-ms", "100",
            "--snapshot-seconds", "4",
            "--expected-ratings", str(2 * N), *MODEL, "--serve", f"127.0.0.1:{port}"]


def serve_cmd(bootstrap, topic, port):
    return [sys.executable, "-m", "sketchrec", "serve", "--bootstrap", bootstrap, "--topic", topic,
            "--listen", f"127.0.0.1:{port}"]


def send(bootstrap: str, topic: str, data, seconds: float, batch: int = 100) -> None:
    """``data`` as messages of ``batch`` ratings (keyed by message, spread over the partitions),
    paced to take about ``seconds``."""
    from kafka import KafkaProducer
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, acks="all")
    rows = list(zip(data.users.tolist(), data.items.tolist(), data.ratings.tolist(),
                    data.timestamps.tolist()))
    t0 = time.monotonic()
    for n, at in enumerate(range(0, len(rows), batch)):
        producer.send(topic, key=str(n).encode(), value=encode_batch(rows[at:at + batch]))
        wait = t0 + seconds * (at + batch) / len(rows) - time.monotonic()
        if wait > 0:
            time.sleep(wait)
    producer.flush()
    producer.close()


def stats(port: int) -> dict | None:
    if port < 0:   # a process that serves nothing (``Fleet``)
        return None
    try:
        return http.get(f"http://127.0.0.1:{port}/stats", timeout=10).json()   # a busy process may take seconds
    except (httpx.TransportError, ValueError):
        return None


def learned(port: int) -> int:
    return (stats(port) or {}).get("ratings_learned", -1)


class Fleet:
    """A fleet's processes, addressed by the port each bound itself (port 0, read from its log: a
    port picked by the test could be taken before the child binds it); one that serves nothing is
    addressed by a negative number."""

    def __init__(self, bootstrap, topic, tmp_path):
        self.bootstrap, self.topic, self.tmp = bootstrap, topic, tmp_path
        self.procs: dict[int, subprocess.Popen] = {}
        self.logs: dict[int, Path] = {}
        self.spawned: list[subprocess.Popen] = []
        self.t0 = time.monotonic()

    def open(self, data, partitions: int) -> None:
        """The topic, with ``partitions``, holding the stream's first 1,000 ratings."""
        ensure_topic(self.bootstrap, self.topic, partitions=partitions)
        send(self.bootstrap, self.topic, data.take(slice(0, 1000)), 0)
        self.t0 = time.monotonic()

    def mark(self, what: str) -> None:
        """A line of the test's time line (shown with -s, or when it fails)."""
        print(f"{time.monotonic() - self.t0:6.1f}s {what}", flush=True)

    def spawn(self, cmd_of) -> tuple[subprocess.Popen, Path]:
        """A process started (on port 0 if it serves), its log; ``port_of`` addresses it."""
        log = self.tmp / f"proc-{len(self.spawned)}.log"
        with log.open("w") as out:
            self.spawned.append(subprocess.Popen(cmd_of(self.bootstrap, self.topic, 0), stdout=out,
                                                 stderr=subprocess.STDOUT))
        return self.spawned[-1], log

    def port_of(self, spawned: tuple[subprocess.Popen, Path], serves: bool = True) -> int:
        """The port a spawned process bound (once its log says where it serves), or for one that
        serves nothing a number of its own."""
        proc, log = spawned
        port = served_port(log, proc) if serves else -1 - self.spawned.index(proc)
        self.procs[port], self.logs[port] = proc, log
        return port

    def start(self, cmd_of, serves: bool = True) -> int:
        return self.port_of(self.spawn(cmd_of), serves)

    def launch(self, member_cmd, members: int, replica_cmd=serve_cmd, replicas: int = 1,
               count=learned, members_serve: bool = True,
               timeout: float = 300.0) -> tuple[list[int], list[int]]:
        """``members`` members and ``replicas`` read replicas started; returns (member ports,
        replica ports) once every member has learned a rating (``count`` of a port: its ratings
        learned), or every replica when the members serve nothing (a DP fleet). ``timeout`` bounds
        the wait only: a fleet's interpreters starting at once on a loaded machine once took
        over 120 s."""
        # every process started before any is waited for: they start side by side
        spawned = [self.spawn(member_cmd) for _ in range(members)]
        replicas_spawned = [self.spawn(replica_cmd) for _ in range(replicas)]
        started = [self.port_of(m, members_serve) for m in spawned]
        serving = [self.port_of(r) for r in replicas_spawned]
        watched = started if members_serve else serving
        self.wait(lambda: all(count(p) > 0 for p in watched), "the first ratings learned", timeout)
        self.mark("first learned")
        return started, serving

    def alive(self) -> list[int]:
        return [p for p, proc in self.procs.items() if proc.poll() is None]

    def alive_procs(self) -> list[subprocess.Popen]:
        return [self.procs[p] for p in self.alive()]

    def log(self, port, tail: int = 3000) -> str:
        return self.logs[port].read_text()[-tail:]

    def wait(self, condition, what: str, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            dead = [p for p, proc in self.procs.items() if proc.poll() not in (None, -9)]
            assert not dead, "\n".join(self.log(p) for p in dead)
            if time.monotonic() >= deadline:
                behind = ", ".join(f"{p}={learned(p)}" for p in self.alive())
                for proc in self.alive_procs():   # every thread's stack into its log (SIGUSR1)
                    proc.send_signal(signal.SIGUSR1)
                time.sleep(1.0)
                raise AssertionError(f"timed out waiting for {what}: {behind}\n" + "\n".join(
                    f"--- {p}:\n{self.log(p, 8000)}" for p in self.alive()) + model_record(self))
            time.sleep(0.2)

    def stop(self) -> None:
        stop_processes(self.spawned)


def end_offsets(bootstrap: str, topic: str) -> dict:
    from kafka import KafkaConsumer, TopicPartition
    consumer = KafkaConsumer(bootstrap_servers=bootstrap)
    tps = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic)]
    ends = {str(tp.partition): offset for tp, offset in consumer.end_offsets(tps).items()}
    consumer.close()
    return ends


def cli_model(options=MODEL):
    """The model a member builds from these command-line options."""
    from sketchrec.cli.consume import build_parser
    from sketchrec.cli.config import ModelSettings
    args = build_parser().parse_args(["--bootstrap", "x", "--topic", "t", *options])
    return ModelSettings.from_args(args, False).build(args.capacity)


@pytest.fixture(scope="module", autouse=True)
def compiled_kernels():
    """The fleet's kernels compiled (and cached on disk) here, before any member starts: on a
    fresh checkout, four processes compiling them at once on two cores spend the test's waits."""
    from sketchrec.stream.kafka.fast_records import scan_records
    from sketchrec.stream.kafka.messages import parse_fast
    from sketchrec.stream.recommender import Recommender
    from sketchrec.stream.fleet.tracker import DeltaTracker
    parse_fast([encode_batch([(1, 2, 4.0, 0)])])
    scan_records(np.zeros(0, np.uint8), 0, 0)
    data = SyntheticStream(n_ratings=20_000, n_users=4000, n_items=1500, seed=1).all()
    recs = [Recommender(cli_model(), pair_capacity=N) for _ in range(2)]
    trackers = [DeltaTracker(rec) for rec in recs]
    for at, size in ((0, 50), (50, 19_950)):   # a take's tracked pass, then its full pass
        part = data.take(slice(at, at + size))
        recs[0].learn_many(part.users, part.items, part.ratings)
        trackers[1].apply(trackers[0].take())
    for tracker in trackers:
        tracker.settle()
    pairs = data.take(slice(0, 1000))
    agree = [rec.predict_many(pairs.users, pairs.items) for rec in recs]
    np.testing.assert_allclose(agree[0], agree[1], atol=1e-4)   # (float32 sums: not bit for bit)


def single_learner_rmse(data, model=None) -> float:
    """Prequential RMSE of one learner (the CLI's model unless given) over the same ratings, in
    batches of 500."""
    model = cli_model() if model is None else model
    sq = 0.0
    for at in range(0, len(data), 500):
        part = data.take(slice(at, at + 500))
        predictions = model.learn_many(part.users, part.items, part.ratings)
        sq += float(((predictions - part.ratings) ** 2).sum())
    return float(np.sqrt(sq / len(data)))


def test_fleet_kill_9_and_join_learn_every_rating_once(kafka_bootstrap, tmp_path):
    topic = f"fleet-{uuid.uuid4().hex[:8]}"
    data = SyntheticStream(n_ratings=N, n_users=4000, n_items=1500, seed=5).all()
    rng = np.random.default_rng(5)   # pinned: which member dies and when
    fleet = Fleet(kafka_bootstrap, topic, tmp_path)
    fleet.open(data, partitions=6)
    mark = fleet.mark
    try:
        members, [replica] = fleet.launch(member_cmd, members=3)
        rest = data.take(slice(1000, N))
        sender = threading.Thread(target=send, args=(kafka_bootstrap, topic, rest, SEND_S))
        sender.start()
        kill_at, join_at = sorted(rng.uniform(0.15 * N, 0.6 * N, 2).astype(int))
        fleet.wait(lambda: learned(replica) >= kill_at, f"{kill_at:,} ratings")
        mark("kill")
        victim = members[rng.integers(3)]
        fleet.procs[victim].send_signal(signal.SIGKILL)
        fleet.procs[victim].wait()
        fleet.wait(lambda: learned(replica) >= join_at, f"{join_at:,} ratings")
        mark("join")
        joining = fleet.spawn(member_cmd)
        # a zombie: a survivor stalled past the group's session timeout (6 s) is evicted, its
        # partitions move on, and it wakes up to publish what it had learned: refused once the
        # new owner's claim is in, it rebuilds its replica and rejoins (it must not die)
        zombie = next(p for p in members[:3] if p != victim)
        fleet.procs[zombie].send_signal(signal.SIGSTOP)
        waking = threading.Timer(9.0, fleet.procs[zombie].send_signal, args=(signal.SIGCONT,))
        waking.start()
        mark("stall")
        members.append(fleet.port_of(joining))   # its port once it serves: after the stall began
        sender.join(timeout=120)
        waking.join()
        live = [p for p in members if p != victim] + [replica]
        mark("sent")
        fleet.wait(lambda: all(learned(p) == N for p in live), f"{N:,} ratings everywhere", 180)
        mark("all learned")

        pairs = list(zip(rng.choice(data.users, 1000).tolist(), rng.choice(data.items, 1000).tolist()))
        answers = dict(zip(live, agreeing_predictions(live, pairs)))
        mark("predicted")
        first = answers[replica]
        for port, values in answers.items():
            assert np.max(np.abs(values - first)) < 1e-4, port
        figures = [stats(p) for p in live]
        assert {f["ratings_learned"] for f in figures} == {N}
        # every replica covers the same offsets, every message included (Tansu's end offset can
        # lag the last message's by one)
        assert all(f["offsets"] == figures[0]["offsets"] for f in figures)
        ends = end_offsets(kafka_bootstrap, topic)
        assert all(figures[0]["offsets"][p] >= end for p, end in ends.items())
        fleet_rmse = figures[0]["prequential_rmse"]
        assert [f["prequential_rmse"] for f in figures] == pytest.approx([fleet_rmse] * len(figures))
        single = single_learner_rmse(data)
        mark(f"single learner: fleet RMSE {fleet_rmse:.5f}, single {single:.5f}")
        assert abs(fleet_rmse - single) <= 0.01 * single
        mark(f"the stalled member rebuilt its replica: {'rebuilding' in fleet.log(zombie)}")
        # every member, the joiner and the zombie included, read the topic as a replica reading it
        # once from the start: each header's view is that replica's digest at its position
        checked, differing = views_against_one_reading(fleet)
        assert checked >= 10 and differing == []
    finally:
        for proc in fleet.alive_procs():
            proc.send_signal(signal.SIGCONT)   # a stalled member must wake to obey SIGTERM
        fleet.stop()


@pytest.mark.parametrize("extra, message", [
    (["--fleet"], "--fleet needs --group"),
    (["--fleet", "--group", "g", "--sync-ratings", "0"], "must be positive"),
    (["--fleet", "--group", "g", "--checkpoint", "d"], "not in --checkpoint"),
    (["--fleet", "--group", "g", "--dp-epsilon", "1", "--serve", "127.0.0.1:0"], "serve the fleet's model from"),
    (["--fleet", "--group", "g", "--implicit", "8"], "--implicit does not run as a fleet"),
    (["--group", "g"], "or --fleet with --group"),
    (["--group", "g", "--checkpoint", "d", "--model-topic", "m"], "--model-topic is for --fleet"),
])
def test_fleet_options_are_checked(extra, message, capsys):
    from sketchrec.cli.consume import ConsumeConfig, build_parser
    ap = build_parser()
    with pytest.raises(SystemExit) as exit_:
        ConsumeConfig.from_args(ap.parse_args(["--bootstrap", "x:1", "--topic", "t", *extra]), ap)
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_fleet_mode_is_chosen_by_fleet_only():
    from sketchrec.cli.consume import ConsumeConfig, build_parser
    ap = build_parser()
    single = ConsumeConfig.from_args(ap.parse_args(["--bootstrap", "x:1", "--topic", "t", "--group", "g",
                                                    "--checkpoint", "d"]), ap)
    fleet = ConsumeConfig.from_args(ap.parse_args(["--bootstrap", "x:1", "--topic", "t", "--group", "g",
                                                   "--fleet", "--sync-ms", "50"]), ap)
    assert single.fleet is None
    assert (fleet.fleet.model_topic, fleet.fleet.sync_ms) == ("t.model", 50.0)


def _message(offset, member, seq, covers, value=b"delta", claims=()):
    from types import SimpleNamespace
    from sketchrec.models.metrics import ErrorStats
    from sketchrec.stream.fleet.model_topic import HEADER, encode_meta
    errors = ErrorStats(n=1, sq=1.0, abs=1.0) if covers else ErrorStats()
    return SimpleNamespace(offset=offset, value=value, headers=[
        (HEADER, encode_meta(member, seq, covers, errors, {}, claims))])


def test_the_model_topic_decides_once_what_counts():
    """Every replica applies the same rule to the same order: a late delta that covers offsets
    already covered (a member that lost its partitions without knowing) counts nowhere, a retry's
    copy counts once, and the member whose own delta is refused learns it is fenced."""
    from sketchrec.stream.fleet.model_feed import ModelFeed
    from sketchrec.stream.fleet.model_topic import Fenced, FleetState
    feed = object.__new__(ModelFeed)
    applied = []
    feed.state, feed.apply, feed.bytes_read = FleetState(member="me"), applied.append, 0
    feed._take(_message(0, "a", 0, {0: (0, 10), 1: (5, 8)}))       # first coverage: any start
    feed._take(_message(1, "b", 0, {0: (10, 20)}))                  # continues partition 0
    feed._take(_message(2, "a", 1, {0: (10, 15)}))                  # a zombie's late delta: refused
    feed._take(_message(3, "b", 0, {0: (10, 20)}))                  # a retry's copy: read once
    feed._take(_message(4, "me", 0, {1: (8, 9)}, value=b"mine"))    # own: settled, not re-applied
    assert applied == [b"delta", b"delta"]
    assert feed.state.covered == {"0": 20, "1": 9} and feed.state.position == 5
    assert feed.state.errors.n == 3 and feed.state.refused == 1
    with pytest.raises(Fenced):
        feed._take(_message(5, "me", 1, {0: (15, 30)}))
    # a claim: from it on, only the claimant's deltas count for its partitions, even where a
    # zombie's delta would continue the coverage exactly
    feed._take(_message(6, "c", 0, {}, value=b"", claims=[0]))
    feed._take(_message(7, "b", 1, {0: (20, 25)}))                  # b lost partition 0: refused
    feed._take(_message(8, "c", 1, {0: (20, 25)}))                  # its owner continues it
    feed._take(_message(9, "b", 2, {1: (9, 12)}))                   # partition 1 never claimed
    assert feed.state.covered == {"0": 25, "1": 12} and feed.state.refused == 3
    assert feed.state.owners == {"0": "c"} and applied == [b"delta"] * 4
