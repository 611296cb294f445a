"""Issue 13: with a wrong port in EVQ_DATABASE_URL (nothing listening there) every one-shot command
waited 15 s, psycopg_pool logging a retry every few seconds, before saying E_DB_UNAVAILABLE. One-shot
commands now fail at once, as they already did for a database or role that does not exist. The
long-running processes (the worker, `evq serve`, `evq mcp`) still wait for a database that is not
answering yet, since it may be restarting. Driven for real: the CLI in subprocesses against a closed
port, and a store opened through a real TCP proxy that refuses connections until it is healed."""

from __future__ import annotations

import asyncio
import json
import secrets
import shlex
import subprocess
import time
from urllib.parse import quote

import psycopg
import psycopg.sql
import pytest

from evq.adapters.postgres.store import PostgresStore
from evq.worker.errors import DatabaseUnavailable
from tests.acceptance.conftest import Evq
from tests.support import free_port

PASSWORD = "wrong-port-secret-9f2c"
# The commands that connect through the store (db status/upgrade connect directly and never waited).
ONE_SHOT = [
    ("steps", "list"),
    ("steps", "show", "1"),
    ("runs", "show", "r"),
    ("keys", "list"),
    ("prune", "--older-than", "90d", "--dry-run"),
    ("steps", "resolve", "1", "--as", "accepted", "--note", "n", "--dry-run"),
    (
        "enqueue",
        "--run-id",
        "r",
        "--step-id",
        "s",
        "--to",
        "a@example.com",
        "--from",
        "b@example.org",
        "--subject",
        "s",
        "--text",
        "t",
    ),
]


def _closed_port_url(db_url: str) -> tuple[str, int]:
    port = free_port()  # bound and closed again: nothing listens there
    info = psycopg.conninfo.conninfo_to_dict(db_url)
    info.update(host="127.0.0.1", port=str(port), password=PASSWORD)
    return psycopg.conninfo.make_conninfo(**info), port


@pytest.mark.parametrize("args", ONE_SHOT, ids=[" ".join(a[:2]) for a in ONE_SHOT])
def test_a_one_shot_command_fails_at_once_when_nothing_listens_at_the_port(db_url, args):
    url, port = _closed_port_url(db_url)
    evq = Evq(url, api_key="evq_not-checked-before-the-database")
    done = evq.run(*args, "-o", "json")
    assert done.returncode == 9, (done.returncode, done.stdout, done.stderr[-2000:])
    out = json.loads(done.stdout)
    assert out["error"]["code"] == "E_DB_UNAVAILABLE"
    # The cause in words, once: where nothing listens, and what to change.
    assert (
        out["error"]["message"]
        == f"cannot reach the database: nothing listens on 127.0.0.1:{port} (connection refused)"
    )
    assert "EVQ_DATABASE_URL" in out["error"]["hint"], out
    # Measured inside the command (start-up excluded): one refused connection, no 15 s of pool retries.
    assert out["meta"]["duration_ms"] < 5000, out["meta"]
    assert "error connecting" not in done.stderr, done.stderr[-2000:]
    assert PASSWORD not in done.stdout + done.stderr


async def test_a_patient_store_waits_for_a_database_that_comes_back_and_an_impatient_one_does_not(proxied_url):
    url, proxy = proxied_url
    proxy.partition()  # every connection is cut at once, as by a server that is restarting
    with pytest.raises(DatabaseUnavailable):
        await PostgresStore.open(url, patient=False)
    opening = asyncio.create_task(PostgresStore.open(url, patient=True))
    await asyncio.sleep(1.0)
    assert not opening.done()  # still waiting, not failed
    proxy.heal()
    store = await asyncio.wait_for(opening, timeout=30)
    try:
        async with store.pool.connection() as conn:
            assert (await (await conn.execute("SELECT 1")).fetchone()) == (1,)
    finally:
        await store.close()


def _missing_database_url(db_url: str) -> tuple[str, str]:
    name = "evq_missing_" + PASSWORD[-4:]  # a database nobody created
    info = psycopg.conninfo.conninfo_to_dict(db_url)
    info.update(dbname=name, password=PASSWORD)
    return psycopg.conninfo.make_conninfo(**info), name


