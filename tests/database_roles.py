"""The `roles` fixture: two roles of a test's own (an owner that migrates, a runtime role that
runs everything else) and a database the owner owns. A plugin (tests/conftest.py lists it in
`pytest_plugins`) so that every test module can ask for it without importing the fixture.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import psycopg
import pytest

from tests.acceptance.conftest import Evq


@dataclass(frozen=True)
class Roles:
    owner: str
    app: str
    owner_url: str
    app_url: str
    admin_url: str  # the server's superuser, on this database: for checks only


def _url(server: str, **overrides: str) -> str:
    info = psycopg.conninfo.conninfo_to_dict(server)
    info.update(overrides)
    return psycopg.conninfo.make_conninfo(**info)


@pytest.fixture
def roles(pg_server: str) -> Iterator[Roles]:
    tag = f"{os.getpid()}_{uuid.uuid4().hex[:8]}"
    owner, app, database = f"evq_owner_{tag}", f"evq_app_{tag}", f"evq_roles_{tag}"
    with psycopg.connect(pg_server, autocommit=True) as conn:
        try:
            # Trust auth on loopback (the test cluster): LOGIN without a password.
            conn.execute(f'CREATE ROLE "{owner}" LOGIN')
            conn.execute(f'CREATE ROLE "{app}" LOGIN')
            conn.execute(f'CREATE DATABASE "{database}" OWNER "{owner}"')
            yield Roles(
                owner=owner,
                app=app,
                owner_url=_url(pg_server, user=owner, dbname=database),
                app_url=_url(pg_server, user=app, dbname=database),
                admin_url=_url(pg_server, dbname=database),
            )
        finally:
            conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
            conn.execute(f'DROP ROLE IF EXISTS "{app}"')
            conn.execute(f'DROP ROLE IF EXISTS "{owner}"')


def upgrade(url: str, *args: str, expect: int = 0) -> dict:
    return Evq(url).json("db", "upgrade", *args, expect=expect)


def migrated(r: Roles) -> dict:
    done = upgrade(r.owner_url, "--runtime-role", r.app)
    assert done["data"]["runtime_roles"] == [r.app], done
    return done
