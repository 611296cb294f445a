"""Failure notices: one per step that ends rejected and named an address to tell,
enqueued in the transaction of the transition, never twice, never about a notice."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from email import message_from_bytes

import psycopg
import structlog

from evq.adapters.http import HttpProvider
from evq.adapters.postgres.notices import enqueue_notices
from evq.adapters.postgres.store import PostgresStore
from evq.adapters.smtp import SmtpProvider
from evq.ops.dev.http import DevHttpServer
from evq.ops.dev.smtp import DevSmtpServer
from evq.ops.settings import Settings
from evq.worker.backoff import Backoff
from evq.worker.notices import NoticeConfig
from evq.worker.outcomes import Accepted, Rejected, Retryable, Unknown
from evq.worker.request import Policy
from evq.worker.runner import Worker
from evq.worker.transitions import decide
from tests.support import WIRE_KEYS, ScriptedProvider, evidence_kinds, rows, step_row, valid

SETTINGS = Settings(
    adapter=("smtp",),
    concurrency=4,
    batch_size=4,
    lease_seconds=30,
    poll_interval=0.05,
    retry_base=0,
    retry_max=0,
    rescue_interval=0.2,
    shutdown_grace=5,
    smtp_timeout=5,
)
T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
NOTIFY = "agent-inbox@example.org"


def notices(db_url: str) -> list[dict]:
    return rows(db_url, "SELECT * FROM steps_now WHERE notice_of IS NOT NULL ORDER BY id")


async def run(store, provider, settings: Settings = SETTINGS) -> None:
    assert (
        await Worker(store, {provider.name: provider}, settings.worker_config()).run(drain=True, install_signals=False)
        == 0
    )


def settle(step, outcome):
    return decide(step, outcome, default_max_attempts=3, backoff=Backoff(0, 0), dedupe_window_open=False)


async def claim_one(store, *, now=T0):
    [step] = await store.claim(owner="w", providers=["smtp"], limit=1, lease_seconds=30, dedupe_windows={}, now=now)
    return step


async def test_a_rejected_step_sends_one_notice_to_its_notify_address(store, db_url):
    bounce = await store.enqueue(valid(step_id="bounce", notify=NOTIFY, to=["Ann <ann@example.com>"], subject="Offer"))
    fine = await store.enqueue(valid(step_id="fine", notify=NOTIFY))
    provider = ScriptedProvider(script={"run-1/bounce": [Rejected("smtp 550 at rcpt: no such user")]})
    await run(store, provider)

    [notice] = notices(db_url)
    assert notice["notice_of"] == bounce.id and notice["notify"] is None
    assert notice["step_id"] == "evq:notice:rejected:bounce" and notice["run_id"] == "run-1"
    assert notice["idempotency_key"] == "evq:notice:rejected:run-1:bounce"
    assert notice["status"] == "accepted"  # the worker sent it like any other step
    p = notice["payload"]
    assert p["from"] == {"email": "evq-notices@example.org", "name": "evq"} and p["to"][0]["email"] == NOTIFY
    assert p["subject"] == "[delivery failed] Offer"
    assert p["headers"] == {
        "Auto-Submitted": "auto-generated",
        "In-Reply-To": bounce.message_id,
        "References": bounce.message_id,
    }
    text = p["text"]
    for expected in (
        "did not go out",
        "Ann <ann@example.com>",
        "smtp 550 at rcpt: no such user",
        "provider_rejected",
        "refused this message for good",
        f"evq steps show {bounce.id}",
    ):
        assert expected in text, expected
    decision = rows(db_url, "SELECT * FROM decisions WHERE id = %s", (notice["decision_id"],))[0]
    assert decision["tool"] == "evq-notice" and decision["rationale"]["notice_of"] == bounce.id
    assert evidence_kinds(db_url, bounce.id) == ["attempt_started", "provider_response", "notice_enqueued"]
    told = rows(db_url, "SELECT * FROM evidence WHERE kind = 'notice_enqueued'")[0]
    assert told["detail"]["notice_step"] == notice["id"] and told["detail"]["to"] == NOTIFY
    assert step_row(db_url, fine.id)["status"] == "accepted"


async def test_no_notify_address_means_no_notice(store, db_url):
    await store.enqueue(valid(step_id="bounce"))
    await run(store, ScriptedProvider(script={"run-1/bounce": [Rejected("550")]}))
    assert notices(db_url) == []


async def test_a_notice_that_fails_causes_no_notice(store, db_url):
    await store.enqueue(valid(step_id="bounce", notify=NOTIFY))
    provider = ScriptedProvider(
        script={
            "run-1/bounce": [Rejected("550 no such user")],
            "run-1/notice:rejected:run-1:bounce": [Rejected("550 no such mailbox")],
        }
    )
    await run(store, provider)
    [notice] = notices(db_url)
    assert notice["status"] == "rejected"
    assert rows(db_url, "SELECT count(*) AS n FROM steps_now")[0]["n"] == 2


async def test_a_transition_recorded_twice_sends_one_notice(store, db_url):
    """The commit's acknowledgement was lost and the recorder wrote the outcome again."""
    e = await store.enqueue(valid(notify=NOTIFY), now=T0)
    rejected = settle(await claim_one(store), Rejected("550"))
    [first] = await store.record([rejected], actor="w", now=T0)
    [again] = await store.record([rejected], actor="w", now=T0)
    assert first.applied and again.duplicate
    assert [n["notice_of"] for n in notices(db_url)] == [e.id]
    assert evidence_kinds(db_url, e.id).count("notice_enqueued") == 1


