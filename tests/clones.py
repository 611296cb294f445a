"""Test databases cloned from the session's template ahead of the test that takes one and
dropped behind it, on threads of their own.

Cloning costs about 0.1 s on an idle 2-core machine (PostgreSQL 15's WAL_LOG strategy writes
no checkpoint). Dropping costs a checkpoint: PostgreSQL 15's DROP DATABASE requests an
immediate one and waits for it, so a drop takes as long as flushing every dirty buffer of the
server (0.05 s idle, 3 s and more while other sessions write). Drops that wait together share
one checkpoint: six drops one after another took 18 s on a loaded machine, the same six at
once 7 s. So the drops are batched: everything given back since the last batch is dropped at
once, on connections of its own, while tests run; a clone never waits behind a drop (they
have separate threads). Isolation is unchanged: every test gets a database of its own, never
used by another test, cloned from the template migrated once per session; only the waiting moved.
"""

from __future__ import annotations

import itertools
import queue
import threading
from concurrent.futures import ThreadPoolExecutor

import psycopg

# How many clones wait ready: one for the next test, one more so a test that takes two
# (db_url and another fixture) does not wait.
AHEAD = 2
# At most this many drops at once (each holds a connection while it waits for the checkpoint).
DROP_BATCH = 16


def database_url(server_url: str, name: str) -> str:
    """``server_url`` with its database ``name``."""
    info = psycopg.conninfo.conninfo_to_dict(server_url)
    info["dbname"] = name
    return psycopg.conninfo.make_conninfo(**info)


def _admin(server_url: str, sql: str) -> None:
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(sql)


class Dropper:
    """Drops the session's test databases in batches, on a thread of its own."""

    def __init__(self, server_url: str) -> None:
        self._server = server_url
        self._drops: list[str] = []
        self._drop_due = threading.Condition()
        self._closing = False
        self._thread = threading.Thread(target=self._drop_loop, name="evq-test-drops", daemon=True)
        self._thread.start()

    def give_back(self, name: str) -> None:
        """Drop the database ``name`` with the next batch."""
        with self._drop_due:
            self._drops.append(name)
            self._drop_due.notify()

    def close(self) -> None:
        """Drop what was given back and not dropped yet (a session leaves no database behind)."""
        with self._drop_due:
            self._closing = True
            self._drop_due.notify()
        self._thread.join(timeout=300)

    def _drop_loop(self) -> None:
        with ThreadPoolExecutor(max_workers=DROP_BATCH, thread_name_prefix="evq-test-drop") as pool:
            while True:
                with self._drop_due:
                    self._drop_due.wait_for(lambda: bool(self._drops) or self._closing)
                    batch, self._drops = self._drops, []
                    closing = self._closing
                failed = [name for name, ok in zip(batch, pool.map(self._drop, batch), strict=True) if not ok]
                if failed:  # tried again with the next batch (or once more at close)
                    with self._drop_due:
                        self._drops.extend(failed)
                if closing and not self._drops:
                    return
                if closing:  # one more try for what failed, then give up: the names say whose they are
                    for name in self._drops:
                        self._drop(name)
                    return

    def _drop(self, name: str) -> bool:
        try:
            _admin(self._server, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        except psycopg.Error:
            return False
        return True


class ClonePool:
    def __init__(self, server_url: str, template: str, prefix: str, dropper: Dropper) -> None:
        self._server = server_url
        self._template = template
        self._dropper = dropper
        self._names = (f"{prefix}_{n}" for n in itertools.count())
        self._wanted: queue.Queue[bool] = queue.Queue()  # True: clone one more; False: stop
        self._ready: queue.Queue[str | BaseException] = queue.Queue()
        self._cloner = threading.Thread(target=self._clone_loop, name="evq-test-clones", daemon=True)
        self._cloner.start()
        for _ in range(AHEAD):
            self._wanted.put(True)

    def take(self, timeout: float = 60) -> str:
        """A database no test has used; another one starts cloning behind it."""
        self._wanted.put(True)
        got = self._ready.get(timeout=timeout)
        if isinstance(got, BaseException):
            raise RuntimeError("cloning a test database failed") from got
        return got

    def give_back(self, name: str) -> None:
        """Drop ``name`` (a database taken from this pool) with the dropper's next batch."""
        self._dropper.give_back(name)

    def close(self) -> None:
        """Stop cloning and hand the clones nobody took to the dropper."""
        self._wanted.put(False)
        self._cloner.join(timeout=120)
        while True:
            try:
                got = self._ready.get_nowait()
            except queue.Empty:
                break
            if isinstance(got, str):
                self._dropper.give_back(got)

    def _clone_loop(self) -> None:
        while self._wanted.get():
            name = next(self._names)
            try:
                # PostgreSQL 15's default strategy (WAL_LOG): FILE_COPY's two checkpoints per clone
                # made the same tests 1.2-1.5x slower here (the checkpoints stall every connection).
                _admin(self._server, f'CREATE DATABASE "{name}" TEMPLATE "{self._template}"')
            except BaseException as exc:  # handed to the test that waits, which fails with it
                self._ready.put(exc)
                continue
            self._ready.put(name)


class Filled:
    """A database filled once from the session's template (a module's data set of thousands of
    rows), cloned again for each test that asks: a test gets a copy of the same rows, its
    planner statistics included (ANALYZE's pg_statistic is copied with the database), and may
    change it as it likes. Cloning 30,000 steps costs about 0.3 s where filling them again
    cost 3 s idle and 10 s loaded, for every test."""

    def __init__(self, server_url: str, base: str, name: str, dropper: Dropper) -> None:
        self._server = server_url
        self.name = name
        self._dropper = dropper
        self._clones = (f"{name}_{n}" for n in itertools.count())
        _admin(server_url, f'CREATE DATABASE "{name}" TEMPLATE "{base}"')

    def clone(self) -> str:
        """A new database holding this one's rows (dropped with the dropper's batches by :meth:`give_back`)."""
        name = next(self._clones)
        _admin(self._server, f'CREATE DATABASE "{name}" TEMPLATE "{self.name}"')
        return name

    def give_back(self, name: str) -> None:
        self._dropper.give_back(name)

    def close(self) -> None:
        self._dropper.give_back(self.name)
