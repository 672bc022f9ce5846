"""uvicorn serving an app from a daemon thread, started and stopped from the caller's thread."""

from __future__ import annotations

import threading
import time


class ServerThread:
    """uvicorn serving ``app`` on ``host:port`` (port 0: a free one) from a daemon thread."""

    def __init__(self, app, host: str, port: int):
        import uvicorn
        self.server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning",
                                                    lifespan="off"))
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
