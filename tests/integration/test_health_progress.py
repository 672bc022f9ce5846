"""Health is progress, on a broker of the test's own: a hung broker (SIGSTOP'd Tansu) turns
/healthz 503 within ten seconds on every serving reader of a consumer and on a `serve
--bootstrap` fleet replica, with the reason, and ok again once the broker answers.

Before: a consumer's health judged the broker by its TCP connection, which a hung broker keeps
open until kafka-python's 30 s request timeout and a reconnection's first timed-out request
(503 after 50-odd seconds); a fleet replica said the broker was there whatever happened."""

import signal
import subprocess
import sys
import time
import uuid

import httpx

from conftest import http, served_port, stop_processes, wait_for
from sketchrec.data import SyntheticStream
from sketchrec.stream.kafka.producer import ensure_topic, produce

WITHIN = 10.0   # seconds from the hang to 503
MODEL = ["--dim", "8", "--capacity", "1000", "--seed", "3"]


def _get(port, path):
    try:
        return http.get(f"http://127.0.0.1:{port}{path}", timeout=10)
    except httpx.TransportError:
        return None


def _start(cmd, tmp_path, name):
    log = tmp_path / f"{name}.log"
    with open(log, "w") as out:
        return subprocess.Popen([sys.executable, "-m", "sketchrec", *cmd], stdout=out,
                                stderr=subprocess.STDOUT), log


def _topic(bootstrap, name, n, seed) -> str:
    """A new topic of two partitions holding ``n`` synthetic ratings."""
    topic = f"{name}-{uuid.uuid4().hex[:8]}"
    ensure_topic(bootstrap, topic, partitions=2)
    produce(SyntheticStream(n_ratings=n, n_users=100, n_items=80, seed=seed).all(), bootstrap, topic,
            batch=50)
    return topic


def _learned(port, n) -> bool:
    r = _get(port, "/stats")
    return r is not None and r.status_code == 200 and r.json()["ratings_learned"] == n


def _ok(port) -> bool:
    r = _get(port, "/healthz")
    return r is not None and r.status_code == 200


def _hang_and_see(broker, ports, procs, logs):
    """SIGSTOP the broker; every port's /healthz must say 503 (the broker named) within WITHIN
    seconds, six answers in a row (a port's readers answer in turn: each of them, not the first
    to notice); then SIGCONT and ok."""
    broker.send_signal(signal.SIGSTOP)
    hung = time.monotonic()
    try:
        for port in ports:
            def unhealthy(port=port):
                answers = [_get(port, "/healthz") for _ in range(6)]
                if all(r is not None and r.status_code == 503 for r in answers):
                    return [why for r in answers for why in r.json()["reasons"]]
                return None
            reasons = wait_for(unhealthy, f"/healthz 503 on {port}", procs, logs, 30)
            took = time.monotonic() - hung
            assert took < WITHIN, f"503 from every reader only after {took:.1f} s"
            assert any("broker" in why for why in reasons), reasons
    finally:
        broker.send_signal(signal.SIGCONT)
    for port in ports:
        wait_for(lambda port=port: _ok(port), f"/healthz ok again on {port}", procs, logs, 120)


def test_a_hung_broker_turns_every_reader_503_within_ten_seconds(own_broker, tmp_path):  # noqa: F811
    bootstrap, broker = own_broker
    topic = _topic(bootstrap, "hang", 2000, seed=4)
    proc, log = _start(["consume", "--bootstrap", bootstrap, "--topic", topic, "--group", f"g-{topic}",
                        "--checkpoint", str(tmp_path / "ckpt"), "--expected-ratings", "20000", *MODEL,
                        "--workers", "2", "--serve", "127.0.0.1:0"], tmp_path, "consume")
    try:
        port = served_port(log, proc)
        wait_for(lambda: _learned(port, 2000), "2,000 ratings learned", [proc], [log], 300)
        wait_for(lambda: _ok(port), "ok", [proc], [log], 120)
        _hang_and_see(broker, [port], [proc], [log])
    finally:
        stop_processes([proc])


def test_a_fleet_member_and_its_read_replica_report_a_hung_broker(own_broker, tmp_path):  # noqa: F811
    bootstrap, broker = own_broker
    topic = _topic(bootstrap, "hangfleet", 1000, seed=5)
    member, member_log = _start(["consume", "--bootstrap", bootstrap, "--topic", topic, "--group",
                                 f"g-{topic}", "--fleet", "--sync-ms", "100", "--snapshot-seconds", "2",
                                 "--expected-ratings", "20000", *MODEL, "--workers", "1",
                                 "--serve", "127.0.0.1:0"], tmp_path, "member")
    procs, logs = [member], [member_log]
    try:
        member_port = served_port(member_log, member)
        wait_for(lambda: _learned(member_port, 1000), "the member to learn", procs, logs, 300)
        replica, replica_log = _start(["serve", "--bootstrap", bootstrap, "--topic", topic,
                                       "--listen", "127.0.0.1:0"], tmp_path, "replica")
        procs.append(replica)
        logs.append(replica_log)
        replica_port = served_port(replica_log, replica)
        wait_for(lambda: _learned(replica_port, 1000), "the replica to follow", procs, logs, 300)
        for port in (member_port, replica_port):
            wait_for(lambda port=port: _ok(port), "ok", procs, logs, 120)
        _hang_and_see(broker, [member_port, replica_port], procs, logs)
    finally:
        stop_processes(procs)
