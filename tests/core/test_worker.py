"""The worker loop against a store (a fresh PostgreSQL database), with scripted providers and
faults injected by wrapping the store (tests/integration/test_worker.py keeps killed
connections, LISTEN/NOTIFY and workers on separate connections)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import structlog

from evq.worker.config import WorkerConfig
from evq.worker.errors import DatabaseUnavailable
from evq.worker.logs import merge_step
from evq.worker.outcomes import Retryable, Unknown
from evq.worker.runner import Worker
from evq.worker.states import TRANSITIONS, Status
from tests.storeview import evidence, kinds, statuses, step, steps
from tests.support import ScriptedProvider, valid

SETTINGS = WorkerConfig(
    concurrency=20,
    batch_size=10,
    lease_seconds=30,
    poll_interval=0.02,
    retry_base=0,
    retry_max=0,
    rescue_interval=0.2,
    shutdown_grace=5,
)


async def enqueue(store: Any, n: int, **kw) -> list[int]:
    return [(await store.enqueue(valid(**kw))).id for _ in range(n)]


async def status(store: Any, step_id: int) -> str:
    return str((await step(store, step_id))["status"])


async def moves_follow_the_state_machine(store: Any) -> bool:
    """Every status change the evidence records is one worker/states.py allows."""
    return all(
        Status(e["to_status"]) in TRANSITIONS[Status(e["from_status"])]
        for e in await evidence(store)
        if e["from_status"] and e["to_status"] and e["from_status"] != e["to_status"]
    )


async def test_many_workers_send_every_row_exactly_once(store):
    await enqueue(store, 300)
    provider = ScriptedProvider(delay=0.001)
    workers = [Worker(store, {"smtp": provider}, SETTINGS) for _ in range(4)]
    codes = await asyncio.gather(*(w.run(drain=True, install_signals=False) for w in workers))
    assert codes == [0, 0, 0, 0]
    assert len(provider.calls) == 300 and set(provider.sent.values()) == {1}
    assert sum(w.stats.claimed for w in workers) == 300
    assert all(w.stats.claimed > 0 for w in workers), [w.stats.claimed for w in workers]
    assert await statuses(store) == {"accepted": 300}
    every = await evidence(store)
    assert all(
        [e["kind"] for e in every if e["step_id"] == s["id"]] == ["attempt_started", "provider_response"]
        for s in await steps(store)
    )
    assert await moves_follow_the_state_machine(store)


async def test_lost_response_ends_unknown_and_is_never_resent(store):
    [i] = await enqueue(store, 1, step_id="lost")
    provider = ScriptedProvider(script={"run-1/lost": [Unknown("connection reset after the final dot")]})
    assert await Worker(store, {"smtp": provider}, SETTINGS).run(drain=True, install_signals=False) == 0
    assert await status(store, i) == "unknown"
    # A second worker finds nothing to do: the ambiguous send waits for a person.
    assert await Worker(store, {"smtp": provider}, SETTINGS).run(drain=True, install_signals=False) == 0
    assert len(provider.calls) == 1
    assert await kinds(store, i) == ["attempt_started", "provider_response"]


async def test_temporary_failures_retry_with_the_same_key_and_message_id(store):
    [i] = await enqueue(store, 1, step_id="flaky")
    provider = ScriptedProvider(script={"run-1/flaky": [Retryable("451 busy"), Retryable("421 closing")]})
    assert await Worker(store, {"smtp": provider}, SETTINGS).run(drain=True, install_signals=False) == 0
    row = await step(store, i)
    assert row["status"] == "accepted" and row["attempts"] == 3
    assert {c.message_id for c in provider.calls} == {row["message_id"]}
    assert {c.idempotency_key for c in provider.calls} == {"run-1:flaky"}
    assert [c.attempt for c in provider.calls] == [1, 2, 3]
    assert await moves_follow_the_state_machine(store)


async def test_spent_attempts_end_rejected_and_a_possible_delivery_ends_unknown(store):
    [spent] = await enqueue(store, 1, step_id="spent", max_attempts=2)
    [maybe] = await enqueue(store, 1, step_id="maybe", max_attempts=2)
    provider = ScriptedProvider(
        script={"run-1/spent": [Retryable("451")] * 2, "run-1/maybe": [Unknown("timeout"), Retryable("451")]}
    )
    provider.dedupe_window = 3600  # the ambiguous first attempt may retry under the provider's dedupe
    worker = Worker(store, {"smtp": provider}, SETTINGS)
    assert await worker.run(drain=True, install_signals=False) == 0
    spent_row, maybe_row = await step(store, spent), await step(store, maybe)
    assert (spent_row["status"], spent_row["reason"]) == ("rejected", "attempts_exhausted")
    assert (maybe_row["status"], maybe_row["reason"]) == ("unknown", "attempts_exhausted")
    assert maybe_row["maybe_delivered"] and len(provider.calls) == 4


async def test_graceful_stop_finishes_in_flight_sends(store):
    ids = await enqueue(store, 5)
    gate = asyncio.Event()
    provider = ScriptedProvider(gate=gate)
    worker = Worker(store, {"smtp": provider}, SETTINGS)
    task = asyncio.create_task(worker.run(install_signals=False))
    while provider.in_send < 5:
        await asyncio.sleep(0.01)
    worker.request_stop()
    await asyncio.sleep(0.05)
    assert not task.done()  # still waiting for the sends in flight
    gate.set()
    assert await asyncio.wait_for(task, 5) == 0
    assert {await status(store, i) for i in ids} == {"accepted"}


async def test_stop_releases_claims_not_yet_sent(store):
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
        row = await step(store, i)
        assert (row["status"], row["attempts"]) == ("pending", 0)
        assert await kinds(store, i) == ["attempt_started", "attempt_released"]


async def test_grace_expiry_leaves_the_row_to_the_rescuer(store):
    [i] = await enqueue(store, 1)
    provider = ScriptedProvider(gate=asyncio.Event())  # never opens
    worker = Worker(store, {"smtp": provider}, replace(SETTINGS, shutdown_grace=0.1))
    task = asyncio.create_task(worker.run(install_signals=False))
    while provider.in_send < 1:
        await asyncio.sleep(0.01)
    worker.request_stop()
    assert await asyncio.wait_for(task, 5) == 1
    assert await status(store, i) == "in_flight"  # the rescuer's, after the lease
    # A worker started after the lease ran out rescues it first: unknown, never sent again.
    later = datetime.now(UTC) + timedelta(seconds=SETTINGS.lease_seconds + 1)

    class AfterTheLease:
        """The store, whose rescues run on a clock past the lease."""

        def __getattr__(self, name):
            return getattr(store, name)

        async def rescue(self, **kw):
            return await store.rescue(**{**kw, "now": later})

    assert await Worker(AfterTheLease(), {"smtp": provider}, SETTINGS).run(drain=True, install_signals=False) == 0
    assert await status(store, i) == "unknown" and len(provider.calls) == 1


async def test_a_claim_whose_answer_is_lost_is_handed_back_never_sent(store):
    ids = await enqueue(store, 3)
    provider = ScriptedProvider()

    class LosesFirstClaim:
        lost = 0

        def __getattr__(self, name):
            return getattr(store, name)

        async def claim(self, **kw):
            claimed = await store.claim(**kw)
            if not self.lost:
                self.lost = len(claimed)
                raise DatabaseUnavailable("the connection dropped as the claim committed")
            return claimed

    lossy = LosesFirstClaim()
    assert await Worker(lossy, {"smtp": provider}, SETTINGS).run(drain=True, install_signals=False) == 0
    assert lossy.lost == 3
    assert {await status(store, i) for i in ids} == {"accepted"} and set(provider.sent.values()) == {1}
    for i in ids:
        assert await kinds(store, i) == ["attempt_started", "attempt_released", "attempt_started", "provider_response"]


async def test_a_claim_answered_past_its_send_by_limit_is_handed_back_never_sent(store):
    """A claim that waited for a connection (the database restarting) is answered with less
    of the lease left, by the worker's count, than a send may begin in. Its rows were once
    each sent to the adapter anyway, cut off before connecting: an attempt spent, the
    provider blamed, a second answer for the step. They are handed back instead, uncounted."""
    ids = await enqueue(store, 3)
    in_time: list[bool] = []

    class Timed(ScriptedProvider):
        async def send(self, request):
            in_time.append(time.monotonic() < request.send_by)
            return await super().send(request)

    provider = Timed()
    settings = replace(SETTINGS, lease_seconds=2)  # sends may begin for its first second

    class SlowFirstClaim:
        slowed = False

        def __getattr__(self, name):
            return getattr(store, name)

        async def claim(self, **kw):
            if not self.slowed:
                self.slowed = True
                await asyncio.sleep(1.2)  # waiting for a connection, before the statement is sent
            return await store.claim(**kw)

    slow = SlowFirstClaim()
    assert await Worker(slow, {"smtp": provider}, settings).run(drain=True, install_signals=False) == 0
    assert slow.slowed
    assert {await status(store, i) for i in ids} == {"accepted"} and set(provider.sent.values()) == {1}
    assert [r.attempt for r in provider.calls] == [1, 1, 1] and in_time == [True, True, True]
    for i in ids:
        assert await kinds(store, i) == ["attempt_started", "attempt_released", "attempt_started", "provider_response"]


async def test_every_log_line_of_a_send_carries_the_steps_identity(store):
    [i] = await enqueue(store, 1, step_id="logged", run_id="run-log")
    provider = ScriptedProvider(script={"run-log/logged": [Retryable("451 busy")]})
    with structlog.testing.capture_logs(processors=[structlog.contextvars.merge_contextvars, merge_step]) as logs:
        await Worker(store, {"smtp": provider}, SETTINGS).run(drain=True, install_signals=False)
    sends = [e for e in logs if e["event"] in ("send_recorded", "send_accepted")]
    assert len(sends) == 2
    for event in sends:
        assert event["run_id"] == "run-log" and event["step_id"] == "logged" and event["step"] == i
        assert event["idempotency_key"] == "run-log:logged" and event["attempt"] in (1, 2)


async def test_an_outcome_that_cannot_be_written_is_retried_never_released_and_holds_back_only_itself(store):
    """An error nobody classified while recording (every write of one step's outcome fails)
    is retried with backoff; the other outcomes of its batch are written one by one; the
    send that began is never handed back, even after a lost claim makes the worker look for
    orphans; once its lease is gone the rescuer makes it unknown."""
    ids = await enqueue(store, 4)
    poisoned = ids[0]
    provider = ScriptedProvider()
    writes = {"failed": 0, "claims": 0}

    class PoisonedStore:
        def __getattr__(self, name):
            return getattr(store, name)

        async def record(self, transitions, **kw):
            if any(t.step_id == poisoned for t in transitions):
                writes["failed"] += 1
                raise RuntimeError("a write that always fails")
            return await store.record(transitions, **kw)

        async def claim(self, **kw):
            # The second claim commits and then its answer is lost: the worker looks for orphans.
            writes["claims"] += 1
            claimed = await store.claim(**kw)
            if writes["claims"] == 2:
                raise DatabaseUnavailable("the connection was lost as the claim committed")
            return claimed

    worker = Worker(PoisonedStore(), {"smtp": provider}, replace(SETTINGS, batch_size=4, shutdown_grace=0.3))
    task = asyncio.create_task(worker.run(install_signals=False))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while loop.time() < deadline and not (
        [await status(store, i) for i in ids[1:]] == ["accepted"] * 3 and writes["failed"] >= 3
    ):
        await asyncio.sleep(0.02)
    assert [await status(store, i) for i in ids] == ["in_flight", "accepted", "accepted", "accepted"]
    worker.request_stop()
    assert await asyncio.wait_for(task, 10) == 1  # the poisoned outcome was still being retried
    assert len(provider.calls) == 4 and set(provider.sent.values()) == {1}
    assert "attempt_released" not in await kinds(store, poisoned)
    later = datetime.now(UTC) + timedelta(seconds=SETTINGS.lease_seconds + 1)
    await store.rescue(limit=10, lease_seconds=SETTINGS.lease_seconds, default_max_attempts=5, actor="r", now=later)
    assert await status(store, poisoned) == "unknown"
    assert await kinds(store, poisoned) == ["attempt_started", "lease_expired"]


async def test_a_claim_lost_while_a_rescuer_pass_hands_back_an_older_one_is_still_handed_back(store):
    """The rescuer pass hands back lost claims beside the claim loop. A claim lost while that
    pass waited on the database must still be handed back before the loop claims again: the
    pass once cleared the loop's "check for orphans" on returning, so a drain claimed
    nothing (the rows in flight under the lost claim), ended, and left them pending unsent
    (seen in tests/faults/test_store_faults.py under a loaded suite)."""
    ids = await enqueue(store, 2)
    provider = ScriptedProvider()
    rescuer_waiting, second_lost = asyncio.Event(), asyncio.Event()

    class Racing:
        claims = 0
        blocked = False

        def __getattr__(self, name):
            return getattr(store, name)

        async def claim(self, **kw):
            self.claims += 1
            if self.claims == 1:
                raise DatabaseUnavailable("the connection dropped before the claim ran")
            if self.claims == 2:
                # Only once the rescuer's pass is waiting on its hand-back of the first.
                await asyncio.wait_for(rescuer_waiting.wait(), 10)
                await store.claim(**kw)
                second_lost.set()
                raise DatabaseUnavailable("the connection dropped as the claim committed")
            return await store.claim(**kw)

        async def release_orphans(self, **kw):
            task = asyncio.current_task()
            if not self.blocked and task is not None and task.get_name() == "evq-rescuer":
                self.blocked = True
                rescuer_waiting.set()
                await second_lost.wait()
                await asyncio.sleep(0)  # the loop records the second claim as lost first
            return await store.release_orphans(**kw)

    racing = Racing()
    # Passes far apart, so no later pass hands the second claim back before the loop claims.
    worker = Worker(racing, {"smtp": provider}, replace(SETTINGS, rescue_interval=3))
    assert await asyncio.wait_for(worker.run(drain=True, install_signals=False), 30) == 0
    assert racing.blocked and second_lost.is_set()
    assert {await status(store, i) for i in ids} == {"accepted"} and set(provider.sent.values()) == {1}


async def test_a_drain_does_not_end_while_a_rescuer_pass_is_handing_back_a_lost_claim(store):
    """The rescuer pass takes a lost claim from the loop's list and clears the loop's "check
    for orphans" before its hand-back commits; the loop, finding the flag clear, claimed
    nothing (the rows were still in flight under the lost claim), asked whether anything was
    claimable (no), and the drain ended; the hand-back then made the rows pending, unsent, for
    whoever relies on `--drain` (seen in tests/faults/test_store_faults.py: "ended pending").
    Ordered here: the rescuer's hand-back waits until the loop has looked for work itself."""
    ids = await enqueue(store, 2)
    provider = ScriptedProvider()
    rescuer_has_it, loop_looked = asyncio.Event(), asyncio.Event()
    hand_backs: list[str] = []  # which task asked to hand back the lost claim, in order

    class Racing:
        lost: str | None = None

        def __getattr__(self, name):
            return getattr(store, name)

        async def claim(self, **kw):
            got = await store.claim(**kw)
            if got and self.lost is None:
                self.lost = kw["claim_id"]
                raise DatabaseUnavailable("the connection dropped as the claim committed")
            return got

        async def release_orphans(self, **kw):
            if self.lost in kw["claims"]:
                task = asyncio.current_task()
                name = task.get_name() if task is not None else ""
                hand_backs.append(name)
                if name == "evq-rescuer" and not rescuer_has_it.is_set():
                    rescuer_has_it.set()
                    await loop_looked.wait()
                else:
                    loop_looked.set()
            return await store.release_orphans(**kw)

        async def claimable_exists(self, **kw):
            answer = await store.claimable_exists(**kw)
            if rescuer_has_it.is_set():
                loop_looked.set()  # the loop has its answer: now the rescuer's hand-back commits
            return answer

    racing = Racing()
    # Rescuer passes far more often than the loop's reconnect delay (0.2 s at least): the pass
    # after the loss comes first, as asyncio runs timers in the order they are due.
    worker = Worker(racing, {"smtp": provider}, replace(SETTINGS, rescue_interval=0.01))
    assert await asyncio.wait_for(worker.run(drain=True, install_signals=False), 30) == 0
    assert racing.lost is not None and hand_backs[0] == "evq-rescuer", hand_backs
    assert {await status(store, i) for i in ids} == {"accepted"}, await statuses(store)
    assert set(provider.sent.values()) == {1} and len(provider.sent) == 2
