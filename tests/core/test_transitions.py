"""The state machine end to end: any sequence of outcomes, lease expiries and dedupe windows,
decided by worker/transitions.py and written through the store (PostgreSQL, whose constraints
check every row), keeps the rules of docs/design.md, "States and transitions".

Every example plays one step in the same database, on a provider of its own: a claim takes only
that provider's steps, and the rescues (which take any expired lease) only move steps whose
examples are over, so the examples do not see each other and pay for one database, not 150."""

from __future__ import annotations

import asyncio
import itertools
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from evq.worker.backoff import Backoff
from evq.worker.errors import StateConflict
from evq.worker.outcomes import Accepted, Rejected, Retryable, Unknown
from evq.worker.request import Policy, parse
from evq.worker.resolution import Resolution
from evq.worker.states import TRANSITIONS, Status
from evq.worker.transitions import decide
from tests.support import request

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


_providers = (f"p{n}" for n in itertools.count())


async def play(store: Any, provider: str, events: list[str], window: float | None, max_attempts: int) -> tuple:
    made = parse(
        request(max_attempts=max_attempts, provider=provider), Policy(providers=(provider,), default_provider=provider)
    )
    e = await store.enqueue(made, now=T0)
    now = T0
    windows = {} if window is None else {provider: window}
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
            owner="w", providers=[provider], limit=1, lease_seconds=LEASE, dedupe_windows=windows, now=now
        )
        if not claimed:
            await store.rescue(limit=1000, lease_seconds=LEASE, default_max_attempts=3, actor="r", now=now)
            continue
        [step] = claimed
        if event == "released":
            await store.release([step], actor="w", now=now)
        elif event == "lease_expired":
            await store.rescue(
                limit=1000,
                lease_seconds=LEASE,
                default_max_attempts=3,
                actor="r",
                now=now + timedelta(seconds=LEASE + 1),
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
    detail = await store.get_step(e.id)
    return detail.step, detail.evidence


def test_every_history_keeps_the_state_machine_and_never_rejects_a_possible_delivery(db_url):
    from evq.adapters.postgres.store import PostgresStore

    # One database and one store for every example (see the docstring), on one event loop.
    loop = asyncio.new_event_loop()
    store = loop.run_until_complete(PostgresStore.open(db_url, max_size=1))

    @settings(max_examples=150, deadline=None)
    @given(events=EVENTS, window=st.sampled_from([None, 30.0, 7200.0, 86400.0]), max_attempts=st.integers(1, 4))
    def history(events, window, max_attempts):
        row, rows = loop.run_until_complete(play(store, next(_providers), events, window, max_attempts))
        keeps_the_rules(row, rows)

    try:
        history()
    finally:
        loop.run_until_complete(store.close())
        loop.close()


def keeps_the_rules(row: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    moves = [(e["from_status"], e["to_status"]) for e in rows if e["from_status"] and e["to_status"]]
    for before, after in moves:
        move = (Status(before), Status(after))
        assert before == after or move[1] in TRANSITIONS[move[0]], move
    started = sum(1 for e in rows if e["kind"] == "attempt_started")
    released = sum(1 for e in rows if e["kind"] == "attempt_released")
    assert row["attempts"] == started - released
    if row["maybe_delivered"] and row["reason"] != "operator":
        # A step that may have gone out is never called failed, unless an operator says so.
        assert row["status"] != "rejected"
    if row["status"] == "retryable" and row["maybe_delivered"]:
        assert row["dedupe_until"] is not None  # retried only under the provider's dedupe
    # An operator's retry of a step whose attempts are spent gives it one more.
    assert row["attempts"] - row["uncharged_attempts"] <= (row["max_attempts"] or 3)
