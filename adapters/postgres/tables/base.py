"""What every table module of the model shares: the one ``metadata`` they register on, its
naming convention, and the column types and CHECK helper they build with. A module of its own
so that each group of tables (steps.py, keys.py, bookkeeping.py) imports it and none imports
another; adapters/postgres/schema.py imports them all.
"""

from __future__ import annotations

from sqlalchemy import MetaData, text
from sqlalchemy.dialects.postgresql import TIMESTAMP

# Every constraint and index the model leaves unnamed is named from its table and columns (a
# CHECK from its table and its own name), so each rendering names it the same and what the
# migrations build can be compared with the model name for name.
NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

metadata = MetaData(naming_convention=NAMING)


def one_of(column: str, values: tuple[str, ...]) -> str:
    """The CHECK condition that ``column`` holds one of ``values``: ``column IN ('a', 'b')``."""
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


# Every timestamp column is timestamptz, and a row's times default to the inserting transaction's clock.
TZ = TIMESTAMP(timezone=True)
NOW = text("now()")
