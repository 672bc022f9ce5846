"""The endpoint as exposed to a network: security headers on every answer, per-user routes behind a
credential on a non-loopback address (``--open`` to turn it off), the public ranking for unknown
users, a header-read timeout, a busy port as one line, and trailing slashes answered in JSON."""

import socket
import subprocess
import sys
import time
from collections import Counter

import httpx
import pytest

from sketchrec.data import SyntheticStream
from sketchrec.models import SketchMF
from sketchrec.stream.checkpoint import CheckpointStore
from sketchrec.stream.recommender import Recommender
from sketchrec.stream.service import LearningService
from sketchrec.stream.serving import server as servers
from sketchrec.stream.serving.http import access_for, create_app
from sketchrec.stream.serving.server import PortInUse, ServerThread
from conftest import http, served_url, stop_processes, wait_healthy

ADMIN = "exposure-admin"
SECURITY = {"content-security-policy", "x-frame-options", "referrer-policy"}


def _service(n=3000, checkpoint_dir=None):
    data = SyntheticStream(n_ratings=n, n_users=60, n_items=80, seed=3).all()
    rec = Recommender(SketchMF(capacity=200, dim=8), pair_capacity=10_000)
    rec.learn_many(data.users, data.items, data.ratings)
    return LearningService(rec, CheckpointStore(checkpoint_dir) if checkpoint_dir else None), data


@pytest.fixture(scope="module")
def served():
    service, data = _service()
    server = ServerThread(create_app(service, ADMIN), "127.0.0.1", 0).start()
    with httpx.Client(base_url=server.url, timeout=30) as client:
        yield client, service, data, server
    server.stop()


def test_every_answer_carries_the_security_headers(served):
    client, _, _, server = served
    answers = [client.get("/"), client.get("/dashboard/dashboard.js"), client.get("/healthz"),
               client.get("/predict", params={"user": "1", "item": "2"}),                  # fast path
               client.get("/predict", params={"user": "1", "item": "2", "x": ["1", "2"]}),   # the app
               client.get("/recommend", params={"user": "1", "k": "0"}),                     # 422
               client.get("/no-such-route"), client.get("/docs"), client.get("/openapi.json"),
               client.post("/pause")]
    for r in answers:
        assert SECURITY <= set(r.headers), (r.request.url, r.status_code, dict(r.headers))
        assert r.headers["x-frame-options"] == "DENY" and r.headers["referrer-policy"] == "no-referrer"
        assert "frame-ancestors 'none'" in r.headers["content-security-policy"]
    page = answers[0].headers["content-security-policy"]
    assert "script-src 'self'" in page and "http" not in page   # the page loads nothing from elsewhere
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:   # a protocol 400
        sock.sendall(b"GARBAGE\r\n\r\n")
        head = sock.recv(4096).partition(b"\r\n\r\n")[0].lower()
    assert head.startswith(b"http/1.1 400") and all(h.encode() in head for h in SECURITY)


def test_a_trailing_slash_is_answered_in_json_not_redirected(served):
    client, _, _, _ = served
    for path in ("/predict/", "/recommend/", "/stats/"):
        r = client.get(path, params={"user": "1", "item": "2"}, follow_redirects=False)
        assert r.status_code == 404 and r.headers["content-type"] == "application/json"
        assert "detail" in r.json()


def test_an_unknown_user_gets_the_public_ranking_not_rating_counts(served):
    """Before: the scores were the items' rating counts (what the stream holds, exactly)."""
    client, service, data, _ = served
    counts = Counter(data.items.tolist())
    for extra in ({}, {"x": ["1", "2"]}):   # the fast path, then the app
        body = client.get("/recommend", params={"user": "never-seen", "k": 5, **extra}).json()
        assert body["source"] == "popular"
        assert [x["item"] for x in body["items"]] == [i for i, _ in counts.most_common(5)]
        scores = [x["score"] for x in body["items"]]
        assert scores == sorted(scores, reverse=True) and len(set(scores)) == 5
        assert not set(scores) & {float(c) for c in counts.values()}   # no count shows


