"""The baseline's tables, rendered from the model: ``python -m evq.migrations.render`` writes
``migrations/baseline/tables.sql`` from ``adapters/postgres/schema.py``, which gathers the tables of
``adapters/postgres/tables/`` (one module per group) on one ``metadata``.

The model is the one source of the tables, their constraints and indexes; the baseline runs
the rendered text, so what it builds does not change when the model changes later (a revision
after the release does). Until 1.0 is released the baseline is changed in place: edit the
model, run this; ``test_the_migrations_build_what_the_model_describes``
(tests/integration/test_migrations.py) fails while they differ, before the release and after.
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy.dialects import postgresql
from sqlalchemy.schema import CreateIndex, CreateTable

from evq.adapters.postgres.schema import metadata

TABLES = Path(__file__).resolve().parent / "baseline" / "tables.sql"

# Names schema.py, the module a reader opens first: it says which module of tables/ holds each
# group. Part of the rendered text, so changing it changes tables.sql.
HEADER = """\
-- Generated from adapters/postgres/schema.py by `python -m evq.migrations.render`: do not edit
-- (docs/design.md, "Data model", says what each table holds; the model says why each index is
-- there). Every table, column, constraint and index of evq's schema, in dependency order; each
-- table's indexes follow it, by name. The search index needs search.sql's function first.
"""


def render() -> str:
    # Named parameters: the pyformat default doubles every % of a CHECK's LIKE pattern.
    dialect = postgresql.dialect(paramstyle="named")
    parts = [HEADER]
    for table in metadata.sorted_tables:
        parts.append(f"\n{str(CreateTable(table).compile(dialect=dialect)).strip()};\n")
        for index in sorted(table.indexes, key=lambda i: i.name or ""):
            parts.append(f"{str(CreateIndex(index).compile(dialect=dialect)).strip()};\n")
    # SQLAlchemy indents with tabs and leaves a space before each line break.
    return "\n".join(line.rstrip().replace("\t", "    ") for line in "".join(parts).split("\n"))


if __name__ == "__main__":
    TABLES.write_text(render())
