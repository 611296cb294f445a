"""Delivery events (issue 16, worker/delivery.py) against the PostgreSQL store: stored once per provider
event id, matched by key digest then Message-ID, an unknown step settled accepted (reason
webhook) with delivery_event evidence, every other step only gaining delivery state, unmatched
events kept, and a hard bounce or complaint telling notify once per step and type."""

from __future__ import annotations

from evq.worker.delivery import DeliveryEvent, key_digest, key_tag
from evq.worker.outcomes import Accepted, Rejected, Unknown
from tests.conformance.helpers import T0, at, claim, evidence, row, settle
from tests.support import valid

# The steps here are smtp ones, as if sent through the relay whose webhook reports them.
RELAYED = ("smtp",)


async def step_in(store, outcome, *, now=T0, **kw) -> dict:
    e = await store.enqueue(valid(**kw), now=now)
    providers = (kw.get("provider", "smtp"),)
    [step] = [c for c in await claim(store, now=now, providers=providers) if c.id == e.id]
    await store.record([settle(step, outcome)], actor="w1", now=now)
    return await row(store, e.id)


def event(event_id: str, kind: str = "delivered", **kw) -> DeliveryEvent:
    return DeliveryEvent(provider=kw.pop("provider", "resend"), event_id=event_id, type=kind, **kw)


async def test_an_event_settles_an_unknown_step_accepted_with_its_evidence(store):
    s = await step_in(store, Unknown("reply lost after DATA"))
    e = event(
        "ev-1",
        "delivered",
        key_digest=key_tag(s["idempotency_key"], s["message_id"]),
        provider_message_id="re_123",
        recipient="ada@example.com",
        occurred_at=at(5),
        detail={"raw_type": "email.delivered"},
    )
    done = await store.delivery_record(e, step_providers=RELAYED, actor="webhook:resend", now=at(10))
    assert (done.step, done.duplicate, done.closed) == (s["id"], False, True)
    after = await row(store, s["id"])
    assert (after["status"], after["reason"], after["provider_message_id"]) == ("accepted", "webhook", "re_123")
    assert after["closed_at"] == at(10) and after["unknown_since"] is None
    last = (await evidence(store, s["id"]))[-1]
    assert (last["kind"], last["from_status"], last["to_status"], last["outcome"], last["reason"]) == (
        "delivery_event",
        "unknown",
        "accepted",
        "accepted",
        "webhook",
    )
    assert last["actor"] == "webhook:resend" and last["provider_message_id"] == "re_123"
    assert last["detail"]["delivery_event"] == done.id and last["detail"]["raw_type"] == "email.delivered"
    assert last["detail"]["type"] == "delivered" and last["detail"]["recipient"] == "ada@example.com"
    [stored], _ = await store.delivery_events(step=s["id"])
    assert (stored["id"], stored["provider"], stored["event_id"], stored["type"]) == (
        done.id,
        "resend",
        "ev-1",
        "delivered",
    )
    assert (stored["run_id"], stored["step_id"], stored["occurred_at"]) == (s["run_id"], s["step_id"], at(5))
    assert await store.delivery_states([s["id"]]) == {s["id"]: {"state": "delivered", "at": at(5), "events": 1}}


async def test_a_duplicate_event_changes_nothing_and_says_so(store):
    s = await step_in(store, Unknown("reply lost"))
    e = event("ev-dup", "deferred", message_id=s["message_id"])
    first = await store.delivery_record(e, step_providers=RELAYED, actor="webhook:resend", now=at(1))
    evidence_before = await evidence(store, s["id"])
    again = await store.delivery_record(e, step_providers=RELAYED, actor="webhook:resend", now=at(2))
    assert (again.id, again.step, again.duplicate, again.closed) == (first.id, s["id"], True, False)
    assert await evidence(store, s["id"]) == evidence_before
    assert len((await store.delivery_events(step=s["id"]))[0]) == 1
    # The same event id from another provider is another event.
    other = await store.delivery_record(
        event("ev-dup", "deferred", provider="postmark"), step_providers=RELAYED, actor="w", now=at(3)
    )
    assert not other.duplicate and other.id != first.id


async def test_the_key_digest_wins_over_the_message_id(store):
    a = await step_in(store, Accepted("q1"))
    b = await step_in(store, Accepted("q2"))
    done = await store.delivery_record(
        event("ev-both", key_digest=key_tag(a["idempotency_key"], a["message_id"]).upper(), message_id=b["message_id"]),
        step_providers=RELAYED,
        actor="w",
        now=at(1),
    )
    assert done.step == a["id"]
    by_id = await store.delivery_record(
        event("ev-mid", message_id=b["message_id"]), step_providers=RELAYED, actor="w", now=at(1)
    )
    assert by_id.step == b["id"]