async def test_a_late_rejection_that_settles_a_rescued_row_sends_one_notice(store, db_url):
    e = await store.enqueue(valid(notify=NOTIFY), now=T0)
    step = await claim_one(store)
    later = T0 + timedelta(seconds=31)
    assert (await store.rescue(limit=10, lease_seconds=30, default_max_attempts=3, actor="r", now=later)).unknown == 1
    assert notices(db_url) == []  # unknown is not rejected (and unknown notices are off)
    [late] = await store.record([settle(step, Rejected("550"))], actor="w", now=later)
    assert late.settled and step_row(db_url, e.id)["status"] == "rejected"
    await store.record([settle(step, Rejected("550"))], actor="w", now=later)
    assert [n["notice_of"] for n in notices(db_url)] == [e.id]


async def test_exhausted_attempts_send_a_notice_with_their_advice(store, db_url):
    await store.enqueue(valid(step_id="flaky", notify=NOTIFY, max_attempts=2))
    await run(store, ScriptedProvider(script={"run-1/flaky": [Retryable("451 busy"), Retryable("451 busy")]}))
    [notice] = notices(db_url)
    assert "attempts_exhausted" in notice["payload"]["text"]
    assert "failed temporarily on every attempt" in notice["payload"]["text"]


async def test_a_policy_refusal_at_send_time_sends_a_notice_through_the_same_provider(store, db_url):
    """Refused by the adapter's re-check (example.com now blocked): nothing reached the
    provider but the notice, which goes to the (allowed) notify address."""
    e = await store.enqueue(valid(provider="http", notify=NOTIFY, to=["ann@example.com"]))
    settings = Settings(
        adapter=("http",),
        http_api_key="devhttp-key",
        http_timeout=1,
        lease_seconds=30,
        poll_interval=0.05,
        retry_base=0,
        retry_max=0,
    )
    with DevHttpServer() as api:
        http = HttpProvider(
            base_url=api.url,
            api_key="devhttp-key",
            policy=Policy(blocked_domains=("example.com",)),
            wire_keys=WIRE_KEYS,
        )
        try:
            await run(store, http, settings)
        finally:
            await http.close()
        [message] = api.messages
    row = step_row(db_url, e.id)
    assert row["status"] == "rejected" and row["reason"] == "policy_refused"
    [notice] = notices(db_url)
    assert notice["status"] == "accepted" and "evq's own policy refused" in notice["payload"]["text"]
    assert message["from"] == '"evq" <evq-notices@example.org>' and message["to"] == [NOTIFY]


async def test_an_operator_close_enqueues_its_notice_in_its_own_transaction(store, db_url):
    """The resolve path: its statement and the notice commit together, or neither does."""
    e = await store.enqueue(valid(notify=NOTIFY), now=T0)
    await store.record([settle(await claim_one(store), Unknown("reset"))], actor="w", now=T0)
    close = (
        "UPDATE email_steps SET status = 'rejected', reason = 'operator', detail = 'not in the mail log', "
        "unknown_since = NULL, closed_at = now() WHERE id = %s AND status = 'unknown'"
    )

    # A sync caller (a psycopg connection) whose transaction rolls back leaves no notice.
    with psycopg.connect(db_url) as conn:
        with conn.transaction(force_rollback=True):
            conn.execute(close, (e.id,))
            assert len(enqueue_notices(conn, [e.id], config=NoticeConfig(), actor="operator:ada")) == 1
    assert notices(db_url) == [] and step_row(db_url, e.id)["status"] == "unknown"

    async with store.transaction("resolve") as conn:
        await conn.execute(close, (e.id,))
        created = await store.enqueue_notices([e.id], actor="operator:ada")
    assert [of for _, of in created] == [e.id]
    assert await store.enqueue_notices([e.id], actor="operator:ada") == []  # a repeat changes nothing
    [notice] = notices(db_url)
    assert "An operator checked this send" in notice["payload"]["text"]
    assert "not in the mail log" in notice["payload"]["text"]


