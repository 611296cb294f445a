"""Where the database is, whether its schema is current, and how its errors read.

- :func:`resolve_url`: EVQ_DATABASE_URL, or (``embedded``) a PostgreSQL of evq's own in the data dir.
- :func:`upgrade` / :func:`check_at_head`: Alembic, configured in code so an
  installed evq needs no alembic.ini.
- :func:`translate`: driver exceptions become evq errors at this boundary, by
  SQLSTATE and constraint name, never by matching message text.
"""

from __future__ import annotations

import functools
import re
import shlex
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import psycopg
from psycopg import errors as pgerr

from evq.adapters.postgres.conninfo import normalise
from evq.worker.errors import (
    ConfigError,
    DatabaseUnavailable,
    EvqError,
    IdempotencyConflict,
    ReadOnlyDatabase,
    SchemaMismatch,
)

UPGRADE_HINT = "run `evq db upgrade` (same EVQ_DATABASE_URL) to migrate it"
NEWER_HINT = (
    "a newer evq migrated this database: run that evq version (or a later one) here; `evq db upgrade` never goes back"
)


# EVQ_DATABASE_URL=embedded (or --database-url embedded): evq's own PostgreSQL in the data dir.
EMBEDDED = "embedded"

NO_DATABASE_HINT = (
    "export EVQ_DATABASE_URL=postgresql://USER@HOST:5432/DBNAME (your PostgreSQL 13+), or "
    "EVQ_DATABASE_URL=embedded for a local one of evq's own (pip install 'evq[embedded]'); "
    "`evq admin demo` starts one by itself"
)


def resolve_url(database_url: str | None, data_dir: str | None = None, *, embedded_default: bool = False) -> str:
    """The configured URL, or the URL of the embedded server (started on demand) when it is
    asked for by name (``embedded``) or, for the demo alone, when none is set
    (``embedded_default``). No database is never silently a new one: E_INVALID_ARG that says
    how to set one."""
    if database_url and database_url.strip() != EMBEDDED:
        return normalise(database_url)
    if not database_url and not embedded_default:
        raise ConfigError("no database: EVQ_DATABASE_URL is not set", hint=NO_DATABASE_HINT, field="EVQ_DATABASE_URL")
    from evq.adapters.postgres.embedded import embedded_url

    return embedded_url(data_dir)


def describe(url: str) -> dict[str, str | int | None]:
    """Which database ``url`` names, without its password: host (or socket folder), port, name;
    what `-o json` meta and `evq admin health` say so nobody is unsure which one they talked to."""
    try:
        params = psycopg.conninfo.conninfo_to_dict(url.replace("postgresql+psycopg://", "postgresql://", 1))
    except psycopg.ProgrammingError:
        return {"host": None, "port": None, "database": None}
    port = str(params.get("port") or "5432").split(",")[0]
    return {
        "host": str(params.get("host") or params.get("hostaddr") or "localhost"),
        "port": int(port) if port.isdigit() else None,
        "database": str(params.get("dbname") or params.get("user") or ""),
    }


def sqlalchemy_url(url: str) -> str:
    """The SQLAlchemy form of a libpq URL or key=value DSN (for Alembic)."""
    from sqlalchemy.engine import URL

    try:
        params = psycopg.conninfo.conninfo_to_dict(url.replace("postgresql+psycopg://", "postgresql://", 1))
    except psycopg.ProgrammingError as exc:
        raise DatabaseUnavailable(
            f"EVQ_DATABASE_URL is not a PostgreSQL URL ({type(exc).__name__})",
            hint="e.g. postgresql://user:pass@host:5432/evq",
        ) from None
    user, password, dbname = params.pop("user", None), params.pop("password", None), params.pop("dbname", None)
    # Everything else (host, port, sslmode, a socket directory as host) goes through as a query parameter.
    query = {k: str(v) for k, v in params.items()}
    return URL.create(
        "postgresql+psycopg", username=user, password=password, database=dbname, query=query
    ).render_as_string(hide_password=False)


def alembic_config(url: str) -> Any:
    # Alembic (and SQLAlchemy under it) is imported only by the commands that
    # migrate or check the schema: it is most of a short command's start-up time.
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(resources.files("evq.migrations")))
    # ConfigParser treats % as interpolation; URLs may hold %-escapes.
    cfg.set_main_option("sqlalchemy.url", sqlalchemy_url(url).replace("%", "%%"))
    return cfg


