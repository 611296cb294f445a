"""`evq serve`'s HTTP server: uvicorn with the guarded protocol (ops/web/slowclients.py) on a
socket the command bound, stopping on the first SIGTERM or Ctrl-C."""

from __future__ import annotations

import contextlib
import signal
import socket
from collections.abc import Iterator
from typing import Any

from evq.ops.web.slowclients import uvicorn_config


def run(app: Any, settings: Any, sock: socket.socket) -> bool:
    """Serve ``app`` on ``sock`` until stopped; whether it started at all (its lifespan ran)."""
    config = uvicorn_config(
        app,
        settings,
        log_config=None,
        access_log=False,
        server_header=False,
        timeout_graceful_shutdown=10,
        lifespan="on",
    )
    server = _Server(config)
    server.run(sockets=[sock])
    return bool(server.started)


def _server_class() -> type:
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn re-raises the stopping signal after its graceful shutdown, which would end the
        process before the command's JSON line and exit code; here the first SIGTERM or Ctrl-C stops
        gracefully and returns, a second one forces the exit (uvicorn's own handle_exit)."""

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

    return Server


def _Server(config: Any) -> Any:  # uvicorn is imported only once something is served
    return _server_class()(config)