def test_a_half_sent_request_is_closed_after_the_header_timeout(served, monkeypatch):
    """Before: a connection that never finished its request head was held open for good."""
    _, _, _, server = served
    monkeypatch.setattr(servers, "HEADER_TIMEOUT_S", 0.5)

    def held(payload: bytes, wait: float) -> bool:
        """Whether the server still holds a connection that sent ``payload``, ``wait`` s later."""
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            sock.sendall(payload)
            sock.settimeout(wait)
            try:
                return sock.recv(1) != b""   # b"": closed by the server
            except TimeoutError:
                return True

    t0 = time.monotonic()
    assert not held(b"GET /predict?user=1&item=2 HTTP/1.1\r\nHost: x\r\n", wait=8)   # head never ends
    assert not held(b"", wait=8)                                                          # nothing sent
    assert time.monotonic() - t0 < 8
    # the broken variant: without the timeout the same half-sent request is still held
    monkeypatch.setattr(servers, "HEADER_TIMEOUT_S", 3600.0)
    assert held(b"GET /predict?user=1&item=2 HTTP/1.1\r\nHost: x\r\n", wait=2)
    # a complete request on a kept-alive connection is not cut by the timer of its head
    monkeypatch.setattr(servers, "HEADER_TIMEOUT_S", 0.5)
    with httpx.Client(base_url=server.url, timeout=10) as client:
        for _ in range(3):
            assert client.get("/healthz").status_code == 200
            time.sleep(0.3)


def test_access_is_on_by_default_off_loopback():
    assert access_for("auto", "127.0.0.1") == "auto" and access_for("auto", "::1") == "auto"
    assert access_for("auto", "0.0.0.0") is True and access_for("auto", "::") is True
    assert access_for(False, "0.0.0.0") is False   # --open / --access-control off


def test_on_a_non_loopback_address_per_user_routes_need_a_credential(tmp_path):
    """Before: anyone reaching the port read any user's history through /recommend. The attack
    (a stranger asking about a user) is refused by default and succeeds with --open."""
    service, _ = _service(checkpoint_dir=tmp_path)
    service.checkpoint()
    attack = {"user": "5", "k": "10"}
    for extra, refused in (([], True), (["--open"], False)):
        log = tmp_path / f"serve{len(extra)}.log"
        with log.open("w") as out:   # a file: a pipe read only at the end could fill and block it
            proc = subprocess.Popen(
                [sys.executable, "-m", "sketchrec", "serve", "--checkpoint", str(tmp_path), "--workers", "1",
                 "--listen", "0.0.0.0:0", "--admin-token-file", _token_file(tmp_path), *extra],
                stdout=out, stderr=subprocess.STDOUT)
        try:   # on the port the server bound itself, reached through the loopback
            base = served_url(log, proc).replace("0.0.0.0", "127.0.0.1")
            wait_healthy(base, proc, log=log)
            # the first ranking may compile its kernels (minutes on a cold cache under load)
            r = http.get(f"{base}/recommend", params=attack, timeout=300)
            assert (r.status_code == 401) is refused, r.text
            assert http.get(f"{base}/predict", params={"user": "5", "item": "1"}, timeout=30).status_code \
                == (401 if refused else 200)
            backend = http.get(f"{base}/recommend", params=attack, timeout=30,
                               headers={"Authorization": f"Bearer {ADMIN}"})
            assert backend.status_code == 200 and backend.json()["items"]
            assert http.get(f"{base}/stats", timeout=30).status_code == 200   # public routes stay open
        finally:
            stop_processes([proc])
        err = log.read_text()
        assert ("--open:" in err) is (not refused), err
        assert "Traceback" not in err


def test_a_busy_port_is_one_line_and_exit_code_2(tmp_path):
    """Before: an OSError traceback."""
    service, _ = _service(checkpoint_dir=tmp_path)
    service.checkpoint()
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        with pytest.raises(PortInUse, match="already in use"):
            ServerThread(create_app(service), "127.0.0.1", port)
        for workers in ("1", "2"):
            proc = subprocess.run(
                [sys.executable, "-m", "sketchrec", "serve", "--checkpoint", str(tmp_path), "--workers", workers,
                 "--listen", f"127.0.0.1:{port}"], capture_output=True, text=True, timeout=120)
            assert proc.returncode == 2, proc.stderr
            assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
            assert f"127.0.0.1:{port}" in proc.stderr and "already in use" in proc.stderr


def _token_file(tmp_path) -> str:
    path = tmp_path / "admin-token"
    path.write_text(ADMIN)
    return str(path)