async def test_an_event_names_a_step_by_its_key_and_its_message_id_never_by_the_key_alone(store):
    """Another installation's message with the same key (a provider account shared, whose
    webhooks report every message) carries the same key digest: only the tag's Message-ID
    part makes it ours. A bare digest names only a step evq 0.2.0 made (none here)."""
    s = await step_in(store, Unknown("reply lost after DATA"))
    key = s["idempotency_key"]
    theirs = key_tag(key, "<evq.theirs-0123@example.org>")
    assert theirs.split("-")[0] == key_tag(key, s["message_id"]).split("-")[0]
    for n, tag in enumerate((theirs, key_digest(key))):
        done = await store.delivery_record(
            event(f"ev-not-ours-{n}", key_digest=tag), step_providers=RELAYED, actor="w", now=at(1)
        )
        assert (done.step, done.closed) == (None, False)
    assert (await row(store, s["id"]))["status"] == "unknown"
    ours = await store.delivery_record(
        event("ev-ours", key_digest=key_tag(key, s["message_id"])), step_providers=RELAYED, actor="w", now=at(2)
    )
    assert (ours.step, ours.closed) == (s["id"], True)


async def test_an_event_matching_no_step_is_kept_for_an_operator(store):
    s = await step_in(store, Accepted("q1"))
    lost = await store.delivery_record(
        event("ev-lost", "bounced_hard", key_digest="0" * 64, message_id="<nobody@example.org>", recipient="x@y.z"),
        step_providers=RELAYED,
        actor="w",
        now=at(1),
    )
    junk = await store.delivery_record(
        event("ev-junk", key_digest="not hex"), step_providers=RELAYED, actor="w", now=at(2)
    )
    mine = await store.delivery_record(
        event("ev-mine", message_id=s["message_id"]), step_providers=RELAYED, actor="w", now=at(3)
    )
    assert (lost.step, lost.duplicate, lost.closed) == (None, False, False) and junk.step is None
    unmatched, total = await store.delivery_events(unmatched=True)
    assert [d["id"] for d in unmatched] == [junk.id, lost.id] and total == 2  # newest first
    assert unmatched[1]["step"] is None and unmatched[1]["recipient"] == "x@y.z"
    assert unmatched[1]["message_id"] == "<nobody@example.org>"
    every, total = await store.delivery_events()
    assert [d["id"] for d in every] == [mine.id, junk.id, lost.id] and total == 3
    # Paged: below an id, at most limit; an offset skips, and the total counts every match.
    older, total = await store.delivery_events(before_id=mine.id, limit=1)
    assert [d["id"] for d in older] == [junk.id] and total == 2
    skipped, total = await store.delivery_events(limit=1, offset=1)
    assert [d["id"] for d in skipped] == [junk.id] and total == 3
    assert await store.delivery_events(provider="sendgrid") == ([], 0)


async def test_closed_steps_only_gain_delivery_state(store):
    accepted = await step_in(store, Accepted("q1"))
    rejected = await step_in(store, Rejected("550 no such user"))
    for n, s in enumerate((accepted, rejected)):
        await store.delivery_record(
            event(f"ev-d{n}", "delivered", message_id=s["message_id"], occurred_at=at(20)),
            step_providers=RELAYED,
            actor="w",
            now=at(30),
        )
        await store.delivery_record(
            event(f"ev-o{n}", "opened", message_id=s["message_id"], occurred_at=at(40)),
            step_providers=RELAYED,
            actor="w",
            now=at(50),
        )
        # Out of order: an earlier event arriving later does not become the latest state.
        await store.delivery_record(
            event(f"ev-q{n}", "deferred", message_id=s["message_id"], occurred_at=at(10)),
            step_providers=RELAYED,
            actor="w",
            now=at(60),
        )
        after = await row(store, s["id"])
        assert {k: after[k] for k in ("status", "reason", "closed_at", "provider_message_id")} == {
            k: s[k] for k in ("status", "reason", "closed_at", "provider_message_id")
        }
        added = [e for e in await evidence(store, s["id"]) if e["kind"] == "delivery_event"]
        assert [(e["reason"], e["to_status"]) for e in added] == [
            ("delivered", None),
            ("opened", None),
            ("deferred", None),
        ]
    states = await store.delivery_states([accepted["id"], rejected["id"], 999999])
    assert states[accepted["id"]] == {"state": "opened", "at": at(40), "events": 3}
    assert set(states) == {accepted["id"], rejected["id"]}