# A revision file's own `revision: str = "..."` and `down_revision ... = "..." | None` lines.
_REVISION = re.compile(r"^revision(?:: *str)? *= *[\"']([^\"']+)[\"']", re.M)
_DOWN = re.compile(r"^down_revision(?:: *[^=]+)? *= *(?:[\"']([^\"']+)[\"']|None)", re.M)


@functools.cache
def revision_graph() -> dict[str, str | None]:
    """Each revision of migrations/versions/ and the one before it, read from the files' text:
    the schema checks every command and `evq admin health` make need no Alembic (whose import
    is most of a short command's start-up). A file that does not read as a revision here is an
    error, not a silent gap (tests/integration compares this with Alembic's own walk)."""
    graph: dict[str, str | None] = {}
    for entry in (resources.files("evq.migrations") / "versions").iterdir():
        if not entry.name.endswith(".py") or entry.name.startswith("_"):
            continue
        text = entry.read_text(encoding="utf-8")
        revision, down = _REVISION.search(text), _DOWN.search(text)
        if revision is None or down is None:
            raise RuntimeError(f"migrations/versions/{entry.name} names no revision and down_revision")
        graph[revision.group(1)] = down.group(1)
    return graph


def head_revision() -> str:
    """The revision no other revision follows (there is one head)."""
    graph = revision_graph()
    (head,) = set(graph) - set(graph.values())
    return head


def known_revision(url: str) -> str | None:
    """The database's revision, refused (SchemaMismatch) when this evq cannot migrate it: a newer
    evq migrated it (neither this evq's code nor its migrations fit it), or a development
    version between 0.2.0 and 1.0 did (migrations/from_0_2.py upgrades only 0.2.0's revision)."""
    from evq.migrations import from_0_2

    current = current_revision(url)
    known = set(revision_graph())
    if current is None or current in known or current == from_0_2.RELEASED:
        return current
    context = {"current": current, "expected": head_revision()}
    if from_0_2.development(current):
        refused = from_0_2.refusal(current)
        raise SchemaMismatch(str(refused), hint=refused.hint, context=context)
    raise SchemaMismatch(
        f"the database is at revision {current}, which this evq does not know; this evq needs {head_revision()}",
        hint=NEWER_HINT,
        context=context,
    )


def pending_revisions(url: str) -> list[str]:
    """The revisions `upgrade` would apply, oldest first."""
    from alembic.script import ScriptDirectory

    from evq.migrations import from_0_2

    script = ScriptDirectory.from_config(alembic_config(url))
    current = known_revision(url)
    # A 0.2.0 database gets the whole chain, its rows copied into the baseline first.
    since = None if current == from_0_2.RELEASED else current
    pending = [r.revision for r in script.iterate_revisions("heads", since)]
    return list(reversed(pending))


def upgrade(url: str, revision: str = "head", *, runtime_role: str | None = None) -> tuple[str | None, str]:
    """Migrate; return (revision before, revision after)."""
    done = migrate(url, revision, runtime_role=runtime_role)
    return done.before, done.after


@dataclass(frozen=True)
class Migrated:
    before: str | None
    after: str
    granted: list[str]  # the roles granted the runtime privileges
    from_0_2: dict[str, Any] | None = None  # what the one-time upgrade of a 0.2.0 database copied


def migrate(url: str, revision: str = "head", *, runtime_role: str | None = None) -> Migrated:
    """Migrate as the owner of evq's tables, then grant the runtime privileges again
    (to every role granted them before, and to ``runtime_role``). A 0.2.0 database is first
    upgraded to the baseline by the one-time copy (migrations/from_0_2.py).

    A role that does not own the schema is refused before anything runs (Forbidden); with
    nothing to migrate and no role named, it only reads."""
    from alembic import command

    from evq.adapters.postgres.roles import grant_runtime, migrator, refuse_unless_owner
    from evq.migrations import from_0_2

    before = known_revision(url)
    with translated(url), psycopg.connect(url, autocommit=True, **connect_kwargs()) as conn:
        who = migrator(conn)
    if not who["may_migrate"] and (runtime_role or pending_revisions(url)):
        refuse_unless_owner(who)
    if not who["may_migrate"]:
        return Migrated(before, before or "", [])
    copied = None
    with translated(url):
        if before == from_0_2.RELEASED:
            copied = _upgrade_from_0_2(url)
        command.upgrade(alembic_config(url), revision)
    granted: list[str] = []
    with translated(url), psycopg.connect(url, autocommit=True, **connect_kwargs()) as conn:
        if migrator(conn)["can_grant"]:
            granted = grant_runtime(conn, runtime_role)
        elif runtime_role:
            raise SchemaMismatch("the database has no evq schema to grant on", hint="upgrade to head first")
    return Migrated(before, current_revision(url) or "", granted, copied)


