"""Issue 29: the provider's idempotency key can be neither pre-empted nor shared.

Real `evq worker run --drain` processes (the composition root reads the database's pepper)
send through the dev HTTP provider (ops/dev/http.py), which deduplicates by Idempotency-Key as
Resend does: the same key with another body is 409 and the second send is lost.

- An agent enqueues, as its own literal key, the wire key the victim's step was sent under:
  both are delivered.
- Two installations (two databases, each migrated on its own, so each has its own pepper) share
  one provider account and send the same key: both are delivered, and one's lookup does not
  take the other's message for its own.
- A step evq 0.2.0 sent whose answer was lost is retried after the upgrade to 1.0 under the key
  it was sent with, so the provider replays it: one message, not two.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Iterator
from datetime import UTC, datetime

import psycopg
import pytest

from evq.adapters.http import HttpProvider, WireKeys, legacy_wire_key
from evq.adapters.postgres.database import upgrade
from evq.adapters.postgres.store import PostgresStore
from evq.ops.dev.http import DevHttpServer
from evq.worker.ports import SendRequest
from tests import v0_2
from tests.database_roles import migrated
from tests.integration.test_rate_limit import API_KEY, finish, workers
from tests.support import WIRE_KEYS, rows, step_row, valid


@pytest.fixture
def api() -> Iterator[DevHttpServer]:
    with DevHttpServer(api_key=API_KEY, dedupe_window=3600) as server:
        yield server


def drain(db_url: str, api: DevHttpServer) -> None:
    """`evq worker run --drain` on this database, as an operator runs it."""
    [(code, err)] = finish(workers(db_url, api, 1))
    assert code == 0, err[-3000:]


def enqueue(db_url: str, **overrides: object) -> int:
    async def go() -> int:
        store = await PostgresStore.open(db_url, max_size=1)
        try:
            return (await store.enqueue(valid(provider="http", **overrides))).id
        finally:
            await store.close()

    return asyncio.run(go())


def delivered(api: DevHttpServer, db_url: str, step: int) -> list[dict[str, object]]:
    """The messages the provider accepted for this step (by the Message-ID evq gave it)."""
    # email_steps, not steps_now: a 0.2.0 database (before its upgrade) has no view.
    [row] = rows(db_url, "SELECT message_id FROM email_steps WHERE id = %s", (step,))
    message_id = row["message_id"]
    return [m for m in api.messages if m["headers"].get("X-Evq-Message-Id") == message_id]


def test_an_agents_literal_key_cannot_take_another_steps_key_at_the_provider(db_url, api):
    victim_key = "run-v:приветствие"  # not ASCII: it used to go out as sha256:<its digest>
    taken = "sha256:" + hashlib.sha256(victim_key.encode()).hexdigest()
    assert legacy_wire_key(victim_key) == taken
    # The agent's step goes first, under the literal key the victim's would have been sent with.
    attacker = enqueue(db_url, run_id="run-a", step_id="grab", idempotency_key=taken, to=["mallory@example.net"])
    drain(db_url, api)
    victim = enqueue(db_url, run_id="run-v", step_id="welcome", idempotency_key=victim_key, to=["ann@example.com"])
    drain(db_url, api)
    for step in (attacker, victim):
        s = step_row(db_url, step)
        assert (s["status"], s["reason"]) == ("accepted", "provider_accepted"), s
        [message] = delivered(api, db_url, step)
        assert s["provider_message_id"] == message["id"]
    sent = [p["idempotency_key"] for p in api.posts()]
    assert len(set(sent)) == 2 and taken not in sent and victim_key not in sent
    assert all(k.startswith("evq1-") and len(k) == 69 for k in sent)


def test_two_installations_sharing_one_provider_account_both_deliver_the_same_key(db_url, empty_db_url, api):
    other = empty_db_url
    upgrade(other)  # an installation of its own: its own pepper
    pepper = "SELECT encode(pepper, 'hex') AS p FROM api_key_pepper"
    assert rows(db_url, pepper) != rows(other, pepper)
    ours = enqueue(db_url, step_id="welcome", to=["ann@example.com"])
    theirs = enqueue(other, step_id="welcome", to=["ann@example.com"])
    assert step_row(db_url, ours)["idempotency_key"] == step_row(other, theirs)["idempotency_key"] == "run-1:welcome"
    drain(db_url, api)
    # Their step, not yet sent, finds nothing of its own at the provider: our message's evq_key
    # tag is the key's digest and part of our Message-ID's, which theirs does not share.
    mine = asyncio.run(_lookup(api, "run-1:welcome", step_row(other, theirs)["message_id"]))
    assert not mine.found and mine.raw["listed"] == 0
    drain(other, api)
    for url, step in ((db_url, ours), (other, theirs)):
        s = step_row(url, step)
        assert (s["status"], s["reason"]) == ("accepted", "provider_accepted"), s
        [message] = delivered(api, url, step)
        assert s["provider_message_id"] == message["id"]
    assert len(api.messages) == 2 and len({p["idempotency_key"] for p in api.posts()}) == 2
    found = asyncio.run(_lookup(api, "run-1:welcome", step_row(other, theirs)["message_id"]))
    assert found.found and found.provider_message_id == step_row(other, theirs)["provider_message_id"]


async def _lookup(api: DevHttpServer, key: str, message_id: str):  # type: ignore[no-untyped-def]
    provider = HttpProvider(base_url=api.url, api_key=API_KEY, timeout=2, wire_keys=WIRE_KEYS)
    try:
        return await provider.lookup(key, message_id)
    finally:
        await provider.close()


# The worker of evq 0.2.0, as far as the wire is concerned: every key in its old form.
BEFORE = WireKeys.from_pepper(b"x" * 32, keyed_from=2**62)


def test_a_step_sent_before_the_upgrade_is_retried_under_the_key_it_was_sent_with(empty_db_url, api):
    """A 0.2.0 database with a step whose first attempt reached the provider under the key in
    its old form and whose answer was lost: after the upgrade its retry goes under that key, so
    the provider replays its answer; a step enqueued after the upgrade takes the keyed form."""
    url = empty_db_url
    v0_2.database_0_2(url)
    with psycopg.connect(url) as conn:
        old = v0_2.step(conn, 7, "report", "retryable", provider="http", reason="ambiguous_deduped", maybe_delivered=True,
                   attempts=1, first_attempt_at=v0_2.EARLIER, dedupe_until="now() + interval '1 hour'",
                   next_attempt_at="now() + interval '1 hour'")  # fmt: skip
        conn.execute("SELECT setval('email_steps_id_seq', 7)")
        [(payload,)] = conn.execute("SELECT payload FROM email_steps WHERE id = 7").fetchall()

    async def first_attempt() -> None:  # what 0.2.0's worker sent
        provider = HttpProvider(base_url=api.url, api_key=API_KEY, timeout=1, dedupe_window=3600, wire_keys=BEFORE)
        try:
            sent = SendRequest(step_id=7, run_id="from-0.2", idempotency_key=old["key"],
                               message_id=old["message_id"], attempt=1, payload=payload)  # fmt: skip
            assert (await provider.send(sent)).kind == "unknown"  # 0.2 recorded it as retryable: deduped
        finally:
            await provider.close()

    api.queue_fault("reset")  # the provider takes it; the answer is lost
    asyncio.run(first_attempt())
    assert len(delivered(api, url, 7)) == 1

    upgrade(url)
    [basis] = rows(url, "SELECT wire_keys_from FROM api_key_pepper")
    assert basis["wire_keys_from"] == 8
    new = enqueue(url, step_id="later", to=["bob@example.com"])
    for table in ("email_steps", "step_queue"):  # its retry's time has come
        rows(url, f"UPDATE {table} SET next_attempt_at = %s WHERE id = 7 RETURNING id", (datetime.now(UTC),))
    drain(url, api)

    s = step_row(url, 7)
    assert (s["status"], s["attempts"]) == ("accepted", 2), s
    [message] = delivered(api, url, 7)  # the provider replayed its first answer: sent once
    assert s["provider_message_id"] == message["id"]
    keys = [p["idempotency_key"] for p in api.posts()]
    assert keys.count(old["key"]) == 2  # its first attempt (0.2's) and its retry (1.0's)
    assert step_row(url, new)["status"] == "accepted"
    [later] = [k for k in keys if k != old["key"]]
    assert later.startswith("evq1-")
    assert all(n == 1 for n in api.by_message_id().values())


def test_the_runtime_role_sends_keyed_and_cannot_change_what_the_keys_are_made_of(roles, api):
    """The basis is the migration's: `evq worker run` under the runtime role reads it and sends
    keyed keys, and that role cannot rewrite it (a new first id would send an old step under a
    new key, a new pepper every step)."""
    migrated(roles)
    step = enqueue(roles.app_url, step_id="as-runtime")
    drain(roles.app_url, api)
    assert step_row(roles.admin_url, step)["status"] == "accepted"
    [post] = api.posts()
    assert post["idempotency_key"].startswith("evq1-")
    for sql in ("UPDATE api_key_pepper SET wire_keys_from = 1", "UPDATE api_key_pepper SET pepper = pepper"):
        with psycopg.connect(roles.app_url) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(sql)


def test_a_webhook_event_about_another_installations_message_never_settles_ours(db_url, empty_db_url, api):
    """Two installations share one Resend account (its webhooks report every message of the
    account to every endpoint) and use the same key: our send's answer was lost (``unknown``,
    our message never delivered); theirs goes out. Resend's signed event about their message,
    echoing the evq_key tag their worker put on it, reaches our `evq serve`: it is not ours,
    and it must neither close our step ``accepted`` nor count as its delivery."""
    from tests import providerhooks as hooks
    from tests.support import unknown_steps, with_store
    from tests.web.support import serving

    other = empty_db_url
    upgrade(other)  # an installation of its own
    [ours] = with_store(db_url, lambda store: unknown_steps(store, 1, provider="http", step_id="welcome"))
    theirs = enqueue(other, step_id="welcome", to=["ann@example.com"])
    assert ours.idempotency_key == step_row(other, theirs)["idempotency_key"] == "run-1:welcome"
    drain(other, api)  # a real `evq worker run --drain` of theirs
    [message] = delivered(api, other, theirs)
    assert step_row(other, theirs)["status"] == "accepted"

    event = {
        "type": "email.delivered",
        "created_at": "2026-12-01T10:00:00Z",
        "data": {"email_id": message["id"], "to": message["to"], "tags": message["tags"]},
    }
    with serving(db_url, webhook_resend_secret=hooks.RESEND_SECRET) as served:
        headers, body = hooks.resend(event)
        answer = served.client().post("/v1/webhooks/resend", content=body, headers=headers)
    assert answer.status_code == 200, answer.text
    s = step_row(db_url, ours.id)
    assert s["status"] == "unknown", s
    [stored] = rows(db_url, "SELECT step_id FROM delivery_events")
    assert stored["step_id"] is None  # kept for an operator, matched to no step of ours

    # Our own message, once it is sent, is matched by the tag our worker gave it.
    mine = enqueue(db_url, step_id="second", to=["bob@example.com"])
    drain(db_url, api)
    [sent] = delivered(api, db_url, mine)
    event["data"] = {"email_id": sent["id"], "to": sent["to"], "tags": sent["tags"]}
    with serving(db_url, webhook_resend_secret=hooks.RESEND_SECRET) as served:
        headers, body = hooks.resend(event)
        assert served.client().post("/v1/webhooks/resend", content=body, headers=headers).status_code == 200
    matched = rows(db_url, "SELECT step_id FROM delivery_events WHERE step_id IS NOT NULL")
    assert [r["step_id"] for r in matched] == [mine]


def test_a_lookup_never_takes_another_installations_message_of_the_same_key_for_ours(api):
    """Two installations share a provider account that shows no headers of a message: one (evq
    0.2.0, whose tag is the key's bare digest) sent ``run-1:welcome``; our step with that key
    lost its answer before the provider had it. Our lookup finds nothing, under our tag or the
    bare digest (a bare-digest message counts only if it shows our Message-ID), so our step
    stays ``unknown``; once ours is sent, our lookup finds ours."""

    async def go() -> None:
        theirs = HttpProvider(base_url=api.url, api_key=API_KEY, timeout=2, wire_keys=BEFORE)
        ours = HttpProvider(base_url=api.url, api_key=API_KEY, timeout=2, wire_keys=WIRE_KEYS)
        payload = valid(provider="http", step_id="welcome").payload
        try:
            sent = await theirs.send(SendRequest(3, "run-1", "run-1:welcome", "<evq.theirs@example.org>", 1, payload))
            assert sent.response["sent"] is True
            api.lookup_fault = "no-headers"
            lost = await ours.lookup("run-1:welcome", "<evq.ours@example.org>")
            assert not lost.found, lost.raw
            mine = await ours.send(SendRequest(9, "run-1", "run-1:welcome", "<evq.ours@example.org>", 1, payload))
            found = await ours.lookup("run-1:welcome", "<evq.ours@example.org>")
            assert found.found and found.provider_message_id == mine.provider_message_id
        finally:
            await theirs.close()
            await ours.close()

    asyncio.run(go())
