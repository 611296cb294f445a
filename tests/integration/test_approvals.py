"""The held lifecycle end to end on real PostgreSQL (issue 17): a held send approved is
delivered once over real SMTP with its key and Message-ID; a correction is a new hash the
evidence shows, and the agent's retry still finds its step; a denial tells notify; an agent
key never approves; a cancelled step is never sent; a step in flight cannot be cancelled;
held sends expire."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from email import message_from_bytes

import pytest

from evq.adapters.smtp import SmtpProvider
from evq.ops.app import approvals, service
from evq.ops.app.service import Caller
from evq.ops.dev.smtp import DevSmtpServer
from evq.ops.settings import Settings
from evq.worker.approval_actions import ExpirerConfig, HoldExpirer
from evq.worker.approval_policy import ApprovalPolicy, FirstContact, KeyApproval
from evq.worker.errors import AuthFailed, Forbidden, InvalidRequest, StateConflict
from evq.worker.keys import Role, generate
from evq.worker.runner import Worker
from tests.support import POLICY, evidence_kinds, execute, held_steps, request, rows, step_row

SETTINGS = Settings(
    adapter=("smtp",),
    concurrency=2,
    batch_size=4,
    lease_seconds=30,
    poll_interval=0.05,
    retry_base=0,
    retry_max=0,
    rescue_interval=0.2,
    shutdown_grace=5,
    smtp_timeout=5,
)
NOTIFY = "agent-inbox@example.org"
STRANGER = "stranger@victim.example"


async def make_key(store, name: str, role: Role):
    """A key at ``policy`` (the installation's rules, which these tests set): not its role's default."""
    key = generate()
    await store.create_key(name=name, role=role, key=key, created_by=None, approval=KeyApproval.POLICY)
    return key


def hold(db_url: str, step_id: int) -> None:
    """The step made held as an approval policy's enqueue writes it (as the owner role)."""
    execute(
        db_url,
        "UPDATE email_steps SET status = 'held', reason = 'approval_required', held_since = now(), "
        'hold = \'{"rules": [{"rule": "requested"}]}\' WHERE id = %s',
        (step_id,),
    )
    execute(db_url, "DELETE FROM step_queue WHERE id = %s", (step_id,))  # a held step is owed no send yet


async def drain(store, sink: DevSmtpServer, settings: Settings = SETTINGS) -> None:
    smtp = SmtpProvider(host=sink.host, port=sink.port, timeout=5)
    try:
        worker = Worker(store, {"smtp": smtp}, settings.worker_config())
        assert await worker.run(drain=True, install_signals=False) == 0
    finally:
        await smtp.close()


@pytest.fixture
async def keys(store):
    return {
        "agent": await make_key(store, "agent-1", Role.AGENT),
        "other": await make_key(store, "agent-2", Role.AGENT),
        "operator": await make_key(store, "ada", Role.OPERATOR),
    }


async def enqueue_as(store, key, **overrides):
    reply = await service.enqueue(store, Caller(key.text, interface="http"), [request(**overrides)], POLICY)
    return reply.data


async def test_an_approved_send_is_delivered_once_with_its_key_and_message_id(store, db_url, keys):
    made = await enqueue_as(store, keys["agent"], run_id="r-ok", step_id="s")
    hold(db_url, made["id"])
    with DevSmtpServer() as sink:
        await drain(store, sink)
        assert sink.messages == []  # held: nothing claims it
        with pytest.raises(Forbidden):  # an agent key never approves, not even its own send
            await approvals.approve(store, Caller(keys["agent"].text), made["id"], note="mine")
        assert step_row(db_url, made["id"])["status"] == "held"
        plan = await approvals.approve(store, Caller(keys["operator"].text), made["id"], note="ok", dry_run=True)
        assert plan.data["dry_run"] and plan.data["to_status"] == "pending"
        assert step_row(db_url, made["id"])["status"] == "held"
        done = await approvals.approve(store, Caller(keys["operator"].text), made["id"], note="checked")
        assert (done.data["from_status"], done.data["to_status"]) == ("held", "pending")
        await drain(store, sink)
        [message] = sink.wait_for(1)
        await drain(store, sink)
        assert len(sink.messages) == 1
    s = step_row(db_url, made["id"])
    assert s["status"] == "accepted" and s["message_id"] == made["message_id"]
    assert message_from_bytes(message["data"])["Message-ID"] == made["message_id"]
    [approved] = rows(db_url, "SELECT * FROM evidence WHERE step_id = %s AND kind = 'approved'", (made["id"],))
    assert approved["actor"] == "ada" and approved["detail"]["note"] == "checked"
    # The recipient is known to the sender now: the first-contact rule lets the next send go.
    known = rows(db_url, "SELECT sender, recipient FROM known_recipients ORDER BY recipient")
    to = s["payload"]["to"][0]["email"]
    assert {(r["sender"], r["recipient"]) for r in known} == {
        ("agent@example.org", to),
        ("agent@example.org", "@" + to.split("@")[1]),
    }


async def test_an_approval_with_a_correction_sends_the_correction_and_the_agents_retry_gets_the_step(
    store, db_url, keys
):
    asked = request(run_id="r-ed", step_id="s", subject="Helo")
    made = (await service.enqueue(store, Caller(keys["agent"].text, interface="http"), [asked], POLICY)).data
    hold(db_url, made["id"])
    before = step_row(db_url, made["id"])["payload_sha256"]
    operator = Caller(keys["operator"].text)
    with pytest.raises(InvalidRequest):  # only the words can be corrected, never the recipients
        await approvals.approve(store, operator, made["id"], note="x", edits={"to": "else@example.com"})
    with pytest.raises(InvalidRequest):  # validated as an enqueue is
        await approvals.approve(store, operator, made["id"], note="x", edits={"subject": "two\nlines"})
    done = await approvals.approve(store, operator, made["id"], note="typo", edits={"subject": "Hello"}, policy=POLICY)
    assert done.data["edited"] and done.data["fields"] == ["subject"]
    s = step_row(db_url, made["id"])
    assert s["payload"]["subject"] == "Hello" and s["requested_sha256"] == before != s["payload_sha256"]
    [approved] = rows(db_url, "SELECT detail FROM evidence WHERE step_id = %s AND kind = 'approved'", (made["id"],))
    assert (approved["detail"]["from_sha256"], approved["detail"]["to_sha256"]) == (before, s["payload_sha256"])
    again = await service.enqueue(store, Caller(keys["agent"].text, interface="http"), [asked], POLICY)
    assert (again.data["id"], again.data["created"]) == (made["id"], False)
    with DevSmtpServer() as sink:
        await drain(store, sink)
        [message] = sink.wait_for(1)
    assert message_from_bytes(message["data"])["Subject"] == "Hello"


async def test_an_approval_starts_the_retry_budget_so_a_greylisted_first_contact_is_retried(store, db_url, keys):
    """Issue 29: a send held longer than EVQ_RETRY_FOR, then approved, meets greylisting (a real
    SMTP server answers 451 at RCPT once, then 250). The budget starts at the approval, as at an
    operator's requeue: the 451 is retried and the send accepted, not rejected after one attempt."""
    budget = replace(SETTINGS, retry_for=600)
    asked_at = datetime.now(UTC) - timedelta(hours=2)  # held two hours, the budget is ten minutes
    [made] = await held_steps(store, now=asked_at, run_id="r-grey", step_id="s")
    done = await approvals.approve(store, Caller(keys["operator"].text), made.id, note="a new customer, fine")
    with DevSmtpServer() as sink:
        sink.queue_fault("tempfail")  # greylisting: 451 4.7.1 at RCPT, the first time only
        await drain(store, sink, budget)
        [message] = sink.wait_for(1)
    s = step_row(db_url, made.id)
    assert (s["status"], s["reason"], s["attempts"]) == ("accepted", "provider_accepted", 2), s
    answers = rows(
        db_url,
        "SELECT outcome, to_status FROM evidence WHERE step_id = %s AND kind = 'provider_response' ORDER BY id",
        (made.id,),
    )
    assert [(a["outcome"], a["to_status"]) for a in answers] == [("retryable", "retryable"), ("accepted", "accepted")]
    assert message_from_bytes(message["data"])["Message-ID"] == s["message_id"]
    assert s["retry_from"] == done.data["decided_at"]


async def test_denial_and_expiry_never_mail_a_first_contact_notify_and_the_keys_feed_learns(store, db_url, keys):
    """Issue 29: a send held only because its notify address is a first contact, then denied or
    left to expire (no person at all), tells nobody there: over a real SMTP server that address
    receives nothing, and the enqueuing key's feed has both rejections. A notify address the
    sender is known to mail (one an approver let it mail before) still gets its notices."""
    policy = replace(POLICY, approval=ApprovalPolicy(first_contact=FirstContact.ADDRESS))
    agent, operator = Caller(keys["agent"].text, interface="http"), Caller(keys["operator"].text)

    async def held(**overrides):
        made = (await service.enqueue(store, agent, [request(run_id="r-fc", **overrides)], policy)).data
        assert step_row(db_url, made["id"])["status"] == "held"
        return made["id"]

    teach = await held(step_id="teach", to=[NOTIFY], subject="Hello team")
    await approvals.approve(store, operator, teach, note="our own inbox")  # NOTIFY is known now
    lured = {
        what: await held(step_id=what, to=[NOTIFY], notify=STRANGER, subject="You won a prize")
        for what in ("denied", "expired")
    }
    for step in lured.values():  # held for its notify address alone
        [rule] = step_row(db_url, step)["hold"]["rules"]
        assert (rule["rule"], rule["recipients"]) == ("first_contact", [STRANGER])
    told = {
        what: await held(step_id=f"told-{what}", to=[f"{what}@new.example"], notify=NOTIFY, subject="Offer")
        for what in ("denied", "expired")
    }
    with pytest.raises(Forbidden):
        await approvals.deny(store, agent, lured["denied"], note="no")
    with pytest.raises(InvalidRequest):  # a note is required
        await approvals.deny(store, operator, lured["denied"], note=" ")
    for what in (lured, told):
        await approvals.deny(store, operator, what["denied"], note="not to this customer")
        execute(db_url, "UPDATE email_steps SET hold_expires_at = now() - interval '1 second' WHERE id = %s",
                (what["expired"],))  # fmt: skip
    assert await HoldExpirer(store).run_once() == 2
    with DevSmtpServer() as sink:
        await drain(store, sink)
        sink.wait_for(3)  # the approved send and the two notices owed to NOTIFY
        await drain(store, sink)
        messages = sink.messages
    assert not [m for m in messages if STRANGER in m["rcpt_tos"]]
    assert all(m["rcpt_tos"] == [NOTIFY] for m in messages) and len(messages) == 3
    parsed = [message_from_bytes(m["data"]) for m in messages]
    notices = {n["References"]: n for n in parsed if n["References"] is not None}
    assert set(notices) == {step_row(db_url, step)["message_id"] for step in told.values()}
    assert all(n["Subject"] == "[delivery failed] Offer" for n in notices.values())
    text = notices[step_row(db_url, told["denied"])["message_id"]].get_payload(decode=True).decode()
    assert "denied" in text and "not to this customer" in text
    for what, reason, kind in (("denied", "denied", "denied"), ("expired", "approval_expired", "hold_expired")):
        assert evidence_kinds(db_url, lured[what]) == ["held", kind]
        assert evidence_kinds(db_url, told[what]) == ["held", kind, "notice_enqueued"]
        for step in (lured[what], told[what]):
            s = step_row(db_url, step)
            assert (s["status"], s["reason"]) == ("rejected", reason)
            # The agent learns either way: its key's feed has the rejection.
            [feed] = rows(db_url, "SELECT * FROM key_events WHERE step = %s AND kind = 'rejected'", (step,))
            assert feed["reason"] == reason and feed["key_id"] == keys["agent"].key_id


async def test_a_cancelled_step_is_never_sent(store, db_url, keys):
    pending = await enqueue_as(store, keys["agent"], run_id="r-c", step_id="p")
    held = await enqueue_as(store, keys["agent"], run_id="r-c", step_id="h")
    hold(db_url, held["id"])
    with pytest.raises(AuthFailed):  # no key
        await approvals.cancel(store, Caller(None, interface="http"), pending["id"])
    with pytest.raises(Forbidden):  # another agent's send
        await approvals.cancel(store, Caller(keys["other"].text), pending["id"])
    await approvals.cancel(store, Caller(keys["agent"].text), pending["id"], note="not needed")
    await approvals.cancel(store, Caller(keys["operator"].text), held["id"])
    with DevSmtpServer() as sink:
        await drain(store, sink)
        assert sink.messages == []
    for step in (pending, held):
        s = step_row(db_url, step["id"])
        assert (s["status"], s["reason"]) == ("rejected", "cancelled") and s["attempts"] == 0
        assert evidence_kinds(db_url, step["id"])[-1] == "cancelled"


async def test_a_step_in_flight_cannot_be_cancelled(store, db_url, keys):
    made = await enqueue_as(store, keys["agent"], run_id="r-f", step_id="s")
    [claimed] = await store.claim(owner="w", providers=["smtp"], limit=1, lease_seconds=30, dedupe_windows={})
    assert claimed.id == made["id"]
    with pytest.raises(StateConflict) as refused:
        await approvals.cancel(store, Caller(keys["agent"].text), made["id"])
    assert refused.value.message.endswith("in flight: a worker is sending it; it cannot be cancelled")
    assert step_row(db_url, made["id"])["status"] == "in_flight"


async def test_held_sends_expire_rejected(store, db_url):
    now = datetime.now(UTC)
    [late] = await held_steps(store, expires_at=now - timedelta(seconds=1))
    [later] = await held_steps(store, expires_at=now + timedelta(hours=1))
    assert await HoldExpirer(store, ExpirerConfig(batch=1)).run_once() == 1
    s = step_row(db_url, late.id)
    assert (s["status"], s["reason"]) == ("rejected", "approval_expired")
    assert evidence_kinds(db_url, late.id) == ["held", "hold_expired"]
    assert step_row(db_url, later.id)["status"] == "held"


async def test_an_approved_send_that_fails_never_mails_a_notify_address_nobody_approved(store, db_url, keys):
    """Review of issue 29: an agent's key holds every send (approval ``always``), so its request
    names a recipient the relay refuses and, as ``notify``, a stranger. The approver sees the
    recipients and the subject (the held page shows no notify address) and approves; the relay
    refuses the recipient (550): the send is ``rejected``, and its failure notice,
    "[delivery failed] <the agent's subject>", must not go to the stranger, whom no person let
    evq mail. The key's feed still has the rejection."""
    key = generate()
    await store.create_key(name="agent-always", role=Role.AGENT, key=key, created_by=None, approval=KeyApproval.ALWAYS)
    agent = Caller(key.text, interface="mcp")
    made = (
        await service.enqueue(
            store,
            agent,
            [request(run_id="r-lure", to=["reject@example.com"], notify=STRANGER, subject="You won a prize")],
            POLICY,
        )
    ).data
    assert step_row(db_url, made["id"])["status"] == "held"
    await approvals.approve(store, Caller(keys["operator"].text), made["id"], note="looks fine")
    with DevSmtpServer() as sink:
        await drain(store, sink)
        await drain(store, sink)  # any notice the first drain enqueued
        messages = sink.messages
    s = step_row(db_url, made["id"])
    assert (s["status"], s["reason"]) == ("rejected", "provider_rejected"), s
    assert not [m for m in messages if STRANGER in m["rcpt_tos"]], [m["rcpt_tos"] for m in messages]
    assert "notice_enqueued" not in evidence_kinds(db_url, made["id"])
    [feed] = rows(db_url, "SELECT * FROM key_events WHERE step = %s AND kind = 'rejected'", (made["id"],))
    assert feed["reason"] == "provider_rejected"
