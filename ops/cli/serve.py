"""evq admin serve (formerly `evq serve`): the HTTP API, the operators' page, /metrics and /healthz in one process."""

from __future__ import annotations

import socket

from evq.ops import wiring
from evq.ops.cli.admin import admin
from evq.ops.cli.common import command, load_settings
from evq.ops.cli.output import Output
from evq.ops.cli.table import from_table
from evq.ops.option_catalogue import OPTION_BY_NAME
from evq.worker.errors import ConfigError
from evq.worker.logs import get_logger

log = get_logger("evq.serve")


@from_table("admin.serve", admin)
@command
def serve(out: Output, host: str | None, port: int | None, database_url: str | None) -> int:
    settings = load_settings(database_url=database_url, serve_host=host, serve_port=port)
    wiring.require_serve(settings)  # a missing extra is said before the database is opened
    url = wiring.database_url(settings)
    wiring.check_database(url)  # a clear E_SCHEMA_MISMATCH or E_INVALID_ARG before anything listens
    sock = _listen(settings.serve_host, settings.serve_port)
    bound = sock.getsockname()[1]
    log.info("serve_listening", host=settings.serve_host, port=bound, url=f"http://{settings.serve_host}:{bound}/ops")
    code = 0 if wiring.serve(settings, sock, url=url) else 1
    if out.json:
        out.success({"exit_code": code, "host": settings.serve_host, "port": bound})
    return code


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
