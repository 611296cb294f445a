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


LEDGER_FUNCTIONS = (
    "evq_prune_batch(timestamptz, integer, text, uuid, integer)",
    "evq_grant_runtime(name)",
)


def test_0026_keeps_the_keys_of_the_steps_already_there_and_its_downgrade_gives_back_what_0025_had(
    db_url, empty_db_url
):
    """Migration 0026 on a database with steps: each key goes into the ledger as its enqueue would
    have written it (the agent's own digest for a step an approver corrected), so the first prune
    after the upgrade keeps what answers a repeat. Going down leaves the functions it edits as a
    database that never passed 0026 has them."""
    import psycopg

    from evq.adapters.postgres.enqueue import enqueue_own
    from tests.support import POLICY, request, rows, valid

    def definitions(url: str) -> dict[str, tuple]:
        with psycopg.connect(url) as conn:
            return {
                f: conn.execute(
                    "SELECT pg_get_functiondef(p.oid), p.proconfig, p.prosecdef, p.proacl::text "
                    "FROM pg_proc p WHERE p.oid = CAST(%s AS regprocedure)",
                    (f,),
                ).fetchone()
                for f in LEDGER_FUNCTIONS
            }

    at_head = definitions(db_url)
    command.downgrade(alembic_config(db_url), "0025_partition_drop_lock")
    command.upgrade(alembic_config(empty_db_url), "0025_partition_drop_lock")
    assert definitions(db_url) == definitions(empty_db_url)
    plain, corrected = request(run_id="old", step_id="plain"), request(run_id="old", step_id="fixed")
    with psycopg.connect(db_url) as conn:
        for i, (req, sent) in enumerate([(plain, None), (corrected, "b" * 64)], start=1):
            v = valid(**req)
            conn.execute(
                """
                WITH d AS (INSERT INTO decisions (run_id, step_id) VALUES (%(run)s, %(step)s) RETURNING id)
                INSERT INTO email_steps (run_id, step_id, decision_id, idempotency_key, message_id, provider,
                                         payload, payload_sha256, requested_sha256, status, attempts,
                                         first_attempt_at, created_at, closed_at)
                SELECT %(run)s, %(step)s, d.id, %(key)s, %(mid)s, 'smtp', %(payload)s::jsonb,
                       coalesce(%(sent)s, %(sha)s), CASE WHEN %(sent)s IS NOT NULL THEN %(sha)s END, 'accepted', 1,
                       now() - interval '2 days', now() - interval '2 days', now() - interval '2 days'
                FROM d
                """,
                {
                    "run": v.run_id,
                    "step": v.step_id,
                    "key": v.idempotency_key,
                    "mid": f"<old.{i}@example.org>",
                    "payload": v.payload_json,
                    "sha": v.payload_sha256,
                    "sent": sent,
                },
            )
    upgrade(db_url)
    assert definitions(db_url) == at_head
    ledger = rows(
        db_url,
        "SELECT step_id, encode(payload_sha256, 'hex') AS sha, pruned_at FROM step_keys ORDER BY step_id",
    )
    assert ledger == [
        {"step_id": "fixed", "sha": valid(**corrected).payload_sha256, "pruned_at": None},
        {"step_id": "plain", "sha": valid(**plain).payload_sha256, "pruned_at": None},
    ]
    with psycopg.connect(db_url) as conn:
        conn.execute("SELECT evq_prune_batch(now() - interval '1 day', 100, 'test', gen_random_uuid(), 1)")
    kept = rows(db_url, "SELECT step_id, status, encode(corrected_sha256, 'hex') AS sent FROM step_keys ORDER BY 1")
    assert kept == [
        {"step_id": "fixed", "status": "accepted", "sent": "b" * 64},
        {"step_id": "plain", "status": "accepted", "sent": None},
    ]
    for req in (plain, corrected):
        again = enqueue_own(db_url, req, policy=POLICY)
        assert (again.created, again.pruned) == (False, True)
    assert rows(db_url, "SELECT count(*) AS n FROM email_steps") == [{"n": 0}]
