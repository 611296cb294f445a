"""Migrations and the model cannot drift; the schema goes down and up cleanly."""

from __future__ import annotations

from alembic import command

from evq.adapters.postgres.database import alembic_config, check_at_head, current_revision, head_revision, upgrade
from evq.worker.errors import SchemaMismatch


def test_models_match_migrations(db_url):
    # `alembic check` raises if autogenerate would produce any operation.
    command.check(alembic_config(db_url))


def test_down_and_up_again(db_url):
    command.downgrade(alembic_config(db_url), "base")
    assert current_revision(db_url) is None
    try:
        check_at_head(db_url)
    except SchemaMismatch as exc:
        assert "evq db upgrade" in exc.hint
    else:
        raise AssertionError("an empty database passed the head check")
    assert upgrade(db_url) == (None, head_revision())
    assert check_at_head(db_url) == head_revision()
