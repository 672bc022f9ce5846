"""A reader's loopback calls to its learner (``ForwardedFeedback.relay``, the admin verbs'
``ReplicaService._forward``): what they claim when the learner does not answer, and that they
never go through an HTTP proxy. Stub learners are stdlib HTTP servers on free loopback ports."""

from __future__ import annotations

import contextlib
import socket
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest

from sketchrec.stream.feedback import ForwardedFeedback
from sketchrec.stream.serving.workers.reader import ReplicaService
from conftest import wait_for


@contextlib.contextmanager
def stub(release: threading.Event | None = None, status: int = 200, body: bytes = b'{"learned": 1}'):
    """A server that records each request's path and body and answers ``status`` with ``body``
    (200 ``{"learned": 1}``), after ``release`` is set when one is given (a learner slower than the
    relay's bound)."""
    seen: list[tuple[str, bytes]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            seen.append((self.path, self.rfile.read(int(self.headers.get("Content-Length") or 0))))
            if release is not None:
                release.wait(10)
            try:
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except OSError:   # the relay gave up and closed
                pass

        do_GET = do_POST

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        if release is not None:
            release.set()
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_a_relay_timeout_says_the_ratings_may_have_been_taken():
    release = threading.Event()
    with stub(release) as (url, seen):
        status, answer = ForwardedFeedback(url, timeout=0.3).relay(b'[{"user": 1, "item": 2, "rating": 4}]',
                                                                   None, None)
        release.set()
        # the learner did get them (on a loaded machine its thread may take them only after the
        # relay gave up: awaited before the stub stops taking requests)
        wait_for(lambda: len(seen) == 1, "the stub learner to take the ratings", timeout=60, every=0.01)
    assert status == 504
    assert "may have been taken" in answer["detail"] and "send the ratings again" not in answer["detail"]


def test_only_a_refused_connection_says_nothing_was_taken():
    with socket.socket() as s:   # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    status, answer = ForwardedFeedback(f"http://127.0.0.1:{port}").relay(b"[]", None, None)
    assert status == 503 and "nothing was taken" in answer["detail"]


def test_loopback_calls_ignore_an_http_proxy(monkeypatch):
    with stub() as (proxy, via_proxy), stub() as (learner, seen):
        monkeypatch.setenv("http_proxy", proxy)
        monkeypatch.delenv("no_proxy", raising=False)
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.setattr(urllib.request, "_opener", None)   # a default opener reads them afresh
        assert urllib.request.urlopen(urllib.request.Request(learner, method="POST"), timeout=5).status == 200
        assert len(via_proxy) == 1 and not seen   # the broken variant: the default opener goes via it
        via_proxy.clear()

        status, _ = ForwardedFeedback(learner).relay(b"[]", "user-token", "Bearer user")
        ReplicaService._forward(SimpleNamespace(admin_url=learner, admin_token="admin"), "pause")
        assert status == 200
        assert not via_proxy and [path for path, _ in seen] == ["/ratings?token=user-token", "/pause"]


@pytest.mark.parametrize("status, body, raised, detail", [
    (507, b'{"detail": "no space left for the checkpoint"}', OSError, "no space left for the checkpoint"),
    (409, b'{"detail": "paused already"}', RuntimeError, "paused already"),
    (500, b"<html>oops</html>", RuntimeError, "Internal Server Error"),
])
def test_the_learners_refusals_reach_the_reader_as_its_own_process_would_raise_them(status, body, raised,
                                                                                     detail):
    with stub(status=status, body=body) as (learner, seen):
        reader = SimpleNamespace(admin_url=learner, admin_token="admin")
        with pytest.raises(raised, match=detail):
            ReplicaService._forward(reader, "checkpoint")
        relayed, answer = ForwardedFeedback(learner).relay(b"[]", None, None)
    assert [path for path, _ in seen] == ["/checkpoint", "/ratings"]
    assert relayed == status and answer["detail"] == detail   # a relay hands the refusal on as it came
