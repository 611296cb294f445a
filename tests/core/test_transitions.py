"""The state machine end to end: any sequence of outcomes, lease expiries and dedupe windows,
decided by worker/transitions.py and written through the in-memory store (which checks every
row against the schema's constraints), keeps the rules of docs/design.md, "States and transitions"."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from evq.worker.backoff import Backoff
from evq.worker.errors import StateConflict
from evq.worker.outcomes import Accepted, Rejected, Retryable, Unknown
from evq.worker.resolution import Resolution
from evq.worker.states import TRANSITIONS, Status
from evq.worker.transitions import decide
from tests.memstore import MemoryStore
from tests.support import valid

T0 = datetime(2030, 1, 1, tzinfo=UTC)
LEASE = 60.0
OUTCOMES = {
    "accepted": Accepted("pm"),
    "rejected": Rejected("550"),
    "policy": Rejected("blocked", before_send=True),
    "retryable": Retryable("451"),
    "fault": Retryable("refused", fault="connection_refused"),
    "unknown": Unknown("reset"),
}
VERDICTS = {"operator_retry": "retry", "operator_accepted": "accepted", "operator_rejected": "rejected"}
EVENTS = st.lists(st.sampled_from([*OUTCOMES, *VERDICTS, "lease_expired", "released"]), min_size=1, max_size=12)


async def play(events: list[str], window: float | None, max_attempts: int) -> MemoryStore:
    store = MemoryStore()
    e = await store.enqueue(valid(max_attempts=max_attempts), now=T0)
    now = T0
    windows = {} if window is None else {"smtp": window}
    for event in events:
        now += timedelta(hours=1)
        if event in VERDICTS:
            try:
                await store.resolve(
                    e.id, Resolution.parse(VERDICTS[event], "checked"), actor="op", default_max_attempts=3, now=now
                )
            except StateConflict:
                pass  # not unknown (nor a dead letter, for a retry): refused, nothing changed
            continue
        [*claimed] = await store.claim(
            owner="w", providers=["smtp"], limit=1, lease_seconds=LEASE, dedupe_windows=windows, now=now
        )
        if not claimed:
            await store.rescue(limit=10, lease_seconds=LEASE, default_max_attempts=3, actor="r", now=now)
            continue
        [step] = claimed
        if event == "released":
            await store.release([step], actor="w", now=now)
        elif event == "lease_expired":
            await store.rescue(
                limit=10, lease_seconds=LEASE, default_max_attempts=3, actor="r", now=now + timedelta(seconds=LEASE + 1)
            )
        else:
            open_ = step.dedupe_remaining is not None and step.dedupe_remaining > LEASE
            t = decide(
                step,
                OUTCOMES[event],
                default_max_attempts=3,
                backoff=Backoff(1, 1),
                dedupe_window_open=open_,
                charged=event != "fault",
            )
            await store.record([t], actor="w", now=now)
    assert e.id in store.steps
    return store


@settings(max_examples=150, deadline=None)
@given(events=EVENTS, window=st.sampled_from([None, 30.0, 7200.0, 86400.0]), max_attempts=st.integers(1, 4))
def test_every_history_keeps_the_state_machine_and_never_rejects_a_possible_delivery(events, window, max_attempts):
    store = asyncio.run(play(events, window, max_attempts))
    [row] = store.steps.values()
    moves = [(e["from_status"], e["to_status"]) for e in store.evidence if e["from_status"] and e["to_status"]]
    for before, after in moves:
        move = (Status(before), Status(after))
        assert before == after or move[1] in TRANSITIONS[move[0]], move
    started = sum(1 for e in store.evidence if e["kind"] == "attempt_started")
    released = sum(1 for e in store.evidence if e["kind"] == "attempt_released")
    assert row["attempts"] == started - released
    if row["maybe_delivered"] and row["reason"] != "operator":
        # A step that may have gone out is never called failed, unless an operator says so.
        assert row["status"] != "rejected"
    if row["status"] == "retryable" and row["maybe_delivered"]:
        assert row["dedupe_until"] is not None  # retried only under the provider's dedupe
    # An operator's retry of a step whose attempts are spent gives it one more.
    assert row["attempts"] - row["uncharged_attempts"] <= (row["max_attempts"] or 3)
