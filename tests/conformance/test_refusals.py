"""Refused enqueues (worker/refusals.py) against the PostgreSQL store: recorded as
described, listed newest first with filters and paging, pruned by the cutoff a batch at a time."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from evq.worker.refusals import describe

T0 = datetime(2021, 3, 1, tzinfo=UTC)


def refusal(interface: str = "http", key: str | None = "agent-1", fields: tuple[str, ...] = ("to[0]", "subject")):
    errors = [{"field": f, "message": "bad"} for f in fields]
    return describe(interface, [{"run_id": "r", "step_id": "s", "to": ["a@b.example"]}], errors, key_name=key)


async def test_a_refusal_is_stored_as_described_and_listed_newest_first(store):
    first = await store.record_refusal(refusal(), now=T0)
    second = await store.record_refusal(refusal("cli", None, ("decision.model",)), now=T0 + timedelta(seconds=1))
    assert second > first
    rows, total = await store.list_refusals()
    assert [r["id"] for r in rows] == [second, first] and total == 2
    row = rows[1]
    assert (row["interface"], row["key_name"], row["dry_run"], row["requests"]) == ("http", "agent-1", False, 1)
    assert row["errors"] == [{"field": "to[0]", "message": "bad"}, {"field": "subject", "message": "bad"}]
    assert row["reasons"] == ["subject", "to"] and row["error_count"] == 2
    assert row["asked"] == [{"run_id": "r", "step_id": "s", "fields": ["run_id", "step_id", "to"], "recipients": 1}]
    assert len(row["request_sha256"]) == 64 and row["request_bytes"] > 0
    assert row["created_at"] == T0
    assert [r["id"] for r in (await store.list_refusals(key_name="agent-1"))[0]] == [first]
    assert [r["id"] for r in (await store.list_refusals(interface="cli"))[0]] == [second]
    assert [r["id"] for r in (await store.list_refusals(before_id=second - 1))[0]] == [first]
    # A page: offset skips, limit bounds, the total counts every refusal that matches.
    page, total = await store.list_refusals(limit=1)
    assert [r["id"] for r in page] == [second] and total == 2
    page, total = await store.list_refusals(limit=1, offset=1)
    assert [r["id"] for r in page] == [first] and total == 2
    assert await store.list_refusals(offset=2) == ([], 2)


async def test_refusals_are_pruned_by_the_cutoff_in_batches_and_counted_by_a_dry_run(store):
    for i in range(3):
        await store.record_refusal(refusal(), now=T0 + timedelta(seconds=i))
    kept = await store.record_refusal(refusal(), now=T0 + timedelta(days=2))
    cutoff = T0 + timedelta(days=1)
    assert await store.prune_refusals(cutoff=cutoff, limit=2, dry_run=True) == 3
    assert await store.prune_refusals(cutoff=cutoff, limit=2) == 2
    assert await store.prune_refusals(cutoff=cutoff, limit=2) == 1
    assert await store.prune_refusals(cutoff=cutoff, limit=2) == 0
    assert [r["id"] for r in (await store.list_refusals())[0]] == [kept]
