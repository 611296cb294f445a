"""Content retention for real: a worker sends, then its housekeeping pass (the redactor it
runs) removes the bodies of the closed steps; the stored hash still proves what was sent."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from datetime import timedelta

from evq.adapters.postgres.store import PostgresStore
from evq.worker.config import WorkerConfig
from evq.worker.outcomes import Rejected, Retryable
from evq.worker.request import canonical_json
from evq.worker.runner import Worker
from tests.support import ScriptedProvider, evidence_kinds, rows, step_row, valid

SETTINGS = WorkerConfig(
    concurrency=5,
    batch_size=10,
    lease_seconds=30,
    poll_interval=0.05,
    retry_base=0,
    retry_max=0,
    rescue_interval=0.2,
    shutdown_grace=5,
    keep_content=0,
)


async def test_a_worker_run_then_its_housekeeping_pass_redacts_closed_steps_only(store: PostgresStore, db_url):
    sent = valid(run_id="keep", step_id="ok", text="Dear Ada, the contract is attached.", html="<p>Dear Ada</p>")
    refused = valid(run_id="keep", step_id="no")
    ok_id = (await store.enqueue(sent)).id
    no_id = (await store.enqueue(refused)).id
    # A step this worker does not send (another provider's): open, however long it waits.
    waiting = (await store.enqueue(valid(run_id="keep", step_id="wait", provider="null"))).id
    provider = ScriptedProvider(script={"keep/no": [Rejected("550 no such user")]})
    worker = Worker(store, {"smtp": provider}, SETTINGS)
    assert await worker.run(drain=True, install_signals=False) == 0
    assert [step_row(db_url, i)["status"] for i in (ok_id, no_id, waiting)] == ["accepted", "rejected", "pending"]
    # What the provider was given is the whole request (redaction happens after, never before).
    [given] = [c for c in provider.calls if c.step_id == ok_id]
    assert given.payload["text"] == sent.payload["text"]

    assert worker.redactor is not None
    counts = await worker.redactor.run_once()
    assert counts.redacted == 2
    row = step_row(db_url, ok_id)
    assert (row["payload"]["text"], row["payload"]["html"]) == (None, None)
    assert row["payload"]["to"] == sent.payload["to"] and row["payload"]["subject"] == sent.payload["subject"]
    # The proof stays: the hash of the request the test kept is the stored one.
    original = hashlib.sha256(canonical_json(sent.payload).encode()).hexdigest()
    assert row["payload_sha256"] == original == sent.payload_sha256
    parts = row["payload"]["content_redacted"]["parts"]
    assert parts["text"]["sha256"] == hashlib.sha256(sent.payload["text"].encode()).hexdigest()
    assert evidence_kinds(db_url, ok_id)[-1] == "content_redacted"
    assert rows(db_url, "SELECT actor FROM evidence WHERE kind = 'content_redacted' AND step_id = %s", (ok_id,)) == [
        {"actor": f"redactor@{worker.owner}"}
    ]
    # The open step keeps its body; a second pass finds nothing (idempotent).
    assert step_row(db_url, waiting)["payload"]["text"] is not None
    assert step_row(db_url, waiting)["content_redacted_at"] is None
    assert (await worker.redactor.run_once()).redacted == 0


async def test_a_step_closed_within_keep_or_kept_forever_keeps_its_body(store: PostgresStore, db_url):
    i = (await store.enqueue(valid(run_id="keep", step_id="recent"))).id
    j = (await store.enqueue(valid(run_id="keep", step_id="dead", max_attempts=1))).id
    provider = ScriptedProvider(script={"keep/dead": [Retryable("451 later")]})
    worker = Worker(store, {"smtp": provider}, replace(SETTINGS, keep_content=3600))
    assert await worker.run(drain=True, install_signals=False) == 0
    assert worker.redactor is not None and worker.redactor.config.keep == timedelta(hours=1)
    assert (await worker.redactor.run_once()).redacted == 0
    assert step_row(db_url, i)["payload"]["text"] is not None
    assert (step_row(db_url, j)["status"], step_row(db_url, j)["reason"]) == ("rejected", "attempts_exhausted")
    assert Worker(store, {"smtp": provider}, replace(SETTINGS, keep_content=None)).redactor is None
