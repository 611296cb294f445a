"""The worker loop against a real database, with scripted providers: what needs PostgreSQL
itself (workers on their own pools, killed connections, LISTEN/NOTIFY). The loop's own logic
(stops, grace, lost answers, log context, an outcome that cannot be written) is tested
against a store in tests/core/test_worker.py."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import psycopg

from evq.adapters.postgres.store import PostgresStore
from evq.worker.config import WorkerConfig
from evq.worker.outcomes import Retryable
from evq.worker.runner import Worker
from tests.support import ScriptedProvider, evidence_kinds, rows, step_row, valid

SETTINGS = WorkerConfig(
    concurrency=20,
    batch_size=10,
    lease_seconds=30,
    poll_interval=0.05,
    retry_base=0,
    retry_max=0,
    rescue_interval=0.2,
    shutdown_grace=5,
)


async def enqueue(store: PostgresStore, n: int, **kw) -> list[int]:
    return [(await store.enqueue(valid(**kw))).id for _ in range(n)]


async def test_many_workers_send_every_row_exactly_once(store: PostgresStore, db_url: str):
    ids = await enqueue(store, 300)
    provider = ScriptedProvider(delay=0.001)
    stores = [await PostgresStore.open(db_url, max_size=3) for _ in range(4)]
    try:
        workers = [Worker(s, {"smtp": provider}, SETTINGS) for s in stores]
        codes = await asyncio.gather(*(w.run(drain=True, install_signals=False) for w in workers))
    finally:
        for s in stores:
            await s.close()
    assert codes == [0, 0, 0, 0]
    assert len(provider.calls) == 300 and set(provider.sent.values()) == {1}
    assert sum(w.stats.claimed for w in workers) == 300
    assert all(w.stats.claimed > 0 for w in workers), [w.stats.claimed for w in workers]
    counts = rows(db_url, "SELECT status, count(*) AS n FROM steps_now GROUP BY status")
    assert counts == [{"status": "accepted", "n": 300}]
    # Every step: one attempt started, one answer.
    per_step = rows(db_url, "SELECT step_id, count(*) AS n FROM evidence GROUP BY step_id HAVING count(*) <> 2")
    assert per_step == [] and len(ids) == 300


async def test_temporary_failures_retry_with_the_same_key_and_message_id(store, db_url):
    [i] = await enqueue(store, 1, step_id="flaky")
    provider = ScriptedProvider(script={"run-1/flaky": [Retryable("451 busy"), Retryable("421 closing")]})
    assert await Worker(store, {"smtp": provider}, SETTINGS).run(drain=True, install_signals=False) == 0
    row = step_row(db_url, i)
    assert row["status"] == "accepted" and row["attempts"] == 3
    assert {c.message_id for c in provider.calls} == {row["message_id"]}
    assert {c.idempotency_key for c in provider.calls} == {"run-1:flaky"}
    assert [c.attempt for c in provider.calls] == [1, 2, 3]


async def test_stop_releases_claims_not_yet_sent(store, db_url):
    ids = await enqueue(store, 4)
    provider = ScriptedProvider()

    class StopAfterClaim:
        """Asks the worker to stop the moment its claim returns, before any send begins."""

        def __getattr__(self, name):
            return getattr(store, name)

        async def claim(self, **kw):
            claimed = await store.claim(**kw)
            worker.request_stop()
            return claimed

    worker = Worker(StopAfterClaim(), {"smtp": provider}, replace(SETTINGS, batch_size=4))
    assert await worker.run(install_signals=False) == 0
    assert provider.calls == [] and worker.stats.released == 4
    for i in ids:
        row = step_row(db_url, i)
        assert row["status"] == "pending" and row["attempts"] == 0
        assert evidence_kinds(db_url, i) == ["attempt_started", "attempt_released"]


async def test_worker_survives_its_connections_being_killed(store, db_url):
    ids = await enqueue(store, 200)
    provider = ScriptedProvider(delay=0.005)
    own = await PostgresStore.open(db_url, max_size=2)
    worker = Worker(own, {"smtp": provider}, replace(SETTINGS, concurrency=10, batch_size=5))
    task = asyncio.create_task(worker.run(drain=True, install_signals=False))
    killed = 0
    for _ in range(3):
        await asyncio.sleep(0.15)
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as admin:
            cur = await admin.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND application_name = 'evq' AND pid <> pg_backend_pid()"
            )
            killed += (await cur.fetchone())[0]
    code = await asyncio.wait_for(task, 60)
    await own.close()
    assert killed > 0 and code == 0
    statuses = rows(db_url, "SELECT status, count(*) AS n FROM steps_now GROUP BY status ORDER BY status")
    assert sum(r["n"] for r in statuses) == 200
    # Nothing sent twice, nothing lost: outcomes that met a dead connection were
    # retried and recorded once the worker reconnected.
    assert set(provider.sent.values()) == {1} and len(provider.sent) == len(ids)
    assert statuses == [{"status": "accepted", "n": 200}]
    assert rows(db_url, "SELECT count(*) AS n FROM evidence WHERE kind = 'provider_response'")[0]["n"] == 200


async def test_an_idle_worker_wakes_on_notify_not_on_its_poll(store, db_url):
    """Enqueue notifies; the listening worker claims at once although its poll interval
    is an hour. Without the notification this test would wait for the poll and time out."""
    from evq.adapters.postgres.listen import PostgresWakeup

    class Watched(PostgresWakeup):
        def __init__(self, url: str):
            super().__init__(url)
            self.idle = asyncio.Event()  # the worker waits with no wakeup pending

        async def wait(self, timeout: float) -> bool:
            if not self._event.is_set():
                self.idle.set()
            try:
                return await super().wait(timeout)
            finally:
                self.idle.clear()

    wakeup = await Watched.start(db_url, mode="on")
    provider = ScriptedProvider()
    worker = Worker(store, {"smtp": provider}, replace(SETTINGS, poll_interval=3600), wakeup=wakeup)
    task = asyncio.create_task(worker.run(install_signals=False))
    try:
        await asyncio.wait_for(wakeup.idle.wait(), 30)
        [i] = await enqueue(store, 1, step_id="woken")
        deadline = asyncio.get_running_loop().time() + 30
        while step_row(db_url, i)["status"] != "accepted":
            assert asyncio.get_running_loop().time() < deadline, "the notification did not wake the worker"
            await asyncio.sleep(0.05)
    finally:
        worker.request_stop()
        code = await asyncio.wait_for(task, 30)
        await wakeup.close()
    assert code == 0 and len(provider.calls) == 1
