"""uvicorn serving an app from a daemon thread, started and stopped from the caller's thread.

The HTTP parser is httptools on a uvloop event loop when they are installed (``uvicorn[standard]``;
several times faster per request than h11 on asyncio), else h11 on asyncio. Either way a request
that cannot be parsed gets a JSON 400, like every other error of the API. Once the server is up,
the objects of start-up (modules, the model, the app) are moved out of the garbage collector's
reach (``gc.freeze``): a full collection then walks only what requests allocate, instead of
stalling the event loop for tens of milliseconds over a heap of a million start-up objects.
A connection whose request head (request line and headers) has not arrived ``HEADER_TIMEOUT_S``
after it opened, or after its request began, is closed: half-sent requests cannot hold
connections (uvicorn's keep-alive timeout only covers idle time between requests).

uvicorn's protocols are subclassed here and nowhere else (the JSON 400, the head timeout, the
corked writes), only on the uvicorn versions they were read against (``UVICORN``, a
``sketchrec.versions.Checked``): on another, the server runs uvicorn's own protocol and says so in
one log line (text/plain 400s, no head timeout).

The listening socket is bound before the server starts (``listen``), so a busy port is one
``PortInUse`` error the commands turn into one line, not a traceback from the server's thread.
"""

from __future__ import annotations

import errno
import gc
import importlib.metadata
import importlib.util
import json
import socket
import sys
import threading
import time

from sketchrec.stream.serving.headers import SECURITY_HEADERS
from sketchrec.versions import Checked

# how long a thread holding the GIL may run before another (the event loop) gets it: 5 ms by
# default, which a learning thread's Python glue turns into 5 ms waits at the tail of every answer
SWITCH_INTERVAL_S = 0.0005
HEADER_TIMEOUT_S = 5.0   # a request's head must arrive within this long
# the pin's floor, and the newest uvicorn whose protocols the subclasses below were read in
UVICORN = Checked("uvicorn", (0, 29), (0, 54), lambda: importlib.metadata.version("uvicorn"))


class PortInUse(OSError):
    """The address to listen on is taken (or cannot be bound); its message is one line."""


def listen(host: str, port: int, backlog: int = 2048) -> socket.socket:
    """A listening socket on ``host:port`` (port 0: a free one), or ``PortInUse`` saying why not."""
    try:
        return socket.create_server((host, port), backlog=backlog)
    except OSError as exc:
        why = "already in use" if exc.errno == errno.EADDRINUSE else (exc.strerror or str(exc))
        raise PortInUse(exc.errno, f"cannot listen on {host}:{port}: {why}") from None


def _json_400(msg: str) -> bytes:
    return json.dumps({"detail": msg}).encode()


def _json_400_protocol() -> type | str:
    """uvicorn's protocol (httptools when installed, else h11) answering a request it cannot
    parse with a JSON 400 (uvicorn's own answer is text/plain, unlike every other error of the API);
    on an unchecked uvicorn, ``"auto"``: its own protocol, said in one log line."""
    if not UVICORN.usable("JSON 400s, the request head timeout and corked writes",
                          "uvicorn's own protocol (text/plain 400s, no head timeout)"):
        return "auto"
    try:
        from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
    except ImportError:
        return _h11_json_400_protocol()

    class JSON400HttpTools(HttpToolsProtocol):
        _head_timer = None   # armed while a request's head is awaited (HEADER_TIMEOUT_S)

        def connection_made(self, transport) -> None:
            super().connection_made(CorkedTransport(transport, self.loop))
            self._await_head()

        def _await_head(self) -> None:
            if self._head_timer is None:
                self._head_timer = self.loop.call_later(HEADER_TIMEOUT_S, self._head_timed_out)

        def _head_timed_out(self) -> None:
            self._head_timer = None
            if not self.transport.is_closing():
                self.transport.close()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._await_head()

        def on_headers_complete(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None
            super().on_headers_complete()

        def connection_lost(self, exc) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None
            super().connection_lost(exc)

        def send_400_response(self, msg: str) -> None:
            body = _json_400(msg)
            self.transport.write(b"".join([
                STATUS_LINE[400], b"content-type: application/json\r\n", _SECURITY_LINES,
                b"content-length: %d\r\n" % len(body), b"connection: close\r\n\r\n", body]))
            self.transport.close()

    return JSON400HttpTools


_SECURITY_LINES = b"".join(b"%s: %s\r\n" % pair for pair in SECURITY_HEADERS)


class CorkedTransport:
    """A transport whose writes of one event-loop iteration leave in one send: uvicorn writes a
    response's head and body separately, two system calls (and two packets) where one does."""

    def __init__(self, transport, loop):
        self.transport, self.loop, self.pending = transport, loop, []

    def write(self, data: bytes) -> None:
        if not self.pending:
            self.loop.call_soon(self.flush)
        self.pending.append(data)

    def flush(self) -> None:
        if self.pending:
            data = b"".join(self.pending)
            self.pending.clear()
            if not self.transport.is_closing():
                self.transport.write(data)

    def close(self) -> None:
        self.flush()
        self.transport.close()

    def __getattr__(self, name: str):
        return getattr(self.transport, name)


def _h11_json_400_protocol():
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class JSON400Protocol(H11Protocol):
        def send_400_response(self, msg: str) -> None:
            body = _json_400(msg)
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                       (b"connection", b"close"), *SECURITY_HEADERS]
            for event in (h11.Response(status_code=400, headers=headers, reason=b"Bad Request"),
                          h11.Data(data=body), h11.EndOfMessage()):
                self.transport.write(self.conn.send(event))
            self.transport.close()

    return JSON400Protocol


def _loop() -> str:
    return "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"


def freeze_startup() -> None:
    """Move the objects alive now (modules, the model, the app: start-up's) out of the garbage
    collector's reach, so that its full collections walk only what is allocated later. Garbage
    made of them later is still freed by reference counting; only cycles among them would stay."""
    gc.collect()
    gc.freeze()


def settle_for_serving() -> None:
    """Call once a serving process has started up: start-up's objects are frozen
    (``freeze_startup``: a full collection over them stalled every answer in flight, at the
    tail) and a thread holding the GIL gives it up after ``SWITCH_INTERVAL_S``."""
    sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL_S))
    freeze_startup()


def uvicorn_server(app, **bind):
    """uvicorn over ``app`` as every serving process runs it: httptools on uvloop where installed,
    JSON 400s for malformed requests, no access log; ``bind``: host and port (none for a
    pre-bound socket passed to ``run(sockets=...)``)."""
    import uvicorn
    return uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off", access_log=False,
                                         http=_json_400_protocol(), loop=_loop(), **bind))


class ServerThread:
    """uvicorn serving ``app`` on ``host:port`` (port 0: a free one) from a daemon thread; the
    port is bound at once (``PortInUse`` if it cannot be)."""

    def __init__(self, app, host: str, port: int):
        self.sock, self.host = listen(host, port), host
        self.server = uvicorn_server(app)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       daemon=True, name="http")

    def start(self, timeout: float = 120.0) -> "ServerThread":
        """Run the server's thread; return once it serves. The socket is bound already, so a
        thread that ends first failed for another reason, and a slow start (a loaded machine,
        beside the warm-up) is waited for, up to ``timeout``."""
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError("the HTTP server's thread ended before serving")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the HTTP server did not start within {timeout:g} s")
            time.sleep(0.02)
        settle_for_serving()
        return self

    @property
    def port(self) -> int:
        return self.sock.getsockname()[1]

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()
