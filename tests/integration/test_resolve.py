"""An operator's close of an unknown row, in the real database: the transition, its
evidence, its guard, and two operators closing the same row at once."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import psycopg
import pytest

from evq.adapters.postgres.store import PostgresStore
from evq.worker.errors import InvalidRequest, NotFound, StateConflict
from evq.worker.resolution import Resolution
from tests.support import evidence_kinds, rows, step_row, unknown_steps, valid, wait_for_lock_waiters

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
T1 = datetime(2030, 1, 1, 15, 0, tzinfo=UTC)


def verdict(kind: str, note: str = "checked the provider log", **extra) -> Resolution:
    return Resolution.parse(kind, note, **extra)


async def resolve(store: PostgresStore, step_id: int, resolution: Resolution, actor: str = "alice"):
    return await store.resolve(step_id, resolution, actor=actor, default_max_attempts=3, now=T1)


def operator_evidence(url: str, step_id: int) -> list[dict]:
    return rows(url, "SELECT * FROM evidence WHERE step_id = %s AND kind = 'operator_resolved'", (step_id,))


async def test_accepted_closes_the_row_with_an_audit_record(store, db_url):
    [step] = await unknown_steps(store, now=T0)
    done = await resolve(
        store,
        step.id,
        verdict(
            "accepted",
            "found it in the provider's log",
            reason="found_in_provider_log",
            provider_message_id="q-123",
            evidence_url="https://logs.example.com/q-123",
        ),
    )
    assert done.to_status == "accepted" and done.resolved_at == T1
    row = step_row(db_url, step.id)
    assert row["status"] == "accepted" and row["closed_at"] == T1 and row["unknown_since"] is None
    assert row["reason"] == "operator" and row["provider_message_id"] == "q-123"
    [ev] = operator_evidence(db_url, step.id)
    assert ev["id"] == done.evidence_id and ev["actor"] == "alice" and ev["created_at"] == T1
    assert (ev["from_status"], ev["to_status"], ev["reason"]) == ("unknown", "accepted", "found_in_provider_log")
    assert ev["detail"]["note"] == "found it in the provider's log"
    assert ev["detail"]["reference"] == {
        "provider_message_id": "q-123",
        "evidence_url": "https://logs.example.com/q-123",
    }
    previous = ev["detail"]["previous"]
    assert previous["status"] == "unknown" and previous["reason"] == "ambiguous_response"
    assert previous["unknown_since"].startswith("2030-01-01T12:00:00")
    assert evidence_kinds(db_url, step.id) == ["attempt_started", "provider_response", "operator_resolved"]


async def test_rejected_closes_the_row(store, db_url):
    [step] = await unknown_steps(store, now=T0)
    await resolve(store, step.id, verdict("rejected", "not in the mailbox, bounced", reason="bounced"))
    row = step_row(db_url, step.id)
    assert row["status"] == "rejected" and row["closed_at"] == T1 and row["detail"] == "not in the mailbox, bounced"
    assert operator_evidence(db_url, step.id)[0]["reason"] == "bounced"


async def test_retry_goes_out_again_with_the_same_key_and_message_id(store, db_url):
    [step] = await unknown_steps(store, now=T0, max_attempts=1)  # its only attempt is spent
    done = await resolve(store, step.id, verdict("retry", "provider log shows nothing for this Message-ID"))
    assert done.to_status == "retryable" and done.max_attempts_before == 1 and done.max_attempts_after == 2
    row = step_row(db_url, step.id)
    assert row["status"] == "retryable" and row["closed_at"] is None and not row["maybe_delivered"]
    assert row["max_attempts"] == 2 and row["next_attempt_at"] == T1
    [ev] = operator_evidence(db_url, step.id)
    assert ev["detail"]["max_attempts_raised"] is True and ev["detail"]["max_attempts"] == 2
    [again] = await store.claim(owner="w2", providers=["smtp"], limit=5, lease_seconds=60, dedupe_windows={}, now=T1)
    assert again.id == step.id and again.attempt == 2
    assert again.message_id == step.message_id and again.idempotency_key == step.idempotency_key


async def test_retry_keeps_max_attempts_when_attempts_remain(store, db_url):
    [step] = await unknown_steps(store, now=T0)
    done = await resolve(store, step.id, verdict("retry", "verified not sent"))
    assert done.max_attempts_before is None and done.max_attempts_after is None
    assert operator_evidence(db_url, step.id)[0]["detail"]["max_attempts_raised"] is False


async def test_only_unknown_rows_are_resolved_and_a_refusal_writes_nothing(store, db_url):
    [step] = await unknown_steps(store, now=T0)
    pending = await store.enqueue(valid(), now=T0)
    with pytest.raises(StateConflict) as err:
        await resolve(store, pending.id, verdict("accepted"))
    assert err.value.code == "E_CONFLICT" and err.value.context["status"] == "pending"
    await resolve(store, step.id, verdict("rejected"))
    with pytest.raises(StateConflict, match="is rejected, not unknown"):
        await resolve(store, step.id, verdict("accepted"), actor="bob")
    assert len(operator_evidence(db_url, step.id)) == 1
    assert step_row(db_url, step.id)["status"] == "rejected"
    assert evidence_kinds(db_url, pending.id) == []
    with pytest.raises(NotFound):
        await resolve(store, 999_999, verdict("accepted"))


async def test_two_operators_at_once_one_wins_the_other_conflicts(store, db_url):
    [step] = await unknown_steps(store, now=T0)
    other = await PostgresStore.open(db_url, max_size=1)
    blocker = await psycopg.AsyncConnection.connect(db_url)
    try:
        # Hold the row so both closes are in flight together, then let them race for it.
        await blocker.execute("SELECT 1 FROM email_steps WHERE id = %s FOR UPDATE", (step.id,))
        alice = asyncio.create_task(resolve(store, step.id, verdict("accepted"), actor="alice"))
        bob = asyncio.create_task(resolve(other, step.id, verdict("rejected"), actor="bob"))
        await asyncio.to_thread(wait_for_lock_waiters, db_url, 2)
        await blocker.rollback()
        results = await asyncio.gather(alice, bob, return_exceptions=True)
    finally:
        await blocker.close()
        await other.close()
    won = [r for r in results if not isinstance(r, BaseException)]
    lost = [r for r in results if isinstance(r, BaseException)]
    assert len(won) == 1 and len(lost) == 1 and isinstance(lost[0], StateConflict)
    [ev] = operator_evidence(db_url, step.id)
    assert ev["to_status"] == str(won[0].to_status) == step_row(db_url, step.id)["status"]
    assert lost[0].context["status"] == ev["to_status"]


def test_resolution_validation_names_every_failing_field():
    with pytest.raises(InvalidRequest) as err:
        Resolution.parse("retry", "  ", reason="Not A Key", provider_message_id="x", evidence_url="ftp://x")
    fields = [e["field"] for e in err.value.errors]
    assert fields == ["--note", "--reason", "--provider-message-id", "--evidence-url"]
    ok = Resolution.parse("accepted", " seen ", provider_message_id=" q-1 ", evidence_url="https://x.example/a")
    assert ok.note == "seen" and ok.provider_message_id == "q-1"
