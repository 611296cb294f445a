"""The dead-letter requeue (issue 12): a step whose retry budget ran out on temporary
failures only is requeued by an operator with `evq steps resolve ID --as retry`, with
evidence, and goes out once with the same Message-ID; a step that may have been
delivered, or that the provider refused, is never requeued."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

from evq.adapters.postgres.store import PostgresStore
from evq.adapters.smtp import SmtpProvider
from evq.ops.dev.smtp import DevSmtpServer
from evq.ops.settings import Settings
from evq.worker.runner import Worker
from tests.acceptance.conftest import Evq, make_key
from tests.support import rows, step_row, valid

SETTINGS = Settings(
    adapter=("smtp",),
    concurrency=2,
    batch_size=2,
    lease_seconds=30,
    poll_interval=0.05,
    retry_base=0.1,
    retry_max=0.2,
    rescue_interval=0.5,
    shutdown_grace=5,
    smtp_timeout=5,
    reconcile_checks=0,
    # A one-second budget, and no circuit on repeated 451s: the budget is what runs out.
    retry_for=1.0,
    circuit_failures=0,
)


async def _work_until(db_url: str, server: DevSmtpServer, settings: Settings, done) -> None:
    store = await PostgresStore.open(db_url, max_size=2)
    provider = SmtpProvider(host="127.0.0.1", port=server.port, timeout=5.0)
    worker = Worker(store, {"smtp": provider}, settings.worker_config())
    task = asyncio.create_task(worker.run(install_signals=False))
    try:
        deadline = time.monotonic() + 30
        while not done() and not task.done():
            assert time.monotonic() < deadline, "timed out"
            await asyncio.sleep(0.05)
    finally:
        worker.request_stop()
        assert await asyncio.wait_for(task, 30) == 0
        await provider.close()
        await store.close()


def _enqueue(db_url: str, **kw) -> int:
    async def go() -> int:
        store = await PostgresStore.open(db_url, max_size=1)
        try:
            return (await store.enqueue(valid(**kw))).id
        finally:
            await store.close()

    return asyncio.run(go())


def test_a_step_whose_retry_budget_ran_out_is_requeued_and_goes_out_once(db_url):
    operator = Evq(db_url, api_key=make_key(db_url, "ops-1", "operator"))
    with DevSmtpServer() as server:
        server.fault = "tempfail"  # 451 for every message: temporary, never delivered
        dead = _enqueue(db_url, step_id="dead")
        refused = _enqueue(db_url, step_id="refused", to=["reject@example.com"])
        asyncio.run(
            _work_until(
                db_url,
                server,
                SETTINGS,
                lambda: (
                    step_row(db_url, dead)["status"] == "rejected" and step_row(db_url, refused)["status"] == "rejected"
                ),
            )
        )
        row = step_row(db_url, dead)
        assert row["reason"] == "retry_budget_exhausted" and not row["maybe_delivered"] and row["attempts"] >= 2
        assert step_row(db_url, refused)["reason"] == "provider_rejected"
        assert server.messages == []

        # The provider refused this one for good: it is not a dead letter.
        error = operator.json("steps", "resolve", str(refused), "--as", "retry", "--note", "try again", expect=3)
        assert error["error"]["code"] == "E_CONFLICT"
        # A dead letter is requeued only as "retry", never closed again by hand.
        assert operator.json("steps", "resolve", str(dead), "--as", "accepted", "--note", "x", expect=3)
        dry = operator.json("steps", "resolve", str(dead), "--as", "retry", "--note", "451s over", "--dry-run")
        assert dry["data"]["steps"][0]["status"] == "rejected" and step_row(db_url, dead)["status"] == "rejected"

        done = operator.json(
            "steps", "resolve", str(dead), "--as", "retry", "--note", "the relay is fixed", "--reason", "relay_fixed"
        )
        [result] = done["data"]["results"]
        assert (result["from_status"], result["to_status"]) == ("rejected", "retryable")
        after = step_row(db_url, dead)
        assert after["status"] == "retryable" and after["closed_at"] is None and after["retry_from"] is not None
        assert after["attempts"] == row["attempts"]  # history kept: the attempt count is never rewound
        [ev] = rows(db_url, "SELECT * FROM evidence WHERE step_id = %s AND kind = 'operator_resolved'", (dead,))
        assert ev["actor"] == "ops-1" and (ev["from_status"], ev["to_status"]) == ("rejected", "retryable")
        assert ev["detail"]["requeued"] is True and ev["detail"]["note"] == "the relay is fixed"
        assert ev["detail"]["previous"]["reason"] == "retry_budget_exhausted"

        server.fault = None  # the relay is fixed
        asyncio.run(_work_until(db_url, server, SETTINGS, lambda: step_row(db_url, dead)["status"] == "accepted"))
        assert server.by_message_id() == {row["message_id"]: 1}
        assert step_row(db_url, dead)["message_id"] == row["message_id"]
        # Accepted is terminal: requeueing it again is a conflict.
        operator.json("steps", "resolve", str(dead), "--as", "retry", "--note", "again", expect=3)


def test_a_step_whose_attempts_ran_out_is_a_dead_letter_too_and_its_attempts_are_forgiven(db_url):
    operator = Evq(db_url, api_key=make_key(db_url, "ops-2", "operator"))
    settings = replace(SETTINGS, retry_for=3600.0, max_attempts=2)
    with DevSmtpServer() as server:
        server.fault = "tempfail"
        dead = _enqueue(db_url, step_id="spent")
        asyncio.run(_work_until(db_url, server, settings, lambda: step_row(db_url, dead)["status"] == "rejected"))
        assert step_row(db_url, dead)["reason"] == "attempts_exhausted"
        operator.json("steps", "resolve", str(dead), "--as", "retry", "--note", "relay fixed")
        row = step_row(db_url, dead)
        assert row["attempts"] == 2 and row["uncharged_attempts"] == 2  # forgiven, not forgotten
        server.fault = None
        asyncio.run(_work_until(db_url, server, settings, lambda: step_row(db_url, dead)["status"] == "accepted"))
        assert list(server.by_message_id().values()) == [1]


def test_a_retry_of_a_step_the_server_took_for_some_recipients_is_refused(db_url):
    """A server out of RCPTs (452 4.5.3 after one) takes the message for the first recipient,
    then drops the connection after the final '.' of the second transaction: `unknown`. The
    operator, seeing nothing for the second recipient, asks for a retry: that would deliver
    the same message to the first recipient twice, so it is refused and nothing changes."""
    operator = Evq(db_url, api_key=make_key(db_url, "ops-3", "operator"))
    with DevSmtpServer(max_recipients=1) as server:
        split = _enqueue(db_url, step_id="split", to=["ok@example.com", "lose-reply@example.com"])
        asyncio.run(_work_until(db_url, server, SETTINGS, lambda: step_row(db_url, split)["status"] == "unknown"))
        assert [m["rcpt_tos"] for m in server.messages] == [["ok@example.com"], ["lose-reply@example.com"]]
        error = operator.json("steps", "resolve", str(split), "--as", "retry", "--note", "not in the mailbox", expect=3)
        assert error["error"]["code"] == "E_CONFLICT" and "accepted this message" in error["error"]["message"]
        row = step_row(db_url, split)
        assert row["status"] == "unknown" and row["attempts"] == 1
        assert rows(db_url, "SELECT count(*) AS n FROM evidence WHERE kind = 'operator_resolved'")[0]["n"] == 0
        # Closing it stays possible, and is what the evidence supports.
        operator.json("steps", "resolve", str(split), "--as", "accepted", "--note", "the server took it")
        assert step_row(db_url, split)["status"] == "accepted"
    assert [m["rcpt_tos"] for m in server.messages] == [["ok@example.com"], ["lose-reply@example.com"]]
