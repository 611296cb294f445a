"""evq serve: the HTTP API, the operators' page, /metrics and /healthz in one process."""

from __future__ import annotations

import contextlib
import signal
import socket
from collections.abc import Iterator
from typing import Any

from evq.ops import wiring
from evq.ops.cli.common import command, load_settings
from evq.ops.cli.output import Output
from evq.ops.cli.table import from_table
from evq.worker.errors import ConfigError
from evq.worker.logs import get_logger
from evq.worker.settings import OPTION_BY_NAME

log = get_logger("evq.serve")


@from_table("serve")
@command
def serve(out: Output, host: str | None, port: int | None, database_url: str | None) -> int:
    from evq.ops.web.slowclients import uvicorn_config  # uvicorn is imported only by this command

    settings = load_settings(database_url=database_url, serve_host=host, serve_port=port)
    url = wiring.database_url(settings)
    wiring.check_at_head(url)  # a clear E_SCHEMA_MISMATCH before anything listens
    sock = _listen(settings.serve_host, settings.serve_port)
    bound = sock.getsockname()[1]
    config = uvicorn_config(
        wiring.serve_app(settings, url=url),
        settings,
        log_config=None,
        access_log=False,
        server_header=False,
        timeout_graceful_shutdown=10,
        lifespan="on",
    )
    server = _Server(config)
    log.info("serve_listening", host=settings.serve_host, port=bound, url=f"http://{settings.serve_host}:{bound}/ops")
    server.run(sockets=[sock])
    code = 0 if server.started else 1
    if out.json:
        out.success({"exit_code": code, "host": settings.serve_host, "port": bound})
    return code


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


def _Server(config: Any) -> Any:  # uvicorn is imported only by this command
    return _server_class()(config)


def _listen(host: str, port: int) -> socket.socket:
    """Bound here rather than by uvicorn, so a taken port is a clear error and port 0 a known one."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        option = OPTION_BY_NAME["serve_port"]
        raise ConfigError(
            f"{option.env} (--port): cannot listen on {host}:{port}: {exc.strerror or exc}",
            hint="choose a free port with --port",
        ) from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock
