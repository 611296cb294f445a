"""Migrations and the model cannot drift; the schema goes down and up cleanly."""

from __future__ import annotations

from typing import Any

import psycopg
from alembic import command

from evq.adapters.postgres.database import alembic_config, check_at_head, current_revision, head_revision, upgrade
from evq.worker.errors import SchemaMismatch
from tests.support import rows


def test_models_match_migrations(db_url):
    # `alembic check` raises if autogenerate would produce any operation.
    command.check(alembic_config(db_url))


def test_down_and_up_again(db_url):
    command.downgrade(alembic_config(db_url), "base")
    assert current_revision(db_url) is None
    # Down is everything evq made: no table, function or sequence of its own is left.
    assert _definitions(db_url) == []
    try:
        check_at_head(db_url)
    except SchemaMismatch as exc:
        assert "evq db upgrade" in exc.hint
    else:
        raise AssertionError("an empty database passed the head check")
    assert upgrade(db_url) == (None, head_revision())
    assert check_at_head(db_url) == head_revision()


# Each table's columns (name, type, not null, default), constraints and indexes, as PostgreSQL
# reads them back: what `alembic check` does not compare (CHECK constraints, index predicates,
# expressions and methods) included.
DEFINITIONS = """
SELECT c.relname AS "table", 'column' AS kind, a.attname AS name,
       format_type(a.atttypid, a.atttypmod) || CASE WHEN a.attnotnull THEN ' NOT NULL' ELSE '' END
       || coalesce(' DEFAULT ' || pg_get_expr(d.adbin, d.adrelid), '') AS definition
FROM pg_attribute a
JOIN pg_class c ON c.oid = a.attrelid
LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind IN ('r', 'p') AND NOT c.relispartition
  AND c.relname <> 'alembic_version' AND a.attnum > 0 AND NOT a.attisdropped
UNION ALL
SELECT c.relname, 'constraint', k.conname, pg_get_constraintdef(k.oid)
FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid
WHERE c.relnamespace = current_schema()::regnamespace AND NOT c.relispartition AND c.relname <> 'alembic_version'
UNION ALL
SELECT i.tablename, 'index', i.indexname, i.indexdef
FROM pg_indexes i JOIN pg_class c ON c.relname = i.tablename AND c.relnamespace = current_schema()::regnamespace
WHERE i.schemaname = current_schema() AND NOT c.relispartition AND i.tablename <> 'alembic_version'
UNION ALL
SELECT '', 'function', p.oid::regprocedure::text, '' FROM pg_proc p
WHERE p.pronamespace = current_schema()::regnamespace AND %(everything)s
UNION ALL
SELECT '', 'sequence', c.relname, '' FROM pg_class c
WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind = 'S' AND %(everything)s
ORDER BY 1, 2, 3
"""


def _definitions(url: str, *, everything: bool = True) -> list[dict[str, Any]]:
    return rows(url, DEFINITIONS, {"everything": everything})


def test_the_migrations_build_what_the_model_describes(db_url, empty_db_url):
    """A database migrated to head has exactly the tables, columns, constraints and indexes the
    model (adapters/postgres/schema.py) describes: the baseline's tables.sql is the model
    rendered (`python -m evq.migrations.render`), and every later revision must change the model
    with the schema. Compared with what `metadata.create_all` makes of the model."""
    from pathlib import Path

    from sqlalchemy import create_engine, pool

    import evq.migrations
    from evq.adapters.postgres.database import sqlalchemy_url
    from evq.adapters.postgres.schema import metadata

    search = Path(evq.migrations.__file__).parent / "baseline" / "search.sql"
    with psycopg.connect(empty_db_url) as conn:
        conn.execute(search.read_text())  # the function the search index is an expression of
    engine = create_engine(sqlalchemy_url(empty_db_url), poolclass=pool.NullPool)
    try:
        metadata.create_all(engine)
    finally:
        engine.dispose()
    migrated = _definitions(db_url, everything=False)
    assert {r["table"] for r in migrated} == set(metadata.tables)
    assert migrated == _definitions(empty_db_url, everything=False)


def test_a_key_says_its_approval_and_nothing_but_the_three_values_is_stored(db_url):
    """An API key's approval has no default (every writer says whether its sends wait for a
    person) and only always, policy and never are stored. Keys of a 0.2 database get theirs
    from their role: tests/integration/test_upgrade_from_0_2.py."""
    import psycopg
    import pytest

    with psycopg.connect(db_url) as conn:
        with pytest.raises(psycopg.errors.NotNullViolation):
            conn.execute(
                "INSERT INTO api_keys (name, role, key_id, secret_hash) VALUES ('x', 'agent', 'aaaaaaaaaaaa', 'x')"
            )
        conn.rollback()
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute(
                "INSERT INTO api_keys (name, role, key_id, secret_hash, approval) "
                "VALUES ('x', 'agent', 'aaaaaaaaaaaa', 'hmac-sha256$x', 'sometimes')"
            )
