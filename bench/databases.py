"""The benchmark's scratch databases on the server it is pointed at: one migrated template, a
clone per run, every one dropped at the end (it needs CREATE DATABASE, never touches evq's own)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg


def _with_database(url: str, name: str) -> str:
    info = psycopg.conninfo.conninfo_to_dict(url)
    info["dbname"] = name
    return psycopg.conninfo.make_conninfo(**info)


class Databases:
    """Scratch databases on the server: one migrated template, a clone per run."""

    def __init__(self, server_url: str):
        self.server_url = server_url
        self.prefix = f"evq_bench_{os.getpid()}"
        self.template = f"{self.prefix}_tpl"
        self._made: list[str] = []
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

    def drop(self, name: str) -> None:
        self._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        if name in self._made:
            self._made.remove(name)

    def drop_all(self) -> None:
        for name in reversed(list(self._made)):
            try:
                self.drop(name)
            except psycopg.Error:
                pass
