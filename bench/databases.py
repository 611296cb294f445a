"""The benchmark's scratch databases on the server it is pointed at: one migrated template, a
clone per run, every one dropped at the end (it needs CREATE DATABASE, never touches evq's own)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import psycopg


def _with_database(url: str, name: str) -> str:
    info = psycopg.conninfo.conninfo_to_dict(url)
    info["dbname"] = name
    return psycopg.conninfo.make_conninfo(**info)


# PostgreSQL 15's DROP DATABASE waits for an immediate checkpoint (the whole server's dirty
# buffers written: 0.1 s idle, 1.5 s and more on a loaded machine), and drops that wait together
# share one. A run's small scratch databases (a clone per drain, per pickup, per peer's drain)
# are dropped this many at once, between runs (never while one is measured), not one by one:
# a --quick run's thirty or so drops, a checkpoint each, became a handful of batches. A big one (scale, ops-pages, retention) is
# dropped as soon as it is done with (at_once), so its disk is back before the next fill.
DROP_BATCH = 8


class Databases:
    """Scratch databases on the server: one migrated template, a clone per run."""

    def __init__(self, server_url: str):
        self.server_url = server_url
        self.prefix = f"evq_bench_{os.getpid()}"
        self.template = f"{self.prefix}_tpl"
        self._made: list[str] = []
        self._done: list[str] = []  # done with, dropped with the next batch
        self._n = 0

    def _admin(self, sql: str) -> None:
        with psycopg.connect(self.server_url, autocommit=True, connect_timeout=10) as conn:
            conn.execute(sql)

    def create(self, template: str | None = None) -> str:
        self._n += 1
        name = f"{self.prefix}_{self._n}"
        self._admin(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else ""))
        self._made.append(name)
        return name

    def url(self, name: str) -> str:
        return _with_database(self.server_url, name)

    def migrated_template(self) -> None:
        from evq.adapters.postgres.database import upgrade

        self._admin(f'CREATE DATABASE "{self.template}"')
        self._made.append(self.template)
        upgrade(self.url(self.template))

    @contextmanager
    def fresh(self) -> Iterator[str]:
        """A clone of the migrated template for one run, dropped afterwards."""
        name = self.create(self.template)
        try:
            yield self.url(name)
        finally:
            self.drop(name)

    def drop(self, name: str, *, at_once: bool = False) -> None:
        """Drop ``name`` now (``at_once``) or with the next batch of DROP_BATCH; either way
        before this call returns if the batch is full, so no drop overlaps a measurement."""
        self._done.append(name)
        if at_once or len(self._done) >= DROP_BATCH:
            self._drop_done()

    def _drop_done(self, *, quiet: bool = False) -> None:
        batch, self._done = self._done, []
        with ThreadPoolExecutor(max_workers=max(1, len(batch))) as pool:
            errors = [e for e in pool.map(self._drop_one, batch) if e is not None]
        if errors and not quiet:
            raise errors[0]

    def _drop_one(self, name: str) -> psycopg.Error | None:
        try:
            self._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        except psycopg.Error as exc:
            return exc
        if name in self._made:
            self._made.remove(name)
        return None

    def drop_all(self) -> None:
        """Every database this run made, the template last (its clones are gone by then)."""
        self._done = [n for n in self._made if n != self.template and n not in self._done] + self._done
        self._drop_done(quiet=True)
        if self.template in self._made:
            self._done = [self.template]
            self._drop_done(quiet=True)
