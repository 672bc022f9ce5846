"""Production under faults, on the endpoint: health that reflects readiness and the broker, the admin token, and
the small protocol fixes (JSON 400s, short 422s, no path in /stats, blank ids)."""

import argparse
import logging
import re
import socket
import time

import httpx
import numpy as np
import pytest

from sketchrec.models import SketchMF
from sketchrec.privacy.admin_token import add_admin_token_args
from sketchrec.stream.serving.http import create_app
from sketchrec.stream.recommender import Recommender
from sketchrec.stream.serving import server as server_module
from sketchrec.stream.serving.server import ServerThread
from sketchrec.stream.service import LearningService
from sketchrec.stream.checkpoint import CheckpointStore
from sketchrec.stream.health import Health

TOKEN = "s3cret"


def _service(tmp_path):
    rec = Recommender(SketchMF(capacity=200, dim=8), pair_capacity=10_000)
    rec.learn_many(np.arange(100) % 20, np.arange(100) % 15, np.full(100, 4.0))
    return LearningService(rec, CheckpointStore(tmp_path))


@pytest.fixture
def serve(tmp_path):
    servers = []

    def start(token=TOKEN, service=None):
        service = service or _service(tmp_path)
        server = ServerThread(create_app(service, token), "127.0.0.1", 0).start()
        servers.append(server)
        return httpx.Client(base_url=server.url, timeout=10), service, server
    yield start
    for server in servers:
        server.stop()


@pytest.mark.parametrize("token", ["", "   ", "\t\n"])
def test_an_empty_or_blank_admin_token_enables_nothing(serve, token):
    """Before: an empty token counted as configured (admin routes 'enabled', answering 401)."""
    client, _, _ = serve(token)
    for auth in ("Bearer", "Bearer x", "Basic"):
        r = client.post("/pause", headers={"Authorization": auth})
        assert r.status_code == 403 and "disabled" in r.json()["detail"]


