"""uvicorn serving an app from a daemon thread, started and stopped from the caller's thread."""

from __future__ import annotations

import json
import threading
import time


def _json_400_protocol():
    """uvicorn's h11 protocol answering a request it cannot parse with a JSON 400 (uvicorn's own
    answer is text/plain, unlike every other error of the API)."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class JSON400Protocol(H11Protocol):
        def send_400_response(self, msg: str) -> None:
            body = json.dumps({"detail": msg}).encode()
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                       (b"connection", b"close")]
            for event in (h11.Response(status_code=400, headers=headers, reason=b"Bad Request"),
                          h11.Data(data=body), h11.EndOfMessage()):
                self.transport.write(self.conn.send(event))
            self.transport.close()

    return JSON400Protocol


class ServerThread:
    """uvicorn serving ``app`` on ``host:port`` (port 0: a free one) from a daemon thread."""

    def __init__(self, app, host: str, port: int):
        import uvicorn
        self.server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning",
                                                    lifespan="off", http=_json_400_protocol()))
        self.thread = threading.Thread(target=self.server.run, daemon=True, name="http")

    def start(self, timeout: float = 10.0) -> "ServerThread":
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("HTTP server failed to start (is the port free?)")
            time.sleep(0.02)
        return self

    @property
    def port(self) -> int:
        return self.server.servers[0].sockets[0].getsockname()[1]

    @property
    def url(self) -> str:
        return f"http://{self.server.config.host}:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