async def test_a_pending_step_is_not_settled_by_an_event(store):
    e = await store.enqueue(valid(), now=T0)
    before = await row(store, e.id)
    done = await store.delivery_record(
        event("ev-p", message_id=before["message_id"]), step_providers=RELAYED, actor="w", now=at(1)
    )
    assert done.step == e.id and not done.closed
    assert (await row(store, e.id))["status"] == "pending"


async def test_a_hard_bounce_tells_notify_once_per_step_and_type(store):
    s = await step_in(store, Accepted("q1"), notify="owner@example.com")
    quiet = await step_in(store, Accepted("q2"))  # no notify address: nobody to tell
    first = await store.delivery_record(
        event("ev-b1", "bounced_hard", message_id=s["message_id"], recipient="gone@example.com"),
        step_providers=RELAYED,
        actor="w",
        now=at(1),
    )
    again = await store.delivery_record(
        event("ev-b2", "bounced_hard", message_id=s["message_id"], recipient="gone@example.com"),
        step_providers=RELAYED,
        actor="w",
        now=at(2),
    )
    spam = await store.delivery_record(
        event("ev-c1", "complained", message_id=s["message_id"], recipient="x@example.com"),
        step_providers=RELAYED,
        actor="w",
        now=at(3),
    )
    soft = await store.delivery_record(
        event("ev-s1", "bounced_soft", message_id=s["message_id"]), step_providers=RELAYED, actor="w", now=at(4)
    )
    none = await store.delivery_record(
        event("ev-b3", "bounced_hard", message_id=quiet["message_id"]), step_providers=RELAYED, actor="w"
    )
    assert (first.notices, again.notices, spam.notices, soft.notices, none.notices) == (1, 0, 1, 0, 0)
    told = [e for e in await evidence(store, s["id"]) if e["kind"] == "notice_enqueued"]
    assert [e["reason"] for e in told] == ["bounced_hard", "complained"]
    notice = await row(store, told[0]["detail"]["notice_step"])
    assert notice["notice_of"] == s["id"] and notice["payload"]["to"][0]["email"] == "owner@example.com"
    assert notice["payload"]["subject"].startswith("[bounced]")
    assert "gone@example.com" in notice["payload"]["text"]


async def test_an_event_never_matches_a_step_of_a_provider_its_webhook_cannot_report(store):
    """A Mailgun event carrying an smtp step's key (smtp not relayed through Mailgun) or an http
    step's Message-ID is stored unmatched, says why, and closes nothing."""
    s = await step_in(store, Unknown("reply lost after DATA"))
    h = await step_in(store, Unknown("reply lost"), provider="http")
    by_key = event("ev-f1", provider="mailgun", key_digest=key_tag(s["idempotency_key"], s["message_id"]))
    done = await store.delivery_record(by_key, step_providers=(), actor="webhook:mailgun", now=at(1))
    assert (done.step, done.closed) == (None, False)
    by_mid = event("ev-f2", provider="mailgun", message_id=h["message_id"])
    other = await store.delivery_record(by_mid, step_providers=("smtp",), actor="webhook:mailgun", now=at(2))
    assert (other.step, other.closed) == (None, False)
    for step in (s, h):
        after = await row(store, step["id"])
        assert after["status"] == "unknown" and [e["kind"] for e in await evidence(store, step["id"])][-1] != (
            "delivery_event"
        )
    kept = {d["event_id"]: d for d in (await store.delivery_events(unmatched=True))[0]}
    assert kept["ev-f1"]["detail"]["not_matched"]["step"] == s["id"]
    assert kept["ev-f1"]["detail"]["not_matched"]["step_provider"] == "smtp"
    assert kept["ev-f2"]["detail"]["not_matched"] == {
        "step": h["id"],
        "step_provider": "http",
        "why": "the step was sent by provider http, whose messages the mailgun webhook does not report",
    }
    # The same key from the webhook that can report the step closes it.
    mine = await store.delivery_record(
        event("ev-f3", key_digest=key_tag(h["idempotency_key"], h["message_id"])),
        step_providers=("http",),
        actor="w",
        now=at(3),
    )
    assert (mine.step, mine.closed) == (h["id"], True)