def test_the_admin_token_needs_the_bearer_scheme(serve):
    """Before: the bare token (no ``Bearer ``) was accepted."""
    client, service, _ = serve()
    assert client.post("/pause", headers={"Authorization": TOKEN}).status_code == 401
    assert client.post("/pause", headers={"Authorization": f"Basic {TOKEN}"}).status_code == 401
    assert client.post("/pause", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
    assert client.post("/resume", headers={"Authorization": f"bearer   {TOKEN}"}).status_code == 200


def test_admin_token_from_a_file_or_the_environment_never_blank(tmp_path):
    ap = argparse.ArgumentParser()
    add_admin_token_args(ap, env={"SKETCHREC_ADMIN_TOKEN": ""})
    assert ap.parse_args([]).admin_token is None
    (tmp_path / "tok").write_text("from-file\n")
    assert ap.parse_args(["--admin-token-file", str(tmp_path / "tok")]).admin_token == "from-file"
    (tmp_path / "blank").write_text("  \n")
    with pytest.raises(SystemExit):
        ap.parse_args(["--admin-token-file", str(tmp_path / "blank")])
    assert "ps" in ap.format_help()
    env = argparse.ArgumentParser()
    add_admin_token_args(env, env={"SKETCHREC_ADMIN_TOKEN": " e "})
    assert env.parse_args([]).admin_token == "e"


def test_not_ready_answers_503_at_once_and_healthz_says_why(serve):
    """Before: /healthz was a constant ok and /predict blocked while the kernels compiled."""
    client, service, _ = serve()
    service.health.ready = False
    # nothing makes the service ready while these wait: a request that waited for readiness would
    # hit the client's timeout instead of an answer (no timing of our own: a loaded machine pauses)
    for path, params in (("/predict", {"user": "1", "item": "2"}), ("/recommend", {"user": "1"})):
        r = client.get(path, params=params)
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
    health = client.get("/healthz")
    assert health.status_code == 503 and health.json()["reasons"] == ["model not ready (warming up)"]
    service.warm_up()
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/predict", params={"user": "1", "item": "2"}).status_code == 200


def test_healthz_and_stats_report_the_broker(serve):
    client, service, _ = serve()
    service.health.watch_broker()
    service.health.polled(connected=False)
    service.health.lost_since -= 60
    r = client.get("/healthz")
    assert r.status_code == 503 and r.json()["reasons"][0].startswith("broker unreachable for 60 s")
    broker = client.get("/stats").json()["broker"]
    assert broker["connected"] is False and broker["unreachable_for_s"] >= 60
    assert broker["last_error"] == "no broker connection" and broker["last_poll_age_s"] < 5
    service.health.last_poll -= 120
    assert any("last poll" in why for why in client.get("/healthz").json()["reasons"])


def test_stats_shows_the_checkpoint_name_and_age_not_its_path(serve, tmp_path):
    """Before: /stats showed the checkpoint's filesystem path."""
    client, service, _ = serve()
    written = client.post("/checkpoint", headers={"Authorization": f"Bearer {TOKEN}"}).json()
    stats = client.get("/stats").json()
    assert stats["checkpoint"]["name"] == "ckpt-000000000001.skc" and "path" not in stats["checkpoint"]
    assert str(tmp_path) not in str(stats) and 0 <= stats["checkpoint_age_s"] < 60
    assert written["path"].startswith(str(tmp_path))  # the admin who wrote it may know where


def test_a_422_does_not_echo_a_long_input_and_blank_ids_are_refused(serve):
    """Before: the whole input came back in the 422; '   ' was a valid user over HTTP."""
    client, _, _ = serve()
    r = client.get("/recommend", params={"user": "x" * 20_000})
    assert r.status_code == 422 and len(r.content) < 1000 and "20000 characters" in r.text
    for params in ({"user": "   ", "item": "1"}, {"user": "1", "item": "\t"}):
        assert client.get("/predict", params=params).status_code == 422


def _garbage(server) -> tuple[bytes, bytes]:
    """The head and body of the answer to a request that cannot be parsed."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        sock.sendall(b"GARBAGE\r\n\r\n")
        reply = b""
        while chunk := sock.recv(4096):
            reply += chunk
    head, _, body = reply.partition(b"\r\n\r\n")
    return head, body


def test_protocol_level_400s_are_json(serve):
    """Before: uvicorn's text/plain 'Invalid HTTP request received.'"""
    head, body = _garbage(serve()[2])
    assert head.startswith(b"HTTP/1.1 400") and b"content-type: application/json" in head.lower()
    assert b'"detail"' in body


def test_an_unchecked_uvicorn_runs_its_own_protocol_and_says_so(serve, monkeypatch, caplog):
    """Our protocol subclasses reach uvicorn's internals: on a version they were not read in, the
    server takes uvicorn's own protocol (its text/plain 400) and logs one line, rather than run
    subclasses of internals that may have changed."""
    monkeypatch.setattr(server_module.UVICORN, "installed", lambda: "0.99.0")
    monkeypatch.setattr(server_module.UVICORN, "said", set())
    with caplog.at_level(logging.WARNING, logger="sketchrec"):
        head, _ = _garbage(serve()[2])
        serve()
    assert head.startswith(b"HTTP/1.1 400") and b"application/json" not in head.lower()
    lines = [r.getMessage() for r in caplog.records if "event=internals" in r.getMessage()]
    assert len(lines) == 1 and "library=uvicorn version=0.99.0 checked=0.29-0.54.x" in lines[0]


def test_a_failed_checkpoint_over_http_is_a_clear_error(serve):
    client, service, _ = serve()

    def full():
        raise OSError(28, "No space left on device")
    service.checkpoint = full
    r = client.post("/checkpoint", headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 507 and "No space left" in r.json()["detail"]
    # ... and /healthz says so until a checkpoint is written again
    health = client.get("/healthz")
    assert health.status_code == 503 and "No space left" in health.json()["reasons"][0]
    del service.checkpoint   # the real one again
    assert client.post("/checkpoint", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
    assert client.get("/healthz").json() == {"status": "ok"}


def test_a_failing_checkpoint_of_the_loop_shows_on_healthz(serve):
    """Before: a consumer whose checkpoints failed said ok."""
    client, service, _ = serve()
    service.health.checkpoint_error = "OSError: [Errno 30] Read-only file system"
    r = client.get("/healthz")
    assert r.status_code == 503 and r.json()["reasons"] == [
        "last checkpoint failed (OSError: [Errno 30] Read-only file system)"]


def test_messages_waiting_with_no_progress_is_a_stall():
    """Progress is ratings learned or a shrinking lag; messages that wait with neither show after
    ``stall_after`` seconds (and not before), and progress clears it."""
    health = Health(stall_after=10.0)
    health.progress(100, 50)
    health.progress(100, 80)      # the lag grows, nothing learned
    assert health.problems() == []
    health.stalled_since -= 11   # (the seconds shown: 11, or more if this test was paused)
    assert re.fullmatch(r"no progress for 1\d s while 80 messages wait", *health.problems())
    health.progress(100, 80)      # still nothing: the stall goes on
    assert len(health.problems()) == 1
    health.progress(100, 79)      # a poison message set aside: progress
    assert health.problems() == [] and health.stalled_since is None
    health.progress(100, 79)
    health.stalled_since -= 11
    health.progress(150, 200)     # learning while the lag grows (a burst): progress
    assert health.problems() == []
    health.progress(150, 0)
    health.progress(150, 0)       # caught up, nothing to learn: idle, not stalled
    assert health.stalled_since is None
    health.progress(150, None)    # lag unknown: no judgement
    assert health.problems() == []


def test_a_lost_broker_or_a_stalled_loop_shows_within_ten_seconds_by_default():
    health = Health()
    health.watch_broker()
    health.broker_lost("no broker connection", since=time.monotonic() - 9.5)
    assert any(p.startswith("broker unreachable") for p in health.problems())
    health.polled(True)
    health.last_poll -= 8.0   # (not 9.5: a loaded machine may pause this test for a moment)
    assert health.problems() == []            # a slow poll is not yet a stall ...
    health.last_poll -= 3.0
    assert [p[:9] for p in health.problems()] == ["last poll"]   # ... but past ten seconds it is
