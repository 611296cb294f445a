"""Each dev sink refuses a bad ``--port`` with argparse's usage error (exit 2, the code the
``evq`` command line gives a bad argument), not a traceback; a busy port stays exit 69."""

from __future__ import annotations

import socket
from collections.abc import Callable

import pytest

from evq.ops.dev import http as devhttp
from evq.ops.dev import server as devserver
from evq.ops.dev import smtp as devsmtp

SINKS: list[tuple[str, Callable[[list[str]], int]]] = [("smtp", devsmtp.main), ("http", devhttp.main)]


@pytest.mark.parametrize(("name", "main"), SINKS)
@pytest.mark.parametrize("port", ["99999", "65536", "-1", "25x", "2.5", ""])
def test_a_bad_port_is_a_usage_error(
    name: str, main: Callable[[list[str]], int], port: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--port", port])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: python -m evq.ops.dev." + name)
    assert "argument --port:" in err and "65535" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(("name", "main"), SINKS)
def test_a_busy_port_is_exit_69(
    name: str, main: Callable[[list[str]], int], capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["--host", "127.0.0.1", "--port", str(port)]) == devserver.EXIT_CANNOT_LISTEN == 69
    assert f"127.0.0.1:{port} is in use" in capsys.readouterr().err


@pytest.mark.parametrize("text", ["0", "1", "2525", "65535"])
def test_the_ports_a_sink_takes(text: str) -> None:
    assert devserver.port_number(text) == int(text)
