"""Content retention (evq_redact_batch) against the PostgreSQL store: closed steps past
the cutoff lose their text and html, keep everything that proves the send, once each;
open steps and recent ones are never touched, and a redacted step is never sent again."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta

import pytest

from evq.worker.errors import StateConflict
from evq.worker.outcomes import Accepted, Rejected, Retryable, Unknown
from evq.worker.request import canonical_json
from evq.worker.resolution import Resolution
from tests.conformance.helpers import claim, evidence, row, settle
from tests.support import valid

# Closed long before either store's clock (PostgreSQL's is the real one).
PAST = datetime(2020, 1, 1, tzinfo=UTC)
DAY = timedelta(days=1)


def digest(text: str) -> dict:
    return {"bytes": len(text.encode()), "sha256": hashlib.sha256(text.encode()).hexdigest()}


async def closed(store, outcome, request, *, at=PAST) -> int:
    e = await store.enqueue(request, now=at)
    [step] = await claim(store, now=at)
    assert step.id == e.id
    await store.record([settle(step, outcome)], actor="w", now=at)
    return e.id


async def test_closed_steps_past_the_cutoff_lose_only_their_body_once(store):
    sent = valid(text="Dear Ada, ünïcode body", html="<p>Dear Ada</p>", headers={"In-Reply-To": "<a@b.example>"})
    accepted = await closed(store, Accepted("pm-1"), sent)
    rejected = await closed(store, Rejected("550 no"), valid(html="<b>only html</b>", text=None))
    waiting = (await store.enqueue(valid(), now=PAST)).id
    [step] = await claim(store, now=PAST, limit=1)
    await store.record([settle(step, Unknown("reset"))], actor="w", now=PAST)
    unknown = step.id
    before = {i: await row(store, i) for i in (accepted, rejected, waiting, unknown)}

    counts = await store.redact_content(keep=DAY, limit=100, actor="redactor@test")
    assert (counts.redacted, counts.batches) == (2, 1)

    r = await row(store, accepted)
    p, old = r["payload"], before[accepted]["payload"]
    assert (p["text"], p["html"]) == (None, None)
    assert p["content_redacted"]["parts"] == {
        "text": digest(sent.payload["text"]),
        "html": digest(sent.payload["html"]),
    }
    # Everything else is the original's, and the stored hash still proves the original request.
    kept = {k: v for k, v in p.items() if k not in ("text", "html", "content_redacted")}
    assert kept == {k: v for k, v in old.items() if k not in ("text", "html")}
    assert r["payload_sha256"] == before[accepted]["payload_sha256"] == sent.payload_sha256
    assert hashlib.sha256(canonical_json(sent.payload).encode()).hexdigest() == r["payload_sha256"]
    assert r["content_redacted_at"] is not None
    assert (r["status"], r["message_id"], r["idempotency_key"]) == (
        "accepted",
        before[accepted]["message_id"],
        before[accepted]["idempotency_key"],
    )
    last = (await evidence(store, accepted))[-1]
    assert (last["kind"], last["actor"], last["reason"], last["from_status"], last["to_status"]) == (
        "content_redacted",
        "redactor@test",
        "retention",
        None,
        None,
    )
    assert last["detail"]["parts"] == p["content_redacted"]["parts"]
    assert last["detail"]["payload_sha256"] == r["payload_sha256"]
    assert (await row(store, rejected))["payload"]["content_redacted"]["parts"]["text"] is None
    # Open steps keep every byte, however old.
    for i in (waiting, unknown):
        now = await row(store, i)
        assert {k: v for k, v in now.items() if k != "age_seconds"} == {
            k: v for k, v in before[i].items() if k != "age_seconds"
        }
        assert "content_redacted" not in [e["kind"] for e in await evidence(store, i)]
    # Idempotent: nothing is redacted twice, and no second evidence row.
    again = await store.redact_content(keep=DAY, limit=100, actor="redactor@test")
    assert again.redacted == 0
    assert [e["kind"] for e in await evidence(store, accepted)].count("content_redacted") == 1


async def test_a_step_closed_within_keep_keeps_its_body_and_batches_are_bounded(store):
    ids = [await closed(store, Accepted(f"pm-{i}"), valid()) for i in range(3)]
    # Closed years ago by either clock, but not a century ago.
    assert (await store.redact_content(keep=timedelta(days=36500), limit=10, actor="r")).redacted == 0
    assert [(await row(store, i))["content_redacted_at"] for i in ids] == [None] * 3
    assert (await store.redact_content(keep=timedelta(0), limit=2, actor="r")).redacted == 2
    assert (await store.redact_content(keep=timedelta(0), limit=2, actor="r")).redacted == 1
    assert None not in [(await row(store, i))["content_redacted_at"] for i in ids]


async def test_a_redacted_dead_letter_is_not_requeued(store):
    i = await closed(store, Retryable("451"), valid(max_attempts=1))
    assert ((await row(store, i))["status"], (await row(store, i))["reason"]) == (
        "rejected",
        "attempts_exhausted",
    )
    assert (await store.redact_content(keep=DAY, limit=10, actor="r")).redacted == 1
    with pytest.raises(StateConflict) as refused:
        await store.resolve(
            i, Resolution.parse("retry", "requeue it"), actor="operator:ada", default_max_attempts=3, now=None
        )
    assert "content_redacted_at" in refused.value.context and "removed by retention" in refused.value.message
    assert (await row(store, i))["status"] == "rejected"
