"""Delivery events through the real PostgreSQL store (issue 16, part A): a lost reply settled by a
webhook event with its evidence chain in `runs show`, duplicates (also concurrent ones) stored
once, unmatched events kept, closed steps only gaining delivery state, the key digest matched
through its expression index for any key text, and all of it as the runtime role."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import psycopg
from prometheus_client import REGISTRY

from evq.adapters.postgres.store import PostgresStore
from evq.ops.app import service
from evq.ops.app.service import Caller
from evq.worker.delivery import DeliveryEvent, key_tag
from evq.worker.outcomes import Accepted, Rejected
from tests.conformance.helpers import claim, settle
from tests.database_roles import migrated
from tests.support import evidence_kinds, rows, step_row, unknown_steps, valid, wait_until

READER = Caller(None, trusted_reader=True)
WHEN = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)

# The steps here are smtp ones, as if sent through the relay whose webhook reports them.
RELAYED = ("smtp",)


def delivered(event_id: str, **kw) -> DeliveryEvent:
    return DeliveryEvent(provider="resend", event_id=event_id, type=kw.pop("type", "delivered"), **kw)


def counted(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_a_webhook_settles_a_lost_reply_and_runs_show_has_the_chain(store, db_url):
    before = (
        counted("evq_delivery_events_total", provider="resend", type="delivered"),
        counted("evq_delivery_settled_total", provider="resend"),
        counted("evq_delivery_events_unmatched_total", provider="resend"),
    )
    [lost] = await unknown_steps(store, run_id="run-lost")
    row = step_row(db_url, lost.id)
    tag = key_tag(row["idempotency_key"], row["message_id"])
    event = delivered("evt-1", key_digest=tag, provider_message_id="re_9", occurred_at=WHEN)
    reply = await service.receive_deliveries(store, "resend", [event], RELAYED)
    assert reply.data == [
        {"event_id": "evt-1", "type": "delivered", "matched": True, "step": lost.id, "duplicate": False, "closed": True}
    ]
    row = step_row(db_url, lost.id)
    assert (row["status"], row["reason"], row["provider_message_id"]) == ("accepted", "webhook", "re_9")
    assert evidence_kinds(db_url, lost.id)[-1] == "delivery_event"
    [ev] = rows(db_url, "SELECT * FROM evidence WHERE step_id = %s AND kind = 'delivery_event'", (lost.id,))
    assert (ev["from_status"], ev["to_status"], ev["actor"]) == ("unknown", "accepted", "webhook:resend")
    # No feed event: a close to accepted writes none, as the reconciler's does.
    assert rows(db_url, "SELECT kind FROM key_events WHERE step = %s", (lost.id,)) == [{"kind": "unknown"}]

    # The same event again: stored once, nothing changes.
    again = await service.receive_deliveries(store, "resend", [event], RELAYED)
    assert again.data[0]["duplicate"] and not again.data[0]["closed"] and again.meta["duplicates"] == 1
    assert rows(db_url, "SELECT count(*) AS n FROM delivery_events") == [{"n": 1}]
    assert evidence_kinds(db_url, lost.id).count("delivery_event") == 1
    # Counted once (the duplicate is not), settled once, matched.
    assert (
        counted("evq_delivery_events_total", provider="resend", type="delivered"),
        counted("evq_delivery_settled_total", provider="resend"),
        counted("evq_delivery_events_unmatched_total", provider="resend"),
    ) == (before[0] + 1, before[1] + 1, before[2])

    run = (await service.show_run(store, READER, "run-lost", unresolvable=())).data
    assert run["steps"][0]["delivery"] == {"state": "delivered", "at": WHEN, "events": 1}
    trace = [e["kind"] for e in run["events"]]
    assert trace[-1] == "delivery_event" and "provider_response" in trace
    shown = (await service.show_step(store, READER, lost.id, unresolvable=())).data
    assert shown["step"]["delivery"]["state"] == "delivered"
    assert [d["event_id"] for d in shown["deliveries"]] == ["evt-1"]
    # The held queue's read of a page: show_step of each (no events list), a missing id left out.
    [many] = (await service.show_steps(store, READER, [10**12, lost.id], unresolvable=())).data
    assert many.keys() == {"step", "decision", "evidence"} and many["step"]["delivery"]["state"] == "delivered"
    assert (many["decision"], many["evidence"]) == (shown["decision"], shown["evidence"])
    ageless = lambda step: {k: v for k, v in step.items() if k != "age_seconds"}  # noqa: E731
    assert ageless(many["step"]) == ageless(shown["step"])


async def test_unmatched_events_are_kept_and_listed_for_an_operator(store):
    reply = await service.receive_deliveries(
        store,
        "resend",
        [
            delivered("evt-a", type="bounced_hard", message_id="<nobody@example.org>", recipient="x@example.org"),
            delivered("evt-b", key_digest="f" * 64),
        ],
        RELAYED,
    )
    assert [d["matched"] for d in reply.data] == [False, False] and reply.meta["unmatched"] == 2
    listed = await service.list_deliveries(store, READER, unmatched=True, limit=1)
    assert [d["event_id"] for d in listed.data] == ["evt-b"]
    older = await service.list_deliveries(store, READER, unmatched=True, since=listed.meta["next_cursor"])
    assert [(d["event_id"], d["step"], d["recipient"]) for d in older.data] == [("evt-a", None, "x@example.org")]


async def test_closed_steps_keep_their_state_and_gain_delivery_state(store, db_url):
    ok = await store.enqueue(valid(run_id="run-c"))
    refused = await store.enqueue(valid(run_id="run-c"))
    by_id = {c.id: c for c in await claim(store, now=None)}
    await store.record([settle(by_id[ok.id], Accepted("q1")), settle(by_id[refused.id], Rejected("550"))], actor="w")
    before = {i: step_row(db_url, i) for i in (ok.id, refused.id)}
    timed = counted("evq_accepted_to_delivered_seconds_count", provider="resend")
    for i in (ok.id, refused.id):
        mid = before[i]["message_id"]
        await service.receive_deliveries(
            store, "resend", [delivered(f"d-{i}", message_id=mid, occurred_at=WHEN)], RELAYED
        )
    for i in (ok.id, refused.id):
        assert step_row(db_url, i) == before[i]
    # Only the accepted step's delivery is timed from its acceptance.
    assert counted("evq_accepted_to_delivered_seconds_count", provider="resend") == timed + 1
    listed = (await service.list_steps(store, READER, filters={"run_id": "run-c"}, unresolvable=())).data
    assert {s["id"]: s["delivery"]["state"] for s in listed} == {ok.id: "delivered", refused.id: "delivered"}


async def test_concurrent_duplicate_events_insert_one_row(store, db_url):
    [lost] = await unknown_steps(store)
    event = delivered("evt-race", message_id=step_row(db_url, lost.id)["message_id"])
    other = await PostgresStore.open(db_url, max_size=1)
    try:
        async with store.transaction("first"):
            first = await store.delivery_record(event, step_providers=RELAYED, actor="webhook:resend")
            # The second arrives while the first is not committed: it waits on the unique index.
            second = asyncio.create_task(other.delivery_record(event, step_providers=RELAYED, actor="webhook:resend"))
            await asyncio.to_thread(
                wait_until,
                lambda: rows(
                    db_url,
                    "SELECT 1 FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'",
                ),
                what="the second insert waiting for the first",
            )
        late = await second
    finally:
        await other.close()
    assert (first.duplicate, first.closed) == (False, True)
    assert (late.duplicate, late.closed, late.id, late.step) == (True, False, first.id, lost.id)
    assert rows(db_url, "SELECT count(*) AS n FROM delivery_events") == [{"n": 1}]
    assert evidence_kinds(db_url, lost.id).count("delivery_event") == 1


async def test_the_key_digest_matches_any_key_text_through_its_index(store, db_url):
    # Backslashes would be escaped by text::bytea; non-ASCII must hash as its UTF-8 bytes.
    keys = ["run\\step\\1", "ünïcode-clé-🙂", "a" * 200]
    made = [await store.enqueue(valid(idempotency_key=k)) for k in keys]
    for m, k in zip(made, keys, strict=True):
        done = await store.delivery_record(
            delivered(f"k-{m.id}", key_digest=key_tag(k, m.message_id)), step_providers=RELAYED, actor="w"
        )
        assert done.step == m.id
    with psycopg.connect(db_url) as conn:
        conn.execute("SET enable_seqscan = off")
        plan = conn.execute(
            "EXPLAIN SELECT id FROM step_keys"
            " WHERE sha256(decode(replace(idempotency_key, '\\', '\\\\'), 'escape')) = %s AND pruned_at IS NULL",
            (bytes(32),),
        ).fetchall()
    assert "ix_step_keys_key_sha256" in "\n".join(r[0] for r in plan)


async def test_the_runtime_role_records_and_reads_delivery_events(roles):
    migrated(roles)
    app = await PostgresStore.open(roles.app_url, max_size=2)
    try:
        [lost] = await unknown_steps(app)
        row = rows(roles.admin_url, "SELECT idempotency_key, message_id FROM steps_now WHERE id = %s", (lost.id,))[0]
        done = await app.delivery_record(
            delivered("rt-1", key_digest=key_tag(row["idempotency_key"], row["message_id"])),
            step_providers=RELAYED,
            actor="w",
        )
        assert done.closed and (await app.delivery_states([lost.id]))[lost.id]["state"] == "delivered"
        assert [d["event_id"] for d in (await app.delivery_events(step=lost.id))[0]] == ["rt-1"]
    finally:
        await app.close()
    # Append-only for the runtime role: it may not rewrite or delete an event.
    with psycopg.connect(roles.app_url) as conn:
        for sql in ("UPDATE delivery_events SET type = 'opened'", "DELETE FROM delivery_events"):
            try:
                conn.execute(sql)
            except psycopg.errors.InsufficientPrivilege:
                conn.rollback()
            else:
                raise AssertionError(f"the runtime role ran {sql}")


async def test_a_hard_bounce_racing_a_close_still_tells_notify(store, db_url):
    """The bounce's statement reads the step ``unknown`` in its snapshot; an operator closes
    it ``accepted`` before the bounce commits. The notice is decided from the step as it is
    now, not from that snapshot: notify is told."""
    from evq.worker.resolution import Resolution

    [step] = await unknown_steps(store, notify="owner@example.com")
    bounce = DeliveryEvent(
        provider="mailgun",
        event_id="mg-race",
        type="bounced_hard",
        message_id=step_row(db_url, step.id)["message_id"],
        recipient="gone@example.com",
    )
    holder = psycopg.connect(db_url)
    try:
        # An uncommitted row with the same (provider, event_id) makes the bounce's insert wait
        # after its statement took its snapshot; rolled back, the bounce's insert goes on.
        holder.execute(
            "INSERT INTO delivery_events (provider, event_id, type, received_at) VALUES ('mailgun', 'mg-race', "
            "'bounced_hard', now())"
        )
        recording = asyncio.create_task(store.delivery_record(bounce, step_providers=RELAYED, actor="webhook:mailgun"))
        await asyncio.to_thread(
            wait_until,
            lambda: rows(
                db_url,
                "SELECT 1 FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'",
            ),
            what="the bounce waiting on the held event id",
        )
        other = await PostgresStore.open(db_url, max_size=1)
        try:
            await other.resolve(step.id, Resolution.parse("accepted", "checked"), actor="alice", default_max_attempts=3)
        finally:
            await other.close()
        holder.rollback()
    finally:
        holder.close()
    done = await recording
    assert (done.step, done.duplicate, done.closed, done.notices) == (step.id, False, False, 1)
    assert step_row(db_url, step.id)["status"] == "accepted"
    assert "notice_enqueued" in evidence_kinds(db_url, step.id)