@pytest.mark.parametrize("args", [("steps", "list"), ("db", "upgrade"), ("worker", "run", "--drain")])
def test_a_database_that_does_not_exist_is_named_with_the_command_that_creates_it(db_url, args):
    url, name = _missing_database_url(db_url)
    done = Evq(url, api_key="evq_not-checked-before-the-database").run(*args, "-o", "json", timeout=30)
    assert done.returncode == 9, (done.returncode, done.stdout, done.stderr[-2000:])
    error = json.loads(done.stdout)["error"]
    assert error["code"] == "E_DB_UNAVAILABLE"
    assert error["message"] == f'the database "{name}" does not exist', error
    info = psycopg.conninfo.conninfo_to_dict(url)
    command = f"createdb -h {info['host']} -p {info['port']} -U {info['user']} {name}"
    assert f"`{command}`" in error["hint"] and "EVQ_DATABASE_URL" in error["hint"], error
    assert json.loads(done.stdout)["meta"]["duration_ms"] < 2000
    # Said once (the JSON error), not as libpq's raw FATAL lines or a pool's retries.
    assert "FATAL" not in done.stdout + done.stderr and "pool initialization" not in done.stderr, done.stderr
    assert PASSWORD not in done.stdout + done.stderr


@pytest.mark.parametrize("args", [("steps", "list"), ("db", "upgrade"), ("worker", "run", "--drain")])
def test_the_createdb_hint_is_a_shell_command_for_the_urls_server_without_its_password(db_url, args, pg_server):
    """A URL with host, port, user and password, and a database name a shell would split
    ("my db;x" would run ``x``): the hint quotes each part and never shows the password."""
    info = psycopg.conninfo.conninfo_to_dict(db_url)
    # Its own name per case: the cases run at once on the suite's workers, and one's
    # createdb would otherwise meet (or its DROP take away) another's database.
    name = f"my db;x {secrets.token_hex(4)}"
    url = f"postgresql://{info['user']}:{PASSWORD}@{info['host']}:{info['port']}/" + quote(name, safe="")
    done = Evq(url, api_key="evq_not-checked-before-the-database").run(*args, "-o", "json", timeout=30)
    assert done.returncode == 9, (done.returncode, done.stdout, done.stderr[-2000:])
    error = json.loads(done.stdout)["error"]
    assert error["message"] == f'the database "{name}" does not exist', error
    command = f"createdb -h {info['host']} -p {info['port']} -U {info['user']} '{name}'"
    assert error["hint"].startswith(f"create it with `{command}` (or CREATE DATABASE)"), error
    assert shlex.split(command) == ["createdb", "-h", info["host"], "-p", str(info["port"]), "-U", info["user"], name]
    assert PASSWORD not in done.stdout + done.stderr
    # The command as printed really creates that database on that server (PGPASSWORD unused: trust).
    created = subprocess.run(shlex.split(command), capture_output=True, text=True, timeout=30)
    try:
        assert created.returncode == 0, created.stderr
        with psycopg.connect(pg_server) as conn:
            assert conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone() == (1,)
    finally:
        with psycopg.connect(pg_server, autocommit=True) as conn:
            conn.execute(psycopg.sql.SQL("DROP DATABASE IF EXISTS {}").format(psycopg.sql.Identifier(name)))


def test_a_worker_at_a_wrong_port_says_the_cause_once_at_its_first_try_then_gives_up_saying_it_again(db_url):
    url, port = _closed_port_url(db_url)
    started = time.monotonic()
    done = Evq(url).run("worker", "run", "--drain", "-o", "json", timeout=30, EVQ_STARTUP_WAIT="3")
    assert done.returncode == 9, (done.returncode, done.stdout, done.stderr[-2000:])
    lines = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    waits = [line for line in lines if line["event"] == "database_unavailable_at_start"]
    # One warning for every try would be noise: the first says the cause and how long it waits.
    assert len(waits) == 1 and waits[0]["level"] == "warning" and waits[0]["tries"] == 1, waits
    assert f"nothing listens on 127.0.0.1:{port}" in waits[0]["error"] and "EVQ_STARTUP_WAIT" in waits[0]["note"]
    error = json.loads(done.stdout)["error"]
    assert error["code"] == "E_DB_UNAVAILABLE" and f"nothing listens on 127.0.0.1:{port}" in error["message"]
    assert time.monotonic() - started < 20
    assert PASSWORD not in done.stdout + done.stderr
