"""One scripted history (every transition of the port, its refusals included) played against both
stores; what each then holds, read back through the port, must be the same, column by column
and evidence row by evidence row. The other conformance tests assert what each call does;
this one catches a column, an evidence field or a side effect they did not think to assert."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime
from typing import Any

from evq.worker.outcomes import Accepted, Rejected, Retryable, Unknown
from evq.worker.ports import StepFilter
from evq.worker.resolution import Resolution
from tests.conformance.helpers import LEASE, T0, at, claim, rescue, settle
from tests.memstore import MemoryStore
from tests.support import valid

RUNS = ("run-a", "run-b")


def requests() -> list[Any]:
    return [
        valid(run_id="run-a", step_id="ok", notify="owner@example.com"),
        valid(run_id="run-a", step_id="refused", notify="owner@example.com"),
        valid(run_id="run-a", step_id="flaky", max_attempts=2),
        valid(run_id="run-a", step_id="lost"),
        valid(run_id="run-b", step_id="deduped", provider="http"),
        valid(run_id="run-b", step_id="released"),
        valid(run_id="run-b", step_id="zombie"),
        valid(run_id="run-b", step_id="absent", cc=["c@example.net"]),
    ]


async def play(store: Any, reqs: list[Any]) -> None:
    for i, r in enumerate(reqs):
        await store.enqueue(r, now=at(i))
    await store.enqueue(reqs[0], now=at(20))  # a repeat: nothing new
    smtp = await claim(store, now=at(30), claim_id="c1", limit=3)
    first = {s.step_id: s for s in smtp}
    await store.record(
        [
            settle(first["ok"], Accepted("pm-ok", response={"code": 250})),
            settle(first["refused"], Rejected("550 no such user")),
            settle(first["flaky"], Retryable("451 busy", retry_after=5), charged=False),
        ],
        actor="w1",
        now=at(31),
    )
    [http] = await claim(store, now=at(32), claim_id="c2", providers=("http",), windows={"http": 3600})
    await store.record([settle(http, Unknown("timeout"), window_open=True)], actor="w1", now=at(33))
    rest = await claim(store, now=at(40), claim_id="c3", limit=10, owner="w2")
    by = {s.step_id: s for s in rest}
    await store.release([by["released"]], actor="w2", now=at(41))
    await store.release_orphans(owner="w2", held=[by["lost"].lease_token], claims=["c3"], now=at(42))
    await store.record([settle(by["lost"], Unknown("reset after the final dot"))], actor="w2", now=at(43))
    again = await claim(store, now=at(50), claim_id="c4", limit=10, owner="w3", windows={"http": 3600})
    by2 = {s.step_id: s for s in again}
    await store.record([settle(by2["flaky"], Retryable("421 closing"))], actor="w3", now=at(51))
    await rescue(store, at(50 + LEASE + 1))
    # Answers that lost their lease: a definite one settles its rescued row, one that is not
    # definite is only evidence, and a repeated one is a duplicate.
    zombie = by2.get("zombie")
    if zombie is not None:
        await store.record([settle(zombie, Accepted("pm-zombie"))], actor="w3", now=at(200))
    await store.record([settle(by["absent"], Retryable("451 after all"))], actor="w2", now=at(201))
    await store.record([settle(first["ok"], Accepted("pm-ok"))], actor="w1", now=at(202))  # duplicate
    await store.reconcile_claim(providers=["smtp"], max_checks=3, hold_seconds=100, now=at(300))
    unknown, _ = await store.list_steps(StepFilter(statuses=("unknown",), limit=None), now=at(300))
    for step in unknown:
        await store.reconcile_absent(step.id, next_check=60, detail={"found": False}, actor="rec", now=at(301))
    await store.circuit_trip(
        provider="smtp", reason="auth_failed", detail="535", actor="w1", probe_base=10, probe_max=60, now=at(400)
    )
    await store.circuit_probe_take(provider="smtp", owner="w1", hold_seconds=30, lease_seconds=LEASE, now=at(410))
    await store.circuit_probe_idle(provider="smtp", owner="w1", probe_base=10, now=at(411))
    await store.rate_take(provider="http", per_second=1, burst=2, want=5, now=at(500))
    await store.rate_pause(provider="http", seconds=3, now=at(501))
    for step in [*unknown, *(await store.list_steps(StepFilter(statuses=("accepted",)), now=at(600)))[0]]:
        try:
            await store.resolve(
                step.id,
                Resolution.parse("retry", "verified not sent"),
                actor="op",
                default_max_attempts=3,
                now=at(600),
            )
        except Exception as exc:  # the refusals are part of the history too
            await store.enqueue(
                valid(
                    run_id="run-b",
                    step_id=f"refusal-{step.id}",
                    to=["op@example.com"],
                    subject=type(exc).__name__,
                    text=str(exc)[:200],
                ),
                now=at(600),
            )


def normal(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat()
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value).astimezone(UTC).isoformat()
        except ValueError:
            return value
    if isinstance(value, dict):
        return {k: normal(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [normal(v) for v in value]
    return value


async def snapshot(store: Any) -> dict[str, Any]:
    runs = {}
    for run_id in RUNS:
        run = await store.get_run(run_id, limit=1000)
        # Each step's evidence in its order. Ids are left out: they come from a sequence, which
        # a conflict (ON CONFLICT DO NOTHING) also advances, and the order of rows one statement
        # writes for several steps is PostgreSQL's scan order, which nothing relies on.
        evidence = [
            [{k: v for k, v in e.items() if k != "id"} for e in run.evidence if e["step_id"] == s["id"]]
            for s in run.steps
        ]
        runs[run_id] = {"steps": run.steps, "decisions": run.decisions, "evidence": evidence}
    listed, total = await store.list_steps(StepFilter(limit=None), now=at(700))
    rate = await store.rate_take(provider="http", per_second=1, burst=2, want=5, now=at(700))
    out = {
        "runs": runs,
        "list": [dataclasses.asdict(s) for s in listed],
        "total": total,
        "circuits": await store.circuits(now=at(700)),
        "rate": rate,
        "claimable": await store.claimable_exists(providers=["smtp", "http"], lease_seconds=LEASE, now=at(700)),
    }
    for run in runs.values():
        for step in run["steps"]:
            if step["notice_of"] is not None:
                # A notice's payload names the Message-ID it is about, so its digest differs.
                step["payload_sha256"] = "(digest of a notice)"
    text = json.dumps(normal(out), sort_keys=True, default=str)
    # Message-IDs are random per store: named by their step instead.
    for run in runs.values():
        for step in run["steps"]:
            text = text.replace(step["message_id"], f"<message of {step['run_id']}/{step['step_id']}>")
    return json.loads(text)


async def test_both_stores_hold_the_same_history_after_the_same_calls(store):
    reqs = requests()
    memory = MemoryStore(clock=lambda: T0)
    await play(memory, reqs)
    await play(store, reqs)
    got, want = await snapshot(memory), await snapshot(store)
    for run_id in RUNS:
        for key in ("steps", "decisions", "evidence"):
            mine, theirs = got["runs"][run_id][key], want["runs"][run_id][key]
            assert len(mine) == len(theirs), (run_id, key)
            for m, t in zip(mine, theirs, strict=True):
                assert m == t, (run_id, key)
    assert got == want
