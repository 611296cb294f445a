"""Fixtures for driving the real `evq` command in subprocesses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from ops.devsmtp import DevSmtpServer


class Evq:
    """Runs `evq` (as `python -m ops.cli`) against one test database."""

    def __init__(self, db_url: str, **env: str):
        self.env = {**os.environ, "EVQ_DATABASE_URL": db_url, "EVQ_LOG_FORMAT": "json", **env}
        self.env.pop("EVQ_API_KEY", None)

    def cmd(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "ops.cli", *args]

    def run(self, *args: str, input: str | None = None, timeout: float = 60, **env: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            self.cmd(*args), input=input, capture_output=True, text=True, timeout=timeout, env={**self.env, **env}
        )

    def json(self, *args: str, input: str | None = None, expect: int = 0, **env: str) -> dict[str, Any]:
        done = self.run(*args, "-o", "json", input=input, **env)
        assert done.returncode == expect, (done.returncode, done.stdout, done.stderr[-3000:])
        # The contract: stdout is exactly one JSON object, logs never go there.
        out = json.loads(done.stdout)
        assert set(out) == {"status", "schema_version", "data" if out["status"] != "error" else "error", "meta"}
        return out

    def popen(self, *args: str, **env: str) -> subprocess.Popen:
        return subprocess.Popen(
            self.cmd(*args), env={**self.env, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )


@pytest.fixture
def evq(db_url: str) -> Evq:
    return Evq(db_url)


@pytest.fixture
def smtp() -> Iterator[DevSmtpServer]:
    with DevSmtpServer() as server:
        yield server


def smtp_env(server: DevSmtpServer, **extra: str) -> dict[str, str]:
    return {
        "EVQ_SMTP_HOST": server.host,
        "EVQ_SMTP_PORT": str(server.port),
        "EVQ_SMTP_TIMEOUT": "2",
        "EVQ_LEASE_SECONDS": "8",
        "EVQ_POLL_INTERVAL": "0.1",
        "EVQ_RETRY_BASE": "0",
        "EVQ_RETRY_MAX": "0",
        **extra,
    }
