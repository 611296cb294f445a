"""Test databases cloned from the session's template ahead of the test that takes one and
dropped behind it, on a thread of their own.

Cloning and dropping cost a PostgreSQL checkpoint's worth of waiting each (about 0.1 s and
0.05 s on an idle 2-core machine, three times that under load), which used to stand in every
database test's setup and teardown. Here a test takes a database that is already there and
hands it back to be dropped, and the thread does both while tests run. Isolation is the same
as before: every test gets a database of its own, never used by another test, cloned from the
template migrated once per session; only the waiting moved.
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Callable

import psycopg

# How many clones wait ready: one for the next test, one more so a test that takes two
# (db_url and another fixture) does not wait.
AHEAD = 2
# Job priorities: stopping comes first (what is left is dropped by close()), then a clone a
# test may be waiting for, then drops.
_STOP, _CLONE, _DROP = 0, 1, 2


class ClonePool:
    def __init__(self, server_url: str, template: str, prefix: str) -> None:
        self._server = server_url
        self._template = template
        self._names = (f"{prefix}_{n}" for n in itertools.count())
        self._jobs: queue.PriorityQueue[tuple[int, int, str]] = queue.PriorityQueue()
        self._order = itertools.count()  # FIFO among jobs of one priority
        self._ready: queue.Queue[str | BaseException] = queue.Queue()
        self._pending_drops: set[str] = set()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="evq-test-clones", daemon=True)
        self._thread.start()
        for _ in range(AHEAD):
            self._put(_CLONE, "")

    def _put(self, kind: int, name: str) -> None:
        self._jobs.put((kind, next(self._order), name))

    def take(self, timeout: float = 60) -> str:
        """A database no test has used; another one starts cloning behind it."""
        self._put(_CLONE, "")
        got = self._ready.get(timeout=timeout)
        if isinstance(got, BaseException):
            raise RuntimeError("cloning a test database failed") from got
        return got

    def give_back(self, name: str) -> None:
        """Drop ``name`` (a database taken from this pool) when no test is waiting for a clone."""
        with self._lock:
            self._pending_drops.add(name)
        self._put(_DROP, name)

    def close(self) -> None:
        """Stop the thread, then drop every database of this pool that is still there: the
        ready ones and those whose drop had not run yet (a session leaves none behind)."""
        self._put(_STOP, "")
        self._thread.join(timeout=120)
        left = list(self._pending_drops)
        while True:
            try:
                got = self._ready.get_nowait()
            except queue.Empty:
                break
            if isinstance(got, str):
                left.append(got)
        for name in left:
            self._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def _admin(self, sql: str) -> None:
        with psycopg.connect(self._server, autocommit=True) as conn:
            conn.execute(sql)

    def _run(self) -> None:
        jobs: dict[int, Callable[[str], None]] = {_CLONE: self._clone, _DROP: self._drop}
        while True:
            kind, _, name = self._jobs.get()
            if kind == _STOP:
                return
            jobs[kind](name)

    def _clone(self, _: str) -> None:
        name = next(self._names)
        try:
            # PostgreSQL 15's default strategy (WAL_LOG): FILE_COPY's two checkpoints per clone
            # made the same tests 1.2-1.5x slower here (the checkpoints stall every connection).
            self._admin(f'CREATE DATABASE "{name}" TEMPLATE "{self._template}"')
        except BaseException as exc:  # handed to the test that waits, which fails with it
            self._ready.put(exc)
            return
        self._ready.put(name)

    def _drop(self, name: str) -> None:
        try:
            self._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        except psycopg.Error:
            return  # left in _pending_drops: close() tries again
        with self._lock:
            self._pending_drops.discard(name)
