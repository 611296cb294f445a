"""The READ COMMITTED refusal names where the setting came from and the remedy for that source
(adapters/postgres/isolation.py); against a real database: tests/acceptance/test_isolation.py."""

from __future__ import annotations

import pytest

from evq.adapters.postgres.isolation import refusal


def _row(level: str, source: str | None = "database") -> dict:
    return {"level": level, "source": source, "role": "evq", "database": 'app"db'}


@pytest.mark.parametrize("level", ["read committed", "read uncommitted"])
def test_read_committed_and_what_postgresql_makes_of_read_uncommitted_run(level):
    assert refusal(_row(level)) is None


OWN = 'ALTER ROLE "evq" IN DATABASE "app""db" SET default_transaction_isolation = \'read committed\''


@pytest.mark.parametrize(
    ("source", "where", "hint"),
    [
        # The setting's own level is left alone: evq's role in this database outranks it, and
        # the application sharing the database keeps its default.
        ("configuration file", "postgresql.conf", OWN),
        ("database", 'the database ("app""db")', OWN),
        ("user", 'the role ("evq")', 'ALTER ROLE "evq" RESET default_transaction_isolation, or ' + OWN),
        (
            "database user",
            'the role in this database ("evq" in "app""db")',
            'ALTER ROLE "evq" IN DATABASE "app""db" RESET default_transaction_isolation',
        ),
        ("client", "the connection's options", "remove default_transaction_isolation from EVQ_DATABASE_URL's options="),
        ("session", "a SET on this connection", "a pooler in transaction mode passed on another client's SET"),
        (None, "the server", OWN),
    ],
)
def test_each_source_of_the_setting_gets_its_own_remedy(source, where, hint):
    refused = refusal(_row("repeatable read", source))
    assert refused is not None and refused.code == "E_INVALID_ARG"
    assert refused.message == (
        f"evq's transactions here start REPEATABLE READ (set by {where}); evq runs only under READ COMMITTED"
    )
    assert refused.hint is not None and refused.hint.startswith(hint)
    assert refused.context["fields"][0]["field"] == "default_transaction_isolation"
