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
    assert createdb_command("it's", "postgresql:///x") == "createdb 'it'\"'\"'s'"
    assert "s3cret" not in createdb_command("x", url)


def test_a_url_that_picks_its_server_otherwise_gives_createdb_the_same_as_libpq_variables():
    """createdb's -h/-p/-U say a host, a port and a user; a URL that picks its server or login
    otherwise (hostaddr, a service file's entry, a session kind among several hosts, TLS files)
    gets those as the libpq variables createdb reads, so the command reaches the same server;
    a parameter createdb cannot be given (a secret such as sslpassword) means no command."""
    assert (
        createdb_command("evq", "postgresql://evq@/evq?hostaddr=10.1.2.3") == "PGHOSTADDR=10.1.2.3 createdb -U evq evq"
    )
    assert createdb_command("evq", "postgresql:///evq?service=prod") == "PGSERVICE=prod createdb evq"
    assert createdb_command("evq", "host=h1,h2 dbname=evq target_session_attrs=read-write") == (
        "PGTARGETSESSIONATTRS=read-write createdb -h h1,h2 evq"
    )
    assert createdb_command("evq", "postgresql://u@h/evq?sslmode=verify-full&sslrootcert=/etc/my%20ca.pem") == (
        "PGSSLMODE=verify-full PGSSLROOTCERT='/etc/my ca.pem' createdb -h h -U u evq"
    )
    # Options that change neither the server nor the login are left out.
    assert createdb_command("evq", "postgresql://u:pw@h:5433/evq?connect_timeout=5&application_name=x") == (
        "createdb -h h -p 5433 -U u evq"
    )
    assert createdb_command("evq", "postgresql://u@h/evq?sslkey=/k&sslpassword=s3cret") is None
    # Nor when the URL is not known: `createdb evq` would be libpq's default server, maybe another.
    assert createdb_command("evq", None) is None


def test_the_missing_database_hint_without_a_command_still_says_what_to_do():
    missing = psycopg.OperationalError('connection failed: FATAL:  database "evq" does not exist')
    for url in (None, "postgresql://h/evq?sslpassword=s3cret"):
        mapped = translate(missing, url)
        assert mapped is not None and mapped.message == 'the database "evq" does not exist'
        assert "createdb -" not in mapped.hint and "`" not in mapped.hint and "s3cret" not in mapped.hint, mapped.hint
        assert "CREATE DATABASE" in mapped.hint and "EVQ_DATABASE_URL" in mapped.hint, mapped.hint
    hinted = translate(missing, "postgresql://u:pw@h:5433/evq")
    assert hinted is not None and "`createdb -h h -p 5433 -U u evq`" in hinted.hint and "pw" not in hinted.hint


def test_a_store_read_that_finds_its_database_gone_names_the_createdb_of_its_own_server():
    """A pool's new connection after the database was dropped: the hint's command names the
    store's server (its URL), not libpq's default one."""
    import asyncio
    from contextlib import asynccontextmanager

    from evq.adapters.postgres.store import PostgresStore

    class GonePool:
        conninfo = "postgresql://ops:pw@db.example.net:6543/evq"

        @asynccontextmanager
        async def connection(self):
            raise psycopg.OperationalError('connection failed: FATAL:  database "evq" does not exist')
            yield

    async def read() -> DatabaseUnavailable:
        try:
            async with PostgresStore(GonePool())._op("read"):  # type: ignore[arg-type]
                pass
        except DatabaseUnavailable as exc:
            return exc
        raise AssertionError("not refused")

    error = asyncio.run(read())
    assert "`createdb -h db.example.net -p 6543 -U ops evq`" in error.hint and "pw" not in error.hint, error.hint
