"""uvicorn, run for the serve command (main thread: SIGINT/SIGTERM) or in a background thread
(tests, ``bench-serve`` without ``--url``).

Shutdown, either way: stop accepting connections, let in-flight requests finish for ``grace``
seconds, then have the engine abort the rest, whose responses still end properly (a last chunk with
finish_reason "abort", then [DONE]); uvicorn's own cancellation only backs that up."""
from __future__ import annotations

import socket
import threading
import time

import uvicorn

from .worker import EngineWorker

BACKSTOP = 5.0  # seconds after the grace period before uvicorn cancels whatever is left


class Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, worker: EngineWorker, grace: float):
        super().__init__(config)
        self.worker, self.grace = worker, grace

    async def shutdown(self, sockets=None) -> None:
        self.worker.drain(self.grace)
        await super().shutdown(sockets)


def make_server(app, grace: float, **uvicorn_kw) -> Server:
    """``app`` from create_app; ``uvicorn_kw`` are uvicorn.Config options (host, port, log_level...)."""
    config = uvicorn.Config(app, timeout_graceful_shutdown=grace + BACKSTOP, lifespan="on", **uvicorn_kw)
    return Server(config, app.state.worker, grace)


class BackgroundServer:
    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, grace: float = 10.0,
                 log_level: str = "warning"):
        # Bound before the thread starts: port 0 then gives a free port, with no race.
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self.host, self.port = self._sock.getsockname()[:2]
        self.server = make_server(app, grace, log_level=log_level)
        # uvicorn installs signal handlers only in the main thread: this one leaves them alone
        self._thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self._sock]},
                                        name="specdecode-uvicorn", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 30.0) -> "BackgroundServer":
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 60.0) -> None:
        """What SIGINT/SIGTERM do to the serve command."""
        self.server.should_exit = True
        self._thread.join(timeout)

    def __enter__(self) -> "BackgroundServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
