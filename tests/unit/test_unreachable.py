"""Which database errors a starting worker waits out (adapters/postgres/database.py::unreachable)."""

from __future__ import annotations

import psycopg
from psycopg import errors as pgerr

from evq.adapters.postgres.database import createdb_command, translate, unreachable
from evq.worker.errors import DatabaseUnavailable, ReadOnlyDatabase


def caused(exc: BaseException) -> BaseException:
    mapped = translate(exc) if isinstance(exc, psycopg.Error) else DatabaseUnavailable("did not answer in time")
    assert mapped is not None
    try:
        raise mapped from exc
    except DatabaseUnavailable as raised:
        return raised


def test_a_server_that_does_not_answer_is_waited_for():
    assert unreachable(caused(psycopg.OperationalError("connection refused")))
    assert unreachable(caused(psycopg.OperationalError("FATAL:  the database system is shutting down")))
    assert unreachable(caused(TimeoutError()))


def test_a_server_that_answers_no_is_not():
    assert not unreachable(caused(psycopg.OperationalError('FATAL:  database "evq" does not exist')))
    assert not unreachable(caused(psycopg.OperationalError("FATAL:  password authentication failed for user x")))
    assert not unreachable(caused(pgerr.DiskFull()))
    assert not unreachable(caused(pgerr.QueryCanceled()))
    assert not unreachable(ReadOnlyDatabase("read-only"))
    assert not unreachable(DatabaseUnavailable("EVQ_DATABASE_URL is not a PostgreSQL URL"))  # no cause


def test_the_createdb_command_takes_host_port_and_user_from_the_url_quoted_never_the_password():
    url = "postgresql+psycopg://ops%20user:s3cret%3Bpw@db.example.net:6543/my%20db%3Bx"
    assert createdb_command("my db;x", url) == "createdb -h db.example.net -p 6543 -U 'ops user' 'my db;x'"
    # A part the URL does not give is left out (createdb then uses the same PG* defaults as libpq).
    assert createdb_command("evq", "postgresql:///evq") == "createdb evq"
    assert createdb_command("evq", "host=/run/postgresql dbname=evq") == "createdb -h /run/postgresql evq"
    assert createdb_command("it's", None) == "createdb 'it'\"'\"'s'"
    assert "s3cret" not in createdb_command("x", url)
