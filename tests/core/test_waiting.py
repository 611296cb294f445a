"""`steps wait` (ops/app/waiting.py) against a store (a fresh PostgreSQL database), on a clock the test moves:
it answers at the first poll that sees the step worth acting on, backs off 0.1 s to 1 s, and
answers the view as it is at the timeout."""

from __future__ import annotations

from evq.ops.app.service import Caller
from evq.ops.app.waiting import wait_step
from evq.worker.backoff import Backoff
from evq.worker.outcomes import Accepted
from evq.worker.transitions import decide
from tests.support import unknown_steps, valid

READER = Caller(None, trusted_reader=True)


class Clock:
    """A monotonic clock that moves only when the wait sleeps; ``then`` runs at the n-th sleep."""

    def __init__(self, then=None, at: int = 0):
        self.now, self.sleeps, self.then, self.at = 0.0, [], then, at

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        if self.then is not None and len(self.sleeps) == self.at:
            await self.then()


async def _send(store) -> None:
    [claimed] = await store.claim(owner="w", providers=["smtp"], limit=1, lease_seconds=60, dedupe_windows={})
    done = decide(claimed, Accepted("p-1"), default_max_attempts=3, backoff=Backoff(1, 1), dedupe_window_open=False)
    await store.record([done], actor="w")


async def test_it_answers_at_the_first_poll_that_sees_the_step_sent(store):
    step = await store.enqueue(valid())
    clock = Clock(lambda: _send(store), at=4)
    reply = await wait_step(store, READER, step.id, timeout=30, unresolvable=(), clock=clock, sleep=clock.sleep)
    got = reply.data["step"]
    assert (got["status"], got["next_action"], got["safe_to_retry"]) == ("accepted", "none", False)
    assert reply.meta["timed_out"] is False
    assert clock.sleeps == [0.1, 0.2, 0.4, 0.8]  # doubling, and no sleep after it was seen


async def test_at_the_timeout_it_answers_the_step_as_it_is(store):
    step = await store.enqueue(valid())
    clock = Clock()
    reply = await wait_step(store, READER, step.id, timeout=5, unresolvable=(), clock=clock, sleep=clock.sleep)
    assert reply.meta["timed_out"] is True and reply.meta["waited_ms"] == 5000
    assert reply.data["step"]["next_action"] == "wait" and reply.data["step"]["status"] == "pending"
    assert max(clock.sleeps) == 1.0 and abs(sum(clock.sleeps) - 5) < 1e-9  # capped at 1 s; never past the timeout


async def test_an_unknown_step_waits_only_when_its_provider_can_settle_it(store):
    [lost] = await unknown_steps(store)
    clock = Clock()
    # smtp unresolvable: an operator is needed, so there is nothing to wait for.
    asked = await wait_step(store, READER, lost.id, timeout=3, unresolvable=("smtp",), clock=clock, sleep=clock.sleep)
    assert asked.data["step"]["next_action"] == "ask_operator" and clock.sleeps == []
    assert asked.meta["timed_out"] is False
    # smtp resolvable (a witness, a webhook): evq will settle it; the wait runs out.
    settling = await wait_step(store, READER, lost.id, timeout=3, unresolvable=(), clock=clock, sleep=clock.sleep)
    assert settling.data["step"]["next_action"] == "wait" and settling.meta["timed_out"] is True


async def test_a_caller_past_its_waits_at_once_is_answered_at_once_and_others_still_wait(store):
    """One key's many waits cannot take every connection: past its slots a wait answers as its
    timeout would, at once; another key still gets its wait, and a slot comes back when a wait ends."""
    import asyncio

    from evq.ops.app.waiting import WaitSlots
    from evq.worker.keys import Role, generate

    step = await store.enqueue(valid())
    slots = WaitSlots(total=3, per_caller=2)
    callers = []
    for name in ("greedy", "other"):
        key = generate()
        await store.create_key(name=name, role=Role.AGENT, key=key, created_by=None)
        callers.append(Caller(key.text, interface="http"))
    greedy, other = callers
    release = asyncio.Event()

    async def hold(seconds: float) -> None:
        await release.wait()

    async def waiting(caller: Caller, sleep=hold):
        return await wait_step(store, caller, step.id, timeout=30, unresolvable=(), sleep=sleep, slots=slots)

    held = [asyncio.create_task(waiting(greedy)) for _ in range(2)]
    await asyncio.sleep(0)
    at_once = await waiting(greedy, sleep=None)  # never sleeps: it has no slot
    assert at_once.meta["timed_out"] is True and at_once.meta["waited_ms"] < 1000
    third = asyncio.create_task(waiting(other))
    await asyncio.sleep(0)
    assert slots.by_caller and sum(slots.by_caller.values()) == 3
    assert (await waiting(other, sleep=None)).meta["timed_out"] is True  # the total is spent too
    release.set()
    await _send(store)
    for task in (*held, third):
        assert (await task).data["step"]["status"] == "accepted"
    assert slots.by_caller == {}  # every slot given back


async def test_a_held_step_is_waited_on_until_a_person_decides_then_until_it_is_sent(store):
    """Issue 30: every agent send may be held, so a wait waits through the hold. Nobody deciding:
    it runs to its timeout (timed_out, wait_for_approval: call again). Approved during the wait:
    it keeps waiting while the step is pending and answers once it is sent. Denied: it answers
    rejected at once."""
    from tests.support import held_steps

    [held] = await held_steps(store)
    clock = Clock()
    nobody = await wait_step(store, READER, held.id, timeout=5, unresolvable=(), clock=clock, sleep=clock.sleep)
    assert nobody.meta["timed_out"] is True and nobody.meta["waited_ms"] == 5000
    assert (nobody.data["step"]["status"], nobody.data["step"]["next_action"]) == ("held", "wait_for_approval")
    assert nobody.data["step"]["approval"]["wait"]["max_seconds"] == 60

    async def approve() -> None:
        await store.approve(held.id, actor="alice", actor_key_id="0123456789ab", note="fine")

    async def approve_then_send() -> None:
        clock.then = lambda: _send(store)  # a worker sends it three polls later
        clock.at = len(clock.sleeps) + 3
        await approve()

    clock = Clock(approve_then_send, at=2)
    sent = await wait_step(store, READER, held.id, timeout=30, unresolvable=(), clock=clock, sleep=clock.sleep)
    assert sent.meta["timed_out"] is False
    assert (sent.data["step"]["status"], sent.data["step"]["next_action"]) == ("accepted", "none")
    assert sent.data["step"]["approval"] is None
    assert len(clock.sleeps) == 5  # two polls held, three pending, answered at the poll that saw it sent

    [denied] = await held_steps(store)

    async def deny() -> None:
        await store.deny(denied.id, actor="alice", note="no")

    clock = Clock(deny, at=1)
    refused = await wait_step(store, READER, denied.id, timeout=30, unresolvable=(), clock=clock, sleep=clock.sleep)
    assert refused.meta["timed_out"] is False and len(clock.sleeps) == 1
    assert (refused.data["step"]["status"], refused.data["step"]["reason"]) == ("rejected", "denied")