def _upgrade_from_0_2(url: str) -> dict[str, Any]:
    """migrations/from_0_2.py on a connection of its own, in one transaction, creating the
    baseline on that connection."""
    from alembic import command
    from sqlalchemy import create_engine, pool

    from evq.migrations import from_0_2

    engine = create_engine(sqlalchemy_url(url), poolclass=pool.NullPool)
    try:
        with engine.begin() as connection:
            cfg = alembic_config(url)
            cfg.attributes["connection"] = connection
            try:
                return from_0_2.upgrade(connection, lambda: command.upgrade(cfg, from_0_2.BASELINE))
            except from_0_2.Refused as exc:
                raise SchemaMismatch(str(exc), hint=exc.hint) from None
    finally:
        engine.dispose()


def current_revision(url: str) -> str | None:
    with translated(url), psycopg.connect(url, **connect_kwargs()) as conn:
        return _revision(conn)


def _revision(conn: psycopg.Connection[Any]) -> str | None:
    try:
        row = conn.execute("SELECT version_num FROM alembic_version").fetchone()
    except pgerr.UndefinedTable:
        return None
    return row[0] if row else None


def check_at_start(url: str) -> None:
    """:func:`check_at_head` and the isolation check (adapters/postgres/isolation.py) of a starting
    process on one connection (they were two), when the database is at head; anything else goes
    the long way, which says what is wrong."""
    from evq.adapters.postgres import isolation

    head = head_revision()
    with translated(url), psycopg.connect(url, autocommit=True, **connect_kwargs()) as conn:
        if _revision(conn) == head:
            isolation.check_on(conn)
            return
    check_at_head(url)
    isolation.check(url)


def check_at_head(url: str) -> str:
    """Raise SchemaMismatch unless the database is at this evq's head revision."""
    head = head_revision()
    current = known_revision(url)
    if current != head:
        state = "has no evq schema" if current is None else f"is at revision {current}"
        raise SchemaMismatch(
            f"the database {state}; this evq needs revision {head}",
            hint=UPGRADE_HINT,
            context={"current": current, "expected": head},
        )
    return head


def connect_kwargs() -> dict[str, Any]:
    return {"connect_timeout": 10, "application_name": "evq"}


def misconfigured(exc: psycopg.Error) -> bool:
    """The server answered and refused this URL for good: no such database or role, bad login."""
    state = exc.sqlstate or ""
    if state.startswith("28") or state == "3D000":
        return True
    # libpq gives no SQLSTATE for a refused connection: the server's FATAL text is what there is.
    text = str(exc)
    return "FATAL" in text and any(m in text for m in _MISCONFIGURED)


_MISCONFIGURED = ("does not exist", "authentication failed", "no pg_hba.conf entry", "permission denied")


def unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` (an evq error from :func:`translated`) means the server is not answering
    right now (nothing listening, starting up, shutting down): worth waiting for. A URL the server
    refuses for good (no such database, bad login), a read-only server or a full disk are not."""
    cause = exc.__cause__
    if type(exc) is not DatabaseUnavailable:
        return False
    if isinstance(cause, TimeoutError):
        return True  # connected to nothing in time
    return (
        isinstance(cause, psycopg.OperationalError)
        and not isinstance(cause, (pgerr.QueryCanceled, pgerr.LockNotAvailable, pgerr.DiskFull))
        and not misconfigured(cause)
    )


# SQLSTATEs that mean "cannot reach or use the server right now": retry later.
_UNAVAILABLE = (pgerr.OperationalError, pgerr.AdminShutdown, pgerr.CannotConnectNow, pgerr.CrashShutdown)


def translate(exc: BaseException, url: str | None = None) -> EvqError | None:
    """The evq error for a driver exception, or None when it is a bug to re-raise.

    ``url``: the database URL the failed connection was made with, when the caller has it,
    so a hint's command names the same server (never its password)."""
    if isinstance(exc, EvqError):
        return exc
    if isinstance(exc, pgerr.ReadOnlySqlTransaction):
        return ReadOnlyDatabase(
            "the database is read-only: nothing was written",
            hint="check default_transaction_read_only, or whether this is a standby",
        )
    if isinstance(exc, pgerr.DiskFull):
        return DatabaseUnavailable("the database's disk is full: nothing was written", hint="free space on the server")
    if isinstance(exc, pgerr.UndefinedTable):
        return SchemaMismatch("the database has no evq schema", hint=UPGRADE_HINT)
    if isinstance(exc, pgerr.UniqueViolation):
        constraint = getattr(exc.diag, "constraint_name", None) or ""
        if constraint.startswith("uq_email_steps") or constraint == "uq_step_keys_message_id":
            return IdempotencyConflict(
                "a step with this key, Message-ID or run_id/step_id already exists", context={"constraint": constraint}
            )
        return None
    if isinstance(exc, (pgerr.QueryCanceled, pgerr.LockNotAvailable)):
        return DatabaseUnavailable(f"the database did not answer in time ({type(exc).__name__})")
    if isinstance(exc, _UNAVAILABLE) or isinstance(exc, psycopg.OperationalError):
        cause, hint = connect_cause(_first_line(exc), url)
        return DatabaseUnavailable(cause, hint=hint)
    return None


_AT = r'connection to server (?:at "(?P<host>[^"]+)"(?: \([^)]*\))?, port (?P<port>\d+)|on socket "(?P<socket>[^"]+)")'
_REFUSED = re.compile(_AT + r" failed: (?:Connection refused|No such file or directory)")
_NO_DATABASE = re.compile(r'FATAL:\s+database "(?P<name>[^"]+)" does not exist')
_NO_ROLE = re.compile(r'FATAL:\s+role "(?P<name>[^"]+)" does not exist')
_BAD_LOGIN = re.compile(r'FATAL:\s+password authentication failed for user "(?P<name>[^"]+)"')
_DEFAULT_HINT = "check EVQ_DATABASE_URL and that PostgreSQL is running"


def connect_cause(line: str, url: str | None = None) -> tuple[str, str]:
    """libpq's first line about a failed connection, said as its cause and what to do.

    libpq's words name the server and the answer but not the fix, and a newcomer's first
    mistakes are these: a database not created yet, a wrong port, a wrong user. Never the
    password: libpq's text does not carry it, this only rewords that text, and the one
    command built from ``url`` (:func:`createdb_command`) leaves it out."""
    if match := _NO_DATABASE.search(line):
        name = match["name"]
        command = createdb_command(name, url)
        create = (
            f"create it with `{command}` (or CREATE DATABASE)"
            if command
            else "create it (createdb or CREATE DATABASE) on the server EVQ_DATABASE_URL names"
        )
        return f'the database "{name}" does not exist', f"{create} or fix the database name in EVQ_DATABASE_URL"
    if match := _NO_ROLE.search(line):
        return (
            f'the database role "{match["name"]}" does not exist',
            "fix the user in EVQ_DATABASE_URL, or create the role",
        )
    if match := _BAD_LOGIN.search(line):
        return (
            f'PostgreSQL refused the password of user "{match["name"]}"',
            "fix the user or password in EVQ_DATABASE_URL (or the server's pg_hba.conf)",
        )
    if match := _REFUSED.search(line):
        where = f"socket {match['socket']}" if match["socket"] else f"{match['host']}:{match['port']}"
        return (
            f"cannot reach the database: nothing listens on {where} (connection refused)",
            "start PostgreSQL there, or fix the host and port in EVQ_DATABASE_URL",
        )
    return f"cannot reach the database: {line}", _DEFAULT_HINT


# The URL's other connection parameters that say which server, or how to reach and log in
# to it, as the libpq variables createdb reads (it has no flags for them): put before the
# command, so createdb connects as the URL did. Parameters that change neither (a timeout, a
# name for pg_stat_activity, session options) are left out; any other (sslpassword, a secret;
# one this list does not know) means no command is printed, rather than one for another server.
_AS_ENVIRONMENT = {
    "hostaddr": "PGHOSTADDR",
    "service": "PGSERVICE",
    "servicefile": "PGSERVICEFILE",
    "target_session_attrs": "PGTARGETSESSIONATTRS",
    "load_balance_hosts": "PGLOADBALANCEHOSTS",
    "passfile": "PGPASSFILE",
    "channel_binding": "PGCHANNELBINDING",
    "require_auth": "PGREQUIREAUTH",
    "sslmode": "PGSSLMODE",
    "requiressl": "PGREQUIRESSL",
    "sslcompression": "PGSSLCOMPRESSION",
    "sslcert": "PGSSLCERT",
    "sslkey": "PGSSLKEY",
    "sslrootcert": "PGSSLROOTCERT",
    "sslcrl": "PGSSLCRL",
    "sslcrldir": "PGSSLCRLDIR",
    "sslsni": "PGSSLSNI",
    "requirepeer": "PGREQUIREPEER",
    "ssl_min_protocol_version": "PGSSLMINPROTOCOLVERSION",
    "ssl_max_protocol_version": "PGSSLMAXPROTOCOLVERSION",
    "gssencmode": "PGGSSENCMODE",
    "krbsrvname": "PGKRBSRVNAME",
    "gsslib": "PGGSSLIB",
    "gssdelegation": "PGGSSDELEGATION",
}
FLAGS = {"host": "-h", "port": "-p", "user": "-U"}  # createdb's flags for the URL's parts
_BESIDE_THE_POINT = frozenset(
    {
        "dbname",  # the database to create is the command's argument
        "password",  # never printed: createdb asks, or reads PGPASSWORD/.pgpass
        "connect_timeout",
        "application_name",
        "fallback_application_name",
        "options",
        "client_encoding",
        "keepalives",
        "keepalives_idle",
        "keepalives_interval",
        "keepalives_count",
        "tcp_user_timeout",
    }
)


def createdb_command(name: str, url: str | None = None) -> str | None:
    """``createdb`` for database ``name`` on the server of ``url``, ready to paste into a shell;
    None when no such command can be told (``url`` unknown or unreadable, or it holds a
    parameter createdb cannot be given: see ``_AS_ENVIRONMENT``), so the hint never names a
    command for another server.

    The host, port and user are the URL's (``-h``/``-p``/``-U``); a parameter that picks the
    server or the login otherwise (hostaddr, service, sslmode, ...) goes before the command as
    libpq's variable (``PGHOSTADDR=10.0.0.5 createdb ...``); each part shell-quoted (a database
    named ``my db;x`` must not run ``x``). A part the URL does not give is left out, so createdb
    falls back to the same PG* variables and defaults libpq used. Never the password: createdb
    asks for it, or reads PGPASSWORD/.pgpass, and a hint is printed and logged."""
    if not url:
        return None
    try:
        info = psycopg.conninfo.conninfo_to_dict(normalise(url))
    except Exception:  # a URL libpq cannot read was refused before any connection
        return None
    given = {key: str(value) for key, value in info.items() if value not in (None, "")}
    if any(key not in _AS_ENVIRONMENT and key not in _BESIDE_THE_POINT for key in given if key not in FLAGS):
        return None
    env = [f"{_AS_ENVIRONMENT[key]}={shlex.quote(value)}" for key, value in given.items() if key in _AS_ENVIRONMENT]
    parts = ["createdb"]
    for key, flag in FLAGS.items():
        if key in given:
            parts += [flag, given[key]]
    parts.append(name)
    return " ".join([*env, *(shlex.quote(part) for part in parts)])


@contextmanager
def translated(url: str | None = None) -> Iterator[None]:
    """Driver errors inside as evq errors; ``url`` as for :func:`translate`."""
    try:
        yield
    except Exception as exc:
        mapped = translate(exc, url) or _sqlalchemy_translate(exc, url)
        if mapped is None or mapped is exc:
            raise
        raise mapped from exc


def _sqlalchemy_translate(exc: BaseException, url: str | None = None) -> EvqError | None:
    orig = getattr(exc, "orig", None)
    return translate(orig, url) if isinstance(orig, BaseException) else None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def default_data_dir() -> Path:
    import platformdirs

    return Path(platformdirs.user_data_dir("evq", appauthor=False))
