"""PostgresStore is composed of one mixin per port (adapters/postgres/store/); no method
may be defined in two of them, where the method resolution order would silently pick one."""

from __future__ import annotations

import itertools

from evq.adapters.postgres.store import PostgresBase, PostgresStore


def _own(cls: type) -> set[str]:
    return {name for name, value in vars(cls).items() if callable(value) or isinstance(value, classmethod)}


def test_each_store_method_lives_in_one_part():
    parts = [c for c in PostgresStore.__mro__[1:] if c not in (PostgresBase, object)]
    assert len(parts) >= 7 and all(issubclass(c, PostgresBase) for c in parts)
    for a, b in itertools.combinations([PostgresBase, *parts], 2):
        assert not (_own(a) & _own(b) - {"__init__"}), (a.__name__, b.__name__, _own(a) & _own(b))
    assert not _own(PostgresStore), "the composed store adds nothing of its own"
