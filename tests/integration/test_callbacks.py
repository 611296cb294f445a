"""Signed callbacks (issue 15): each event of a key's feed is POSTed to the key's URL,
durably (the row is written with the event), signed the Standard Webhooks way, retried
until a 2xx, idempotent by event id, and never to a private address unless allowed.
A real HTTP receiver on loopback checks every signature the way the spec says."""

from __future__ import annotations

from evq.adapters.http.callback import CallbackPoster
from evq.ops.app import service
from evq.ops.app.service import Caller
from evq.worker.approval_policy import KeyApproval
from evq.worker.callbacks import CallbackConfig, CallbackSender
from evq.worker.keys import Role, generate
from evq.worker.outcomes import Rejected
from tests.conformance.helpers import claim, settle
from tests.support import POLICY, request, rows


async def rejected_send(store, key_text: str, run_id: str) -> int:
    sent = await service.enqueue(store, Caller(key_text, interface="http"), [request(run_id=run_id)], POLICY)
    [step] = await claim(store, now=None)
    await store.record([settle(step, Rejected("550 no such user"))], actor="worker-1")
    return sent.data["id"]


async def agent_with_url(store, url: str):
    await store.create_key(name="admin", role=Role.ADMIN, key=generate(), created_by=None)
    key = generate()
    made = await store.create_key(
        name="agent-7", role=Role.AGENT, key=key, created_by="admin", notify_url=url, approval=KeyApproval.POLICY
    )
    return key, made["callback_secret"]


async def test_a_rejection_is_posted_signed_once_and_retried_until_acknowledged(store, db_url, receiver):
    key, secret = await agent_with_url(store, receiver.url)
    receiver.use(secret)
    step = await rejected_send(store, key.text, "r-cb")
    [owed] = rows(db_url, "SELECT * FROM callback_deliveries")
    assert (owed["status"], owed["attempts"]) == ("pending", 0)  # durable before any POST

    receiver.answers = [500]
    poster = CallbackPoster(timeout=5, allow_private=True)
    sender = CallbackSender(store, poster, CallbackConfig(backoff_base=0))
    try:
        first = await sender.run_once()
        assert (first.delivered, first.failed) == (0, 1)
        [row] = rows(db_url, "SELECT * FROM callback_deliveries")
        assert (row["status"], row["last_status"], row["last_error"]) == ("pending", 500, "HTTP 500")
        second = await sender.run_once()
        assert second.delivered == 1
        assert (await sender.run_once()).total == 0  # delivered: never again
    finally:
        await poster.close()

    assert [r["valid"] and r["fresh"] for r in receiver.received] == [True, True]
    # Both tries carry the same webhook-id: the receiver dedupes by it.
    assert receiver.received[0]["id"] == receiver.received[1]["id"]
    body = receiver.received[1]["body"]
    assert body["type"] == "evq.step.rejected" and body["data"]["step"] == step
    assert (body["data"]["key_name"], body["data"]["reason"]) == ("agent-7", "provider_rejected")
    assert receiver.received[1]["path"] == "/hooks/evq?token=receiver-token"
    [row] = rows(db_url, "SELECT * FROM callback_deliveries")
    assert (row["status"], row["attempts"], row["last_status"]) == ("delivered", 2, 204)
    # The signing secret is in no row (derived from the pepper), and the URL's token only on the key.
    everything = repr(rows(db_url, "SELECT * FROM callback_deliveries")) + repr(
        rows(db_url, "SELECT * FROM key_events")
    )
    assert secret.removeprefix("whsec_") not in everything + repr(rows(db_url, "SELECT * FROM api_keys"))
    assert "receiver-token" not in everything


async def test_a_loopback_url_is_refused_unless_allowed(store, db_url, receiver):
    key, _secret = await agent_with_url(store, receiver.url)
    await rejected_send(store, key.text, "r-ssrf")
    poster = CallbackPoster(timeout=5, allow_private=False)
    try:
        counts = await CallbackSender(store, poster, CallbackConfig(backoff_base=0)).run_once()
    finally:
        await poster.close()
    assert counts.failed == 1 and receiver.received == []
    [row] = rows(db_url, "SELECT * FROM callback_deliveries")
    assert row["status"] == "pending" and row["last_error"].startswith("refused: 127.0.0.1 resolves to a non-public")


async def test_a_receiver_that_never_answers_2xx_is_given_up_and_the_feed_keeps_the_event(store, db_url, receiver):
    key, secret = await agent_with_url(store, receiver.url)
    receiver.use(secret)
    await rejected_send(store, key.text, "r-down")
    receiver.answers = [503, 503]
    poster = CallbackPoster(timeout=5, allow_private=True)
    sender = CallbackSender(store, poster, CallbackConfig(backoff_base=0, max_attempts=2))
    try:
        assert (await sender.run_once()).failed == 1
        assert (await sender.run_once()).given_up == 1
        assert (await sender.run_once()).total == 0
    finally:
        await poster.close()
    [row] = rows(db_url, "SELECT * FROM callback_deliveries")
    assert (row["status"], row["attempts"]) == ("failed", 2)
    assert [e["kind"] for e in rows(db_url, "SELECT kind FROM key_events")] == ["rejected"]


async def test_a_key_without_a_url_is_owed_no_delivery(store, db_url):
    await store.create_key(name="admin", role=Role.ADMIN, key=generate(), created_by=None)
    key = generate()
    await store.create_key(name="agent-9", role=Role.AGENT, key=key, created_by="admin", approval=KeyApproval.POLICY)
    await rejected_send(store, key.text, "r-none")
    assert rows(db_url, "SELECT * FROM callback_deliveries") == []
    assert len(rows(db_url, "SELECT * FROM key_events")) == 1
