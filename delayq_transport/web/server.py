"""Run the app: in the foreground (``delayq web``) or in a background thread (``delayq demo``,
tests), always with uvicorn and always stoppable."""

from __future__ import annotations

import threading
import time
from typing import Any

import uvicorn

from ..core.queue import DelayedQueue
from .app import create_app
from .security import WebConfig

STARTUP_TIMEOUT_S = 15.0


def _server(queue: DelayedQueue, config: WebConfig, log_level: str) -> uvicorn.Server:
    app = create_app(queue, config)
    return uvicorn.Server(uvicorn.Config(app, host=config.host, port=config.port,
                                         log_level=log_level, access_log=False,
                                         server_header=False))


def serve(queue: DelayedQueue, config: WebConfig, log_level: str = "info") -> None:
    _server(queue, config, log_level).run()


class BackgroundServer:
    """uvicorn in a daemon thread; ``stop()`` shuts it down and waits."""

    def __init__(self, queue: DelayedQueue, config: WebConfig,
                 log_level: str = "warning") -> None:
        self.config = config
        self.server = _server(queue, config, log_level)
        self.thread = threading.Thread(target=self.server.run, name="delayq-web", daemon=True)

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.config.host in ("0.0.0.0", "") else self.config.host
        return f"http://{host}:{self.port}"

    @property
    def port(self) -> int:
        servers: Any = getattr(self.server, "servers", [])
        for srv in servers:
            for sock in srv.sockets:
                return int(sock.getsockname()[1])
        return self.config.port

    def start(self) -> BackgroundServer:
        self.thread.start()
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"web server did not start on {self.config.host}:"
                                   f"{self.config.port}")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
