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


def test_the_queries_are_sent_without_their_comments_and_keep_their_text():
    from evq.adapters.postgres.queries import Q, _bare

    assert _bare("-- why\nSELECT 1 -- trailing\n\n  , '-- kept' AS a, \"x--y\"\nFROM t") == (
        "SELECT 1\n  , '-- kept' AS a, \"x--y\"\nFROM t"
    )
    assert _bare("SELECT 'it''s -- still text'") == "SELECT 'it''s -- still text'"
    # Dollar quoting and E'' strings are kept as written.
    for opaque in ("SELECT $$ -- x $$", "SELECT E'\\' -- x'"):
        assert _bare(opaque) == opaque
    assert not any(line.lstrip().startswith("--") for text in Q.values() for line in text.splitlines())
    # psycopg caches its parse of a query text only under 4 KB: the hot statements stay under.
    assert all(
        len(Q[name].encode()) < 4096 for name in ("step_claim", "step_record", "step_enqueue", "step_enqueue_many")
    )
