"""Fixtures for driving the real `evq` command: in subprocesses, or in this process where
a child proves nothing more (tests/inprocess.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from evq.ops.dev.smtp import DevSmtpServer
from tests import contract, inprocess
from tests.support import spawn, with_store


class Evq:
    """Runs `evq` (as `python -m tests.child`: evq, whose EVQ_* may name a documented constant) against one test database, with ``api_key`` if given.

    Commands that only read, write rows and print run in this process (tests/inprocess.py
    says which); ``process=True`` runs every command as a child.
    Every ``json()`` output is checked against its command's schema in docs/cli-schema/.
    """

    def __init__(self, db_url: str, api_key: str | None = None, *, process: bool = False, **env: str):
        self.process = process
        self.env = {k: v for k, v in os.environ.items() if k != "EVQ_API_KEY"}
        self.env.update({"EVQ_DATABASE_URL": db_url, "EVQ_LOG_FORMAT": "json", **env})
        if api_key:
            self.env["EVQ_API_KEY"] = api_key

    def cmd(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "tests.child", *args]

    def run(self, *args: str, input: str | None = None, timeout: float = 60, **env: str) -> subprocess.CompletedProcess:
        if not self.process and inprocess.can_run(args):
            return inprocess.run(self.cmd(*args), args, input, {**self.env, **env})
        return subprocess.run(
            self.cmd(*args), input=input, capture_output=True, text=True, timeout=timeout, env={**self.env, **env}
        )

    def json(self, *args: str, input: str | None = None, expect: int = 0, **env: str) -> dict[str, Any]:
        done = self.run(*args, "-o", "json", input=input, **env)
        assert done.returncode == expect, (done.returncode, done.stdout, done.stderr[-3000:])
        # The contract: stdout is exactly one JSON object, logs never go there.
        out = json.loads(done.stdout)
        assert set(out) == {"status", "schema_version", "data" if out["status"] != "error" else "error", "meta"}
        contract.check(args, out)
        return out

    def popen(self, *args: str, **env: str) -> subprocess.Popen:
        return spawn(
            self.cmd(*args), env={**self.env, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )


def make_key(
    db_url: str, name: str, role: str, *, created_by: str | None = "test-admin", approval: str | None = "policy"
) -> str:
    """A real API key in the test database (``created_by=None``: the bootstrap admin key).

    Its ``approval`` is ``policy`` unless asked (the installation's rules, what every key had
    before issue 30): most tests are about what becomes of a send that goes out. None: the
    role's default, as `evq keys create` gives it (an agent's sends always wait for a person)."""
    from evq.worker.approval_policy import KeyApproval
    from evq.worker.keys import Role, generate

    key = generate()
    chosen = None if approval is None else KeyApproval(approval)
    with_store(
        db_url,
        lambda store: store.create_key(name=name, role=Role(role), key=key, created_by=created_by, approval=chosen),
    )
    return key.text


@pytest.fixture
def admin_key(db_url: str) -> str:
    return make_key(db_url, "test-admin", "admin", created_by=None)


@pytest.fixture
def evq(db_url: str, admin_key: str) -> Evq:
    """`evq` on this test's database as the admin key ``test-admin`` (may enqueue and resolve).
    Tests about keys themselves build ``Evq(db_url)`` without one."""
    return Evq(db_url, api_key=admin_key)


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
