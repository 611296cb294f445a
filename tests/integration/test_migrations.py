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


def test_evidence_already_there_moves_into_its_partition_once(db_url):
    """Migration 0022 on a database with history: every row kept as it was, in the
    partition of its step, and no key event written a second time by the copy."""
    import psycopg

    command.downgrade(alembic_config(db_url), "0021_search_key_ids")
    with psycopg.connect(db_url) as conn:
        conn.execute(
            """
            INSERT INTO decisions (id, run_id, step_id) SELECT g, 'r', 's' || g FROM generate_series(1, 50) g;
            INSERT INTO email_steps (id, run_id, step_id, decision_id, idempotency_key, message_id, provider, payload,
                                     payload_sha256, status, closed_at, attempts, first_attempt_at)
            SELECT g, 'r', 's' || g, g, 'k' || g, '<m' || g || '@x>', 'smtp', '{}', repeat('a', 64), 'rejected',
                   now(), 1, now()
            FROM generate_series(1, 50) g;
            SELECT setval(pg_get_serial_sequence('email_steps', 'id'), 50);
            INSERT INTO evidence (step_id, run_id, attempt, kind, actor, from_status, to_status, lease_token)
            SELECT s.id, s.run_id, 1, 'provider_response', 'w', 'in_flight', 'rejected', gen_random_uuid()
            FROM email_steps s;
            """
        )
        before = conn.execute("SELECT id, step_id, kind, lease_token FROM evidence ORDER BY id").fetchall()
        events = conn.execute("SELECT count(*) FROM key_events").fetchone()[0]
    assert len(before) == 50
    upgrade(db_url)
    with psycopg.connect(db_url) as conn:
        after = conn.execute("SELECT id, step_id, kind, lease_token FROM evidence ORDER BY id").fetchall()
        placed = conn.execute("SELECT DISTINCT tableoid::regclass::text FROM evidence").fetchall()
        assert conn.execute("SELECT count(*) FROM key_events").fetchone()[0] == events
        # The sequence carried on: the next row's id follows the copied ones.
        conn.execute("INSERT INTO evidence (step_id, run_id, kind, actor) VALUES (1, 'r', 'delivery_event', 'webhook')")
        assert conn.execute("SELECT max(id) FROM evidence").fetchone()[0] == max(r[0] for r in before) + 1
        conn.rollback()
    assert after == before and placed == [("evidence_steps_0",)]


PARTITION_FUNCTIONS = (
    "evq_evidence_drop(text, timestamptz, text, uuid, integer)",
    "evq_evidence_seal(timestamptz, bigint)",
    "evq_evidence_unseal(text)",
    "evq_evidence_partitions_ahead(bigint)",
)


def _definitions(url: str) -> dict[str, tuple]:
    import psycopg

    with psycopg.connect(url) as conn:
        return {
            f: conn.execute(
                "SELECT pg_get_functiondef(p.oid), p.proconfig, p.prosecdef, p.proacl::text "
                "FROM pg_proc p WHERE p.oid = CAST(%s AS regprocedure)",
                (f,),
            ).fetchone()
            for f in PARTITION_FUNCTIONS
        }


def test_0025_edits_the_partition_functions_and_its_downgrade_gives_back_what_0024_had(db_url, empty_db_url):
    """0025 rewrites 0022's functions from their own text: going down must leave them as a
    database that never passed 0025 has them, owner, search path and grants included."""
    at_head = _definitions(db_url)
    assert "only under READ COMMITTED" in at_head[PARTITION_FUNCTIONS[0]][0]
    command.downgrade(alembic_config(db_url), "0024_guards_when")
    command.upgrade(alembic_config(empty_db_url), "0024_guards_when")
    assert _definitions(db_url) == _definitions(empty_db_url)
    command.upgrade(alembic_config(db_url), "head")
    assert _definitions(db_url) == at_head


def test_0030_makes_every_agent_key_wait_for_a_person_and_the_others_keep_the_policy(db_url):
    """Keys made before 0030 had no approval: an agent key becomes always (fail closed: an agent's
    send waits for a person), an operator's or admin's policy (what every send had). A key made
    after it must say (no default), and nothing but the three values is stored."""
    import psycopg
    import pytest

    command.downgrade(alembic_config(db_url), "0027_wire_keys")
    with psycopg.connect(db_url) as conn:
        conn.execute(
            """
            INSERT INTO api_keys (name, role, key_id, secret_hash)
            SELECT r || '-key', r, lpad(to_hex(n), 12, '0'), 'hmac-sha256$x'
            FROM unnest(ARRAY['agent', 'operator', 'admin']) WITH ORDINALITY AS t(r, n)
            """
        )
    upgrade(db_url)
    with psycopg.connect(db_url) as conn:
        kept = dict(conn.execute("SELECT name, approval FROM api_keys ORDER BY id").fetchall())
        assert kept == {"agent-key": "always", "operator-key": "policy", "admin-key": "policy"}
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
