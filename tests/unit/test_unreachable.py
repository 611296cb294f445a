"""Which database errors a starting worker waits out (adapters/postgres/database.py::unreachable)."""

from __future__ import annotations

import psycopg
from psycopg import errors as pgerr

from evq.adapters.postgres.database import translate, unreachable
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
