"""Alembic environment. Revisions never import application code; this file may,
because autogenerate and `alembic check` compare the model (adapters/postgres/schema.py)
with what the revisions build."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine, pool

from evq.adapters.postgres.schema import metadata

config = context.config
url = config.get_main_option("sqlalchemy.url")


def _include_object(obj, name, type_, reflected, compare_to) -> bool:
    # Evidence's partitions are made at run time by evq_evidence_partitions_ahead
    # (migrations/baseline/partitions.sql), a range of step ids each: the model has the parent alone.
    if type_ == "table" and reflected and compare_to is None and name is not None:
        return not (name.startswith("evidence_steps_") or name == "evidence_overflow")
    return True


def run_migrations_offline() -> None:
    context.configure(
        url=url,
        target_metadata=metadata,
        literal_binds=True,
        compare_server_default=True,
        include_object=_include_object,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = create_engine(url, poolclass=pool.NullPool)
    with engine.connect() as connection:
        _run(connection)
    engine.dispose()


def _run(connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        compare_server_default=True,
        include_object=_include_object,
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