async def test_a_notice_on_unknown_when_configured(db_url):
    store = await PostgresStore.open(db_url, notices=NoticeConfig(on_unknown=True))
    try:
        a = await store.enqueue(valid(notify=NOTIFY), now=T0)
        b = await store.enqueue(valid(notify=NOTIFY), now=T0)
        [sa, _] = await store.claim(owner="w", providers=["smtp"], limit=2, lease_seconds=30, dedupe_windows={}, now=T0)
        await store.record([settle(sa, Unknown("reset after the final dot"))], actor="w", now=T0)
        # b's worker dies: the rescuer makes it unknown, and its notice goes in the same transaction.
        later = T0 + timedelta(seconds=31)
        assert (
            await store.rescue(limit=10, lease_seconds=30, default_max_attempts=3, actor="r", now=later)
        ).unknown == 1
        sent = notices(db_url)
        assert [(n["notice_of"], n["step_id"].split(":")[2]) for n in sent] == [(a.id, "unknown"), (b.id, "unknown")]
        assert sent[0]["payload"]["subject"].startswith("[delivery uncertain] ")
        assert "do not send it again yourself" in sent[0]["payload"]["text"]
        # Closed as rejected later: that is a second, different notice; recording it again is not.
        async with store.transaction("resolve") as conn:
            await conn.execute(
                "UPDATE email_steps SET status = 'rejected', reason = 'operator', unknown_since = NULL, "
                "closed_at = now() WHERE id = %s",
                (a.id,),
            )
            await store.enqueue_notices([a.id], actor="operator")
        await store.enqueue_notices([a.id], actor="operator")
        assert [n["step_id"] for n in notices(db_url) if n["notice_of"] == a.id] == [
            f"evq:notice:unknown:{sa.step_id}",
            f"evq:notice:rejected:{sa.step_id}",
        ]
    finally:
        await store.close()


async def test_the_configured_sender_is_used(db_url):
    store = await PostgresStore.open(db_url, notices=NoticeConfig(sender="postmaster@evq.example.net"))
    try:
        await store.enqueue(valid(notify=NOTIFY), now=T0)
        await store.record([settle(await claim_one(store), Rejected("550"))], actor="w", now=T0)
    finally:
        await store.close()
    assert notices(db_url)[0]["payload"]["from"]["email"] == "postmaster@evq.example.net"


async def test_the_notice_is_delivered_over_smtp(store, db_url):
    with DevSmtpServer() as sink:
        e = await store.enqueue(valid(step_id="invite", to=["reject@example.net"], notify=NOTIFY))
        smtp = SmtpProvider(host=sink.host, port=sink.port, timeout=5)
        try:
            await run(store, smtp)
        finally:
            await smtp.close()
        [message] = sink.wait_for(1)
    assert step_row(db_url, e.id)["status"] == "rejected"
    assert message["rcpt_tos"] == [NOTIFY] and message["mail_from"] == "evq-notices@example.org"
    header = message_from_bytes(message["data"])
    assert header["Subject"].startswith("[delivery failed] ") and header["Auto-Submitted"] == "auto-generated"
    assert header["References"] == e.message_id


async def test_a_batch_with_a_rejection_records_all_of_it(store, db_url):
    ids = [(await store.enqueue(valid(notify=NOTIFY), now=T0)).id for _ in range(3)]
    steps = await store.claim(owner="w", providers=["smtp"], limit=3, lease_seconds=30, dedupe_windows={}, now=T0)
    outcomes = {ids[0]: Accepted("q1"), ids[1]: Rejected("550"), ids[2]: Retryable("451")}
    results = await store.record([settle(s, outcomes[s.id]) for s in steps], actor="w", now=T0)
    assert all(r.applied for r in results)
    assert [step_row(db_url, i)["status"] for i in ids] == ["accepted", "rejected", "retryable"]
    assert [n["notice_of"] for n in notices(db_url)] == [ids[1]]


async def test_a_notice_that_cannot_be_built_never_holds_back_the_outcome(store, db_url):
    """A row written by something other than the validator (no sender in its payload):
    the rejection and the rest of its batch are recorded; the failure is logged."""
    bad = await store.enqueue(valid(notify=NOTIFY), now=T0)
    good = await store.enqueue(valid(notify=NOTIFY), now=T0)
    rows(db_url, "UPDATE email_steps SET payload = payload - 'from' WHERE id = %s RETURNING id", (bad.id,))
    steps = await store.claim(owner="w", providers=["smtp"], limit=2, lease_seconds=30, dedupe_windows={}, now=T0)
    with structlog.testing.capture_logs() as logs:
        results = await store.record([settle(s, Rejected("550")) for s in steps], actor="w", now=T0)
    assert all(r.applied for r in results)
    assert {step_row(db_url, i)["status"] for i in (bad.id, good.id)} == {"rejected"}
    assert [n["notice_of"] for n in notices(db_url)] == [good.id]
    assert [e["step"] for e in logs if e["event"] == "notice_not_built"] == [bad.id]
