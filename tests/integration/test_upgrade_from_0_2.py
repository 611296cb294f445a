"""The one-time upgrade of an evq 0.2.0 database to 1.0 (migrations/from_0_2.py), run by
`evq admin db-upgrade` on 0.2.0's own schema (tests/data/schema-0.2.sql) filled with steps in
every state, their evidence and decisions, keys, prune log, rate limits and circuits."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest

from evq.ops.dev.smtp import DevSmtpServer
from tests.acceptance.conftest import Evq, smtp_env
from tests.support import evidence_kinds, rows, step_row
from tests.v0_2 import EARLIER, PEPPER, database_0_2, evidence, key_hash, step

# 0.2's tables and, for each, the columns 0.2 gave it (every one must arrive as it was).
TABLES_0_2 = {
    "decisions": "id",
    "email_steps": "id",
    "evidence": "id",
    "api_keys": "id",
    "prune_log": "id",
    "provider_rate_limits": "provider",
    "provider_circuits": "provider",
    "provider_circuit_events": "id",
}
LEASE = {name: uuid.uuid4() for name in ("in_flight", "retryable", "unknown", "window", "accepted", "late",
                                         "reconciled", "released", "rejected", "exhausted", "budget",
                                         "policy", "operator", "notice")}  # fmt: skip


def _attempt(conn: psycopg.Connection, id: int, lease: uuid.UUID, to: str, **answer: Any) -> None:
    """An attempt's evidence: its start, and the provider's answer if ``answer`` says one."""
    evidence(conn, id, "attempt_started", attempt=1, lease_token=lease, from_status="pending",
              to_status="in_flight")  # fmt: skip
    if answer:
        evidence(conn, id, "provider_response", attempt=1, lease_token=lease, from_status="in_flight",
                  to_status=to, latency_ms=12.5, **answer)  # fmt: skip


def fill(url: str) -> dict[str, dict[str, Any]]:
    """Steps in every state 0.2 had, each with the evidence that brought it there; keys, a prune
    log, rate limits and circuits. Returns the steps by name."""
    s: dict[str, dict[str, Any]] = {}
    attempted = {"attempts": 1, "first_attempt_at": EARLIER}
    with psycopg.connect(url) as conn:
        s["pending"] = step(conn, 101, "pending", "pending", next_attempt_at="now() - interval '1 minute'")
        # Claimed by a 0.2 worker that died mid-send: its lease ran out before the upgrade.
        s["in_flight"] = step(conn, 102, "in_flight", "in_flight", lease_owner="worker-0.2",
                               lease_token=LEASE["in_flight"], lease_expires_at="now() - interval '5 minutes'",
                               **attempted)  # fmt: skip
        _attempt(conn, 102, LEASE["in_flight"], "in_flight")
        # An ambiguous answer the provider dedupes: retried under the same key until its window closes.
        s["retryable"] = step(conn, 103, "retryable", "retryable", provider="http", reason="ambiguous_deduped",
                               maybe_delivered=True, dedupe_until="now() + interval '1 hour'",
                               next_attempt_at="now() + interval '1 day'", uncharged_attempts=1,
                               retry_from="now() - interval '1 day'", max_attempts=5, **attempted)  # fmt: skip
        _attempt(conn, 103, LEASE["retryable"], "retryable", outcome="retryable", reason="ambiguous_deduped")
        s["unknown"] = step(conn, 104, "unknown", "unknown", reason="lease_expired", detail="no answer",
                             unknown_since=EARLIER, reconcile_after="now() + interval '1 hour'",
                             reconcile_checks=2, **attempted)  # fmt: skip
        _attempt(conn, 104, LEASE["unknown"], "in_flight")
        evidence(conn, 104, "lease_expired", attempt=1, from_status="in_flight", to_status="unknown",
                  reason="lease_expired", detail='{"lease_owner": "worker-0.2"}')  # fmt: skip
        s["window"] = step(conn, 105, "window", "unknown", reason="dedupe_window_closed", maybe_delivered=True,
                            unknown_since=EARLIER, **attempted)  # fmt: skip
        _attempt(conn, 105, LEASE["window"], "retryable", outcome="retryable", reason="ambiguous_deduped")
        evidence(conn, 105, "window_closed", from_status="retryable", to_status="unknown",
                  reason="dedupe_window_closed")  # fmt: skip
        closed = {"closed_at": EARLIER, **attempted}
        s["accepted"] = step(conn, 106, "accepted", "accepted", reason="provider_accepted",
                              provider_message_id="<pm-106@provider>", notify="ops@example.org",
                              **closed)  # fmt: skip
        _attempt(conn, 106, LEASE["accepted"], "accepted", outcome="accepted", reason="provider_accepted",
                 provider_message_id="<pm-106@provider>")  # fmt: skip
        s["late"] = step(conn, 107, "late", "accepted", reason="late_answer", provider_message_id="<pm-107@p>",
                          **closed)  # fmt: skip
        _attempt(conn, 107, LEASE["late"], "in_flight")
        evidence(conn, 107, "lease_expired", attempt=1, from_status="in_flight", to_status="unknown",
                  reason="lease_expired")  # fmt: skip
        evidence(conn, 107, "late_response", attempt=1, lease_token=LEASE["late"], from_status="unknown",
                  to_status="accepted", outcome="accepted", reason="late_answer",
                  provider_message_id="<pm-107@p>")  # fmt: skip
        s["reconciled"] = step(conn, 108, "reconciled", "accepted", reason="reconciled", reconcile_checks=1,
                                **closed)  # fmt: skip
        _attempt(conn, 108, LEASE["reconciled"], "unknown", outcome="unknown", reason="ambiguous_response")
        evidence(conn, 108, "reconciled", from_status="unknown", to_status="accepted", reason="reconciled")
        # Claimed, then handed back at a 0.2 worker's shutdown before its adapter was called.
        s["released"] = step(conn, 109, "released", "pending", reason="released")
        _attempt(conn, 109, LEASE["released"], "in_flight")
        evidence(conn, 109, "attempt_released", attempt=1, lease_token=LEASE["released"],
                  from_status="in_flight", to_status="pending", reason="released")  # fmt: skip
        # Rejected, by each reason 0.2 rejects for.
        for id, name, reason in (
            (110, "rejected", "provider_rejected"),
            (111, "exhausted", "attempts_exhausted"),
            (112, "budget", "retry_budget_exhausted"),
            (113, "policy", "policy_refused"),
        ):
            s[name] = step(conn, id, name, "rejected", reason=reason, detail=f"550 {reason}",
                            notify="ops@example.org", **closed)  # fmt: skip
            _attempt(conn, id, LEASE[name], "rejected", outcome="rejected", reason=reason)
        s["operator"] = step(conn, 114, "operator", "rejected", reason="operator", detail="not sent, checked",
                              **closed)  # fmt: skip
        _attempt(conn, 114, LEASE["operator"], "in_flight")
        evidence(conn, 114, "operator_resolved", from_status="unknown", to_status="rejected", reason="operator",
                  actor="alice", detail='{"note": "not sent, checked"}')  # fmt: skip
        # The failure notice the rejection sent to its notify address: a step of its own.
        s["notice"] = step(conn, 115, "notice", "accepted", notice_of=110, reason="provider_accepted",
                            **closed)  # fmt: skip
        evidence(conn, 110, "notice_enqueued", detail='{"notice": 115}')
        _attempt(conn, 115, LEASE["notice"], "accepted", outcome="accepted", reason="provider_accepted")
        # Ids handed out past the last committed one (a rolled-back enqueue): 1.0 carries on after them.
        conn.execute("SELECT setval('email_steps_id_seq', 120), setval('decisions_id_seq', 120)")
        conn.execute("SELECT setval('evidence_id_seq', (SELECT max(id) + 5 FROM evidence))")
        # Three steps pruned under 0.2: their keys went with them.
        conn.execute(
            "INSERT INTO prune_log (run, batch, actor, cutoff, steps, evidence, decisions, first_step_id, "
            f"last_step_id, created_at) VALUES (gen_random_uuid(), 1, 'cron', {EARLIER}, 3, 6, 3, 1, 3, {EARLIER})"
        )
        conn.execute(f"INSERT INTO provider_rate_limits VALUES ('smtp', 3.5, {EARLIER}, NULL)")
        conn.execute(
            "INSERT INTO provider_circuits (provider, state, reason, detail, opened_at, probe_at, probes) "
            f"VALUES ('http', 'open', 'connection_refused', 'refused', {EARLIER}, now() + interval '1 hour', 2)"
        )
        conn.execute(
            "INSERT INTO provider_circuit_events (provider, from_state, to_state, reason, actor, probe_in) "
            "VALUES ('http', 'closed', 'open', 'connection_refused', 'worker-0.2', 30)"
        )
    return s


def _columns(url: str) -> dict[str, list[str]]:
    """The columns 0.2 gave each of its tables."""
    return {
        t: [
            r["column_name"]
            for r in rows(
                url,
                "SELECT column_name FROM information_schema.columns WHERE table_schema = 'public' "
                "AND table_name = %s ORDER BY ordinal_position",
                (t,),
            )
        ]
        for t in TABLES_0_2
    }


def _snapshot(
    url: str, columns: dict[str, list[str]], read: dict[str, str] | None = None
) -> dict[str, list[dict[str, Any]]]:
    """Every row of 0.2's tables, by the columns 0.2 gave them; ``read``: where 1.0 shows a table's rows
    (a step as it is now, with the attempt its queue row holds: steps_now)."""
    read = read or {}
    return {
        t: rows(url, f"SELECT {', '.join(c)} FROM {read.get(t, t)} ORDER BY {TABLES_0_2[t]}")
        for t, c in columns.items()
    }


def _keys(url: str) -> dict[str, str]:
    """Four keys a 0.2 admin made: HMACs under the pepper, one of them revoked, one still in the
    scrypt form a key made before 0.2's HMACs kept until its first use, and an agent's."""
    from evq.worker.keys import generate, scrypt_hash

    made = {name: generate() for name in ("alice", "bob", "carol", "dave")}
    with psycopg.connect(url) as conn:
        for name, role, stored, revoked in (
            ("alice", "admin", key_hash(made["alice"].secret), False),
            ("bob", "operator", key_hash(made["bob"].secret), True),
            ("carol", "operator", scrypt_hash(made["carol"].secret), False),
            ("dave", "agent", key_hash(made["dave"].secret), False),
        ):
            conn.execute(
                "INSERT INTO api_keys (name, role, key_id, secret_hash, created_by, revoked_at, revoked_by, "
                "session_generation) VALUES (%s, %s, %s, %s, 'bootstrap', "
                "CASE WHEN %s THEN now() END, CASE WHEN %s THEN 'alice' END, 3)",
                (name, role, made[name].key_id, stored, revoked, revoked),
            )
    return {name: key.text for name, key in made.items()}


def test_a_filled_0_2_database_is_upgraded_once_and_its_pending_sends_go_exactly_once(roles):
    r = roles
    database_0_2(r.owner_url)
    with psycopg.connect(r.owner_url) as conn:  # what `evq db upgrade --runtime-role` did under 0.2
        conn.execute("SELECT evq_grant_runtime(%s)", (r.app,))
    steps = fill(r.owner_url)
    keys = _keys(r.owner_url)
    columns = _columns(r.owner_url)
    before = _snapshot(r.owner_url, columns)
    [(last_step_id,)] = [tuple(x.values()) for x in rows(r.owner_url, "SELECT last_value FROM email_steps_id_seq")]

    owner = Evq(r.owner_url)
    assert owner.json("admin", "db-version", expect=5)["error"]["context"]["current"] == "0012_step_guard"
    done = owner.json("admin", "db-upgrade")["data"]
    assert (done["revision_before"], done["revision"], done["changed"]) == ("0012_step_guard", "1000_baseline", True)
    assert done["runtime_roles"] == [r.app] and done["from_0_2"]["runtime_roles"] == [r.app]
    copied = done["from_0_2"]["copied"]
    assert copied == {
        "decisions": 15, "email_steps": 15, "step_queue": 4, "key_ledger": 15, "evidence": len(before["evidence"]),
        "api_keys": 4,
        "api_key_pepper": 1, "prune_log": 1, "provider_rate_limits": 1, "provider_circuits": 1,
        "provider_circuit_events": 1,
    }  # fmt: skip
    # What the upgrade cannot know: 0.2 kept no key ledger, and says so.
    assert done["from_0_2"]["pruned_steps_without_keys"] == 3

    # Every row where it was, every column as it was.
    assert _snapshot(r.admin_url, columns, {"email_steps": "steps_now"}) == before
    assert rows(r.admin_url, "SELECT nspname FROM pg_namespace WHERE nspname = 'evq_0_2'") == []
    # What 1.0 added to a step, as its enqueue would have left a step of 0.2's kind.
    assert rows(
        r.admin_url,
        "SELECT DISTINCT priority, send_at, held_since, hold_expires_at, hold, requested_sha256, content_redacted_at "
        "FROM email_steps",
    ) == [dict.fromkeys(["priority"], 0) | dict.fromkeys(
        ["send_at", "held_since", "hold_expires_at", "hold", "requested_sha256", "content_redacted_at"])]  # fmt: skip
    # The key ledger, rebuilt from the steps: each key once, with the request's digest.
    ledger = rows(
        r.admin_url,
        "SELECT id, idempotency_key AS key, encode(payload_sha256, 'hex') AS sha, pruned_at FROM step_keys ORDER BY id",
    )
    assert ledger == [{"id": x["id"], "key": x["key"], "sha": x["sha"], "pruned_at": None} for x in steps.values()]
    # Each step's history in its step's partition, none in the overflow, and no key event for a
    # copied row (the feed starts at the upgrade).
    assert rows(r.admin_url, "SELECT count(*) AS n FROM evidence_overflow") == [{"n": 0}]
    assert rows(r.admin_url, "SELECT DISTINCT tableoid::regclass::text AS p FROM evidence") == [
        {"p": "evidence_steps_0"}
    ]
    assert rows(r.admin_url, "SELECT count(*) AS n FROM key_events") == [{"n": 0}]
    # 0.2's pepper, and the wire keys of every step 0.2 made kept in the form 0.2 sent them.
    [pepper] = rows(r.admin_url, "SELECT pepper, wire_keys_from FROM api_key_pepper")
    assert (bytes(pepper["pepper"]), pepper["wire_keys_from"]) == (PEPPER, last_step_id + 1)
    assert rows(r.admin_url, "SELECT last_value FROM email_steps_id_seq") == [{"last_value": last_step_id}]

    # The runtime role 0.2 granted has 1.0's privileges, on its new tables and functions too.
    grants = rows(
        r.admin_url,
        """
        SELECT has_table_privilege(%(r)s, 'evidence', 'INSERT') AS evidence_insert,
               has_table_privilege(%(r)s, 'evidence', 'UPDATE') AS evidence_update,
               has_table_privilege(%(r)s, 'email_steps', 'DELETE') AS steps_delete,
               has_table_privilege(%(r)s, 'step_keys', 'SELECT') AS ledger_select,
               has_table_privilege(%(r)s, 'step_keys', 'UPDATE') AS ledger_update,
               has_table_privilege(%(r)s, 'api_key_pepper', 'UPDATE') AS pepper_update,
               has_function_privilege(%(r)s, 'evq_evidence_partitions_ahead(bigint)', 'EXECUTE') AS partitions
        """,
        {"r": r.app},
    )
    assert grants == [
        {"evidence_insert": True, "evidence_update": False, "steps_delete": False, "ledger_select": True,
         "ledger_update": False, "pepper_update": False, "partitions": True}
    ]  # fmt: skip

    # The worker, as the runtime role: each pending step goes out once, through a real SMTP
    # server; the step a dead 0.2 worker held is rescued as unknown (it may have been sent),
    # never sent again; the rest wait as they were.
    with DevSmtpServer() as smtp:
        env = smtp_env(smtp)
        for _ in range(2):
            ran = Evq(r.app_url).run("worker", "run", "--drain", **env)
            assert ran.returncode == 0, ran.stderr[-3000:]
        assert smtp.by_message_id() == {steps["pending"]["message_id"]: 1, steps["released"]["message_id"]: 1}
    for name in ("pending", "released"):
        sent = step_row(r.admin_url, steps[name]["id"])
        assert (sent["status"], sent["attempts"]) == ("accepted", 1), sent
    rescued = step_row(r.admin_url, steps["in_flight"]["id"])
    assert (rescued["status"], rescued["reason"], rescued["attempts"]) == ("unknown", "lease_expired", 1), rescued
    assert evidence_kinds(r.admin_url, steps["in_flight"]["id"]) == ["attempt_started", "lease_expired"]
    # The feed's trigger is on again after the copy: the rescue is the key feed's first event.
    assert rows(r.admin_url, "SELECT step, kind FROM key_events") == [
        {"step": steps["in_flight"]["id"], "kind": "unknown"}
    ]
    for name in ("retryable", "unknown", "accepted", "rejected", "operator", "notice"):
        now = step_row(r.admin_url, steps[name]["id"])
        was = next(x for x in before["email_steps"] if x["id"] == steps[name]["id"])
        assert {k: now[k] for k in was} == was, name

    # Keys made under 0.2 still authenticate where a key is asked for (a write: reading on the
    # command line needs none): the scrypt one is rehashed at its first use; the revoked one is
    # refused. New steps carry on from 0.2's ids, and take the keyed wire key.
    enqueue = ("steps", "enqueue", "--file", "-")
    request = '{"run_id": "after", "step_id": "one", "to": ["x@example.com"], "from": "agent@example.org", '
    request += '"subject": "s", "text": "t", "intent": "i", "decision": {"model": "m", "tool": "t"}}'
    refused = Evq(r.app_url, api_key=keys["bob"]).json(*enqueue, input=request, expect=4)["error"]
    assert refused["code"] == "E_AUTH_FAILED" and "revoked" in refused["message"], refused
    made = Evq(r.app_url, api_key=keys["alice"]).json(*enqueue, input=request)["data"]
    assert made["id"] == last_step_id + 1 >= pepper["wire_keys_from"]
    window = str(steps["window"]["id"])
    resolved = Evq(r.app_url, api_key=keys["carol"]).json("steps", "resolve", window, "--as", "rejected", "--note", "n")
    assert resolved["data"]["succeeded"] == 1, resolved
    assert rows(r.admin_url, "SELECT secret_hash LIKE 'hmac-sha256$%%' AS hmac FROM api_keys WHERE name = 'carol'") == [
        {"hmac": True}
    ]
    # 0.2 had no per-key approval: the agent's key now waits for a person, the others keep the policy.
    approvals = rows(r.admin_url, "SELECT name, approval FROM api_keys ORDER BY name")
    assert approvals == [
        {"name": "alice", "approval": "policy"},
        {"name": "bob", "approval": "policy"},
        {"name": "carol", "approval": "policy"},
        {"name": "dave", "approval": "always"},
    ]


def test_a_database_at_a_development_revision_is_refused_and_left_as_it_was(empty_db_url):
    """0001 to 0027 (but 0.2.0's 0012) were never released: 1.0 has no path from one, says so,
    and changes nothing, whichever way it is asked."""
    from evq.adapters.postgres.database import _upgrade_from_0_2
    from evq.worker.errors import SchemaMismatch

    url = empty_db_url
    database_0_2(url, revision="0017_delivery_events")
    fill(url)
    columns = _columns(url)
    before = _catalog(url), _snapshot(url, columns)
    evq = Evq(url)
    for args in (("admin", "db-upgrade"), ("admin", "db-upgrade", "--dry-run"), ("admin", "db-version")):
        error = evq.json(*args, expect=5)["error"]
        assert error["code"] == "E_SCHEMA_MISMATCH", (args, error)
        assert "0017_delivery_events" in error["message"] and "0012_step_guard" in error["message"], (args, error)
    worker = evq.json("worker", "run", "--drain", "--adapter", "null", expect=5)["error"]
    assert "development version" in worker["message"], worker
    # The copy checks the revision again under its lock, in its own transaction.
    with pytest.raises(SchemaMismatch, match="development version"):
        _upgrade_from_0_2(url)
    assert (_catalog(url), _snapshot(url, columns)) == before


def test_an_upgrade_that_fails_half_way_leaves_the_0_2_database_as_it_was(empty_db_url):
    """One transaction: a failure after 0.2's tables were moved aside and the baseline begun
    (here a table of the operator's own named as one the baseline makes) rolls all of it back."""
    url = empty_db_url
    database_0_2(url)
    fill(url)
    with psycopg.connect(url) as conn:
        conn.execute("CREATE TABLE step_keys (note text)")
    columns = _columns(url)
    before = _catalog(url), _snapshot(url, columns)
    error = Evq(url).json("admin", "db-upgrade", expect=1)["error"]
    assert error["code"] == "E_INTERNAL" and "DuplicateTable" in error["message"], error
    assert (_catalog(url), _snapshot(url, columns)) == before
    assert rows(url, "SELECT version_num FROM alembic_version") == [{"version_num": "0012_step_guard"}]


def _catalog(url: str) -> list[dict[str, Any]]:
    """Every relation, function and trigger in the database's schemas, with its schema."""
    return rows(
        url,
        """
        SELECT n.nspname AS schema, c.relname AS name, c.relkind::text AS kind FROM pg_class c
        JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname NOT IN ('pg_catalog', 'information_schema')
          AND n.nspname NOT LIKE 'pg_toast%%'
        UNION ALL
        SELECT n.nspname, p.oid::regprocedure::text, 'function' FROM pg_proc p
        JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname NOT IN ('pg_catalog', 'information_schema')
        UNION ALL
        SELECT 'trigger', t.tgname || ' ON ' || t.tgrelid::regclass::text, md5(pg_get_triggerdef(t.oid))
        FROM pg_trigger t WHERE NOT t.tgisinternal
        ORDER BY 1, 2, 3
        """,
    ) + rows(url, "SELECT version_num FROM alembic_version")
