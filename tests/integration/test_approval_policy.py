"""The approval policy at enqueue, on real PostgreSQL (docs/design.md, "Approvals and budgets"):
every rule holds, held rows are never claimed, schedule and priority order the claim, and a
budget holds under 20 concurrent enqueues on separate connections without ever passing its cap."""

from __future__ import annotations

import threading
from dataclasses import replace
from datetime import UTC, datetime, time, timedelta

import psycopg
import pytest

from evq.adapters.postgres.enqueue import enqueue, enqueue_many, enqueue_own
from evq.worker.approval_policy import ApprovalPolicy, Budget, FirstContact, Hours, OverBudget
from evq.worker.errors import BudgetExceeded
from evq.worker.states import Status
from tests.conformance.helpers import claim
from tests.support import POLICY, request, rows

NOW = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)  # a Tuesday


def gated(**approval) -> object:
    return replace(POLICY, approval=ApprovalPolicy(**approval))


def held_rules(url: str, step_id: int) -> list[str]:
    [row] = rows(url, "SELECT status, reason, held_since, hold FROM steps_now WHERE id = %s", (step_id,))
    assert (row["status"], row["reason"]) == ("held", "approval_required") and row["held_since"] is not None
    return [r["rule"] for r in row["hold"]["rules"]]


def test_each_rule_holds_and_writes_held_evidence_naming_the_enqueuer(db_url):
    first = request(step_id="always")
    with psycopg.connect(db_url) as conn:
        cases = {
            "always": enqueue(conn, first, policy=gated(always=True), now=NOW, actor="agent-7"),
            "requested": enqueue(conn, request(step_id="asked", require_approval=True), policy=POLICY, now=NOW),
            "first_contact": enqueue(
                conn, request(step_id="fc"), policy=gated(first_contact=FirstContact.ADDRESS), now=NOW
            ),
            "first_contact_domain": enqueue(
                conn, request(step_id="fcd"), policy=gated(first_contact=FirstContact.DOMAIN), now=NOW
            ),
            "too_many_recipients": enqueue(
                conn, request(step_id="many", cc=["c@example.com"]), policy=gated(max_recipients=1), now=NOW
            ),
            "outside_hours": enqueue(
                conn,
                request(step_id="night"),
                policy=gated(hours=Hours(time(8), time(11), "UTC", (0, 1, 2, 3, 4))),
                now=NOW,
            ),
        }
        conn.commit()
    for rule, result in cases.items():
        assert result.status == Status.HELD and result.created, rule
        assert held_rules(db_url, result.id) == [rule]
        assert result.hold is not None and result.hold["rules"][0]["rule"] == rule
    [evidence] = rows(
        db_url, "SELECT kind, actor, reason, detail FROM evidence WHERE step_id = %s", (cases["always"].id,)
    )
    assert (evidence["kind"], evidence["actor"], evidence["reason"]) == ("held", "agent-7", "approval_required")
    assert evidence["detail"]["rules"][0]["rule"] == "always"
    # A repeat of a held key is answered as its row is, under any policy, and writes nothing.
    with psycopg.connect(db_url) as conn:
        again = enqueue(conn, first, policy=POLICY, now=NOW)
    assert (again.id, again.created, again.status) == (cases["always"].id, False, Status.HELD)
    assert rows(db_url, "SELECT count(*) AS n FROM evidence WHERE kind = 'held'")[0]["n"] == len(cases)


async def test_held_rows_are_never_claimed_and_priority_and_send_at_order_the_claim(db_url, store):
    with psycopg.connect(db_url, autocommit=True) as conn:
        enqueue(conn, request(step_id="held", require_approval=True), policy=POLICY, now=NOW)
        low = enqueue(conn, request(step_id="low", priority="low"), policy=POLICY, now=NOW)
        normal = enqueue(conn, request(step_id="normal"), policy=POLICY, now=NOW)
        # The batch path carries priority and send_at too (its one statement, no policy active).
        high, second = enqueue_many(
            conn,
            [request(step_id="high", priority="high"), request(step_id="later", priority="high")],
            policy=POLICY,
            now=NOW,
        )
    conn_rows = rows(db_url, "SELECT step_id, priority, next_attempt_at FROM steps_now ORDER BY id")
    assert [(r["step_id"], r["priority"]) for r in conn_rows] == [
        ("held", 0),
        ("low", -1),
        ("normal", 0),
        ("high", 1),
        ("later", 1),
    ]
    # Each claim takes the highest priority first, then the oldest due; never the held one.
    after = NOW + timedelta(seconds=1)
    assert {c.id for c in await claim(store, now=after, limit=2)} == {high.id, second.id}
    assert [c.id for c in await claim(store, now=after, limit=1)] == [normal.id]
    assert [c.id for c in await claim(store, now=after, limit=5)] == [low.id]


async def test_send_at_starts_the_step_later(db_url, store):
    soon = (datetime.now(UTC) + timedelta(hours=2)).replace(microsecond=0)
    with psycopg.connect(db_url, autocommit=True) as conn:
        made = enqueue(conn, request(step_id="s", send_at=soon.isoformat()), policy=POLICY)
        past = enqueue(conn, request(step_id="p", send_at="2020-01-01T00:00:00+00:00"), policy=POLICY)
    [row] = rows(db_url, "SELECT send_at, next_attempt_at, retry_from FROM steps_now WHERE id = %s", (made.id,))
    assert row["send_at"] == row["next_attempt_at"] == row["retry_from"] == soon
    assert [c.id for c in await claim(store, now=datetime.now(UTC) + timedelta(minutes=1))] == [past.id]
    assert [c.id for c in await claim(store, now=soon + timedelta(seconds=1))] == [made.id]


def test_first_contact_is_learnt_from_a_send_that_was_not_held(db_url):
    strict = gated(first_contact=FirstContact.ADDRESS)
    assert enqueue_own(db_url, request(step_id="a", to=["bob@example.com"]), policy=strict).status == Status.HELD
    taught = enqueue_own(db_url, request(step_id="b", to=["Bob@Example.com"]), policy=gated(max_recipients=9))
    assert taught.status == Status.PENDING
    known = rows(db_url, "SELECT sender, recipient, first_step_id FROM known_recipients ORDER BY recipient")
    assert [(k["sender"], k["recipient"]) for k in known] == [
        ("agent@example.org", "@example.com"),
        ("agent@example.org", "bob@example.com"),
    ]
    assert {k["first_step_id"] for k in known} == {taught.id}
    assert enqueue_own(db_url, request(step_id="c", to=["bob@example.com"]), policy=strict).status == Status.PENDING
    # Another sender knows nobody.
    other = request(step_id="d", to=["bob@example.com"], **{"from": "other@example.org"})
    assert enqueue_own(db_url, other, policy=strict).status == Status.HELD


def test_a_stranger_as_the_notify_address_is_a_first_contact_too(db_url):
    """evq mails the notify address on the request's word (a failure notice, a denial): under the
    first-contact rule a stranger there holds the send, named, as a stranger among the recipients would."""
    strict = gated(first_contact=FirstContact.ADDRESS)
    enqueue_own(db_url, request(step_id="teach", to=["bob@example.com"]), policy=gated(max_recipients=9))
    plain = enqueue_own(db_url, request(step_id="a", to=["bob@example.com"]), policy=strict)
    assert plain.status == Status.PENDING
    lured = request(step_id="b", to=["bob@example.com"], notify="Stranger@victim.example.org")
    made = enqueue_own(db_url, lured, policy=strict)
    assert made.status == Status.HELD and held_rules(db_url, made.id) == ["first_contact"]
    [row] = rows(db_url, "SELECT hold FROM steps_now WHERE id = %s", (made.id,))
    assert "stranger@victim.example.org" in str(row["hold"]).lower()


def test_a_budget_holds_under_20_concurrent_enqueues_and_never_passes_its_cap(db_url):
    policy = gated(budgets=((Budget.RUN_RECIPIENTS, 10), (Budget.DOMAIN_HOURLY, 15)))
    start = threading.Barrier(20)
    results: list[object] = []
    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            start.wait()
            # Each on its own connection, in its own transaction (enqueue_own).
            results.append(enqueue_own(db_url, request(run_id="burst", step_id=f"s{i}"), policy=policy))
        except BaseException as exc:  # reported below, never lost in the thread
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == [] and len(results) == 20
    statuses = rows(db_url, "SELECT status, count(*) AS n FROM steps_now GROUP BY status ORDER BY status")
    assert {r["status"]: r["n"] for r in statuses} == {"held": 10, "pending": 10}
    used = {r["budget"]: r["used"] for r in rows(db_url, "SELECT budget, used FROM send_budgets")}
    # The run's cap stopped the rest; the domain counter holds only what passed both.
    assert used == {"run_recipients": 10, "domain_hourly": 10}
    holds = rows(db_url, "SELECT hold FROM steps_now WHERE status = 'held'")
    assert {(h["hold"]["rules"][0]["budget"], h["hold"]["rules"][0]["cap"]) for h in holds} == {("run_recipients", 10)}


def test_refuse_mode_is_an_e_budget_refusal_recorded_and_nothing_charged(db_url):
    policy = gated(budgets=((Budget.KEY_DAILY, 2),), over_budget=OverBudget.REFUSE)
    enqueue_own(db_url, request(step_id="ok", cc=["c@example.com"]), policy=policy, actor="agent")
    with pytest.raises(BudgetExceeded) as refused:
        enqueue_own(db_url, request(step_id="over"), policy=policy, actor="agent")
    assert refused.value.code == "E_BUDGET"
    assert refused.value.errors[0]["field"] == "budget.key_daily"
    assert rows(db_url, "SELECT step_id FROM steps_now") == [{"step_id": "ok"}]
    assert rows(db_url, "SELECT scope, used FROM send_budgets") == [{"scope": "agent", "used": 2}]
    [refusal] = rows(db_url, "SELECT interface, errors FROM enqueue_refusals")
    assert refusal["interface"] == "python"
    assert refusal["errors"][0]["field"] == "budget.key_daily"


def test_the_callers_rollback_takes_the_budget_charge_with_it(db_url):
    policy = gated(budgets=((Budget.RUN_RECIPIENTS, 1),))
    with psycopg.connect(db_url) as conn:
        assert enqueue(conn, request(step_id="x"), policy=policy).status == Status.PENDING
        conn.rollback()
    assert rows(db_url, "SELECT count(*) AS n FROM send_budgets WHERE used > 0")[0]["n"] == 0
    assert enqueue_own(db_url, request(step_id="y"), policy=policy).status == Status.PENDING


def test_two_batches_charging_the_same_counters_in_opposite_orders_never_deadlock(db_url):
    """Each batch locks every counter it may charge first, in one sorted order: without that, a
    batch charging a.example then b.example and one charging b.example then a.example could each
    hold the lock the other waits for (PostgreSQL would abort one with a deadlock)."""
    policy = gated(budgets=((Budget.DOMAIN_HOURLY, 1000),))
    errors: list[BaseException] = []

    def batch(run: str, domains: list[str]) -> None:
        try:
            with psycopg.connect(db_url) as conn:
                reqs = [request(run_id=run, step_id=f"{run}-{i}", to=[f"u{i}@{d}"]) for i, d in enumerate(domains)]
                enqueue_many(conn, reqs, policy=policy)
                conn.commit()
        except BaseException as exc:  # reported below
            errors.append(exc)

    for n in range(8):
        threads = [
            threading.Thread(target=batch, args=(f"fwd{n}", ["a.example", "b.example"] * 3)),
            threading.Thread(target=batch, args=(f"rev{n}", ["b.example", "a.example"] * 3)),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert errors == []
    used = {r["scope"]: r["used"] for r in rows(db_url, "SELECT scope, used FROM send_budgets")}
    assert used == {"a.example": 48, "b.example": 48}


def test_a_batch_of_a_key_at_always_writes_what_one_at_a_time_writes(db_url):
    """held_many_op (every statement sent for the whole batch at once) against gated_op one
    request at a time: the same held rows, holds (first contact included) and held evidence; a
    key repeated in the batch is answered as its first step, one with another payload refused."""
    from evq.adapters.postgres.batch_enqueue import enqueue_many_op
    from evq.adapters.postgres.op_runner import run_sync
    from evq.adapters.postgres.single_enqueue import gated_op
    from evq.worker.enqueue import validate_many
    from evq.worker.errors import IdempotencyConflict
    from evq.worker.request import Actor

    policy = gated(first_contact=FirstContact.ADDRESS)
    key = Actor(interface="python", key_id="k1", name="agent-always", approval="always")

    def batch(run_id: str) -> list:
        made = [request(run_id=run_id, step_id=f"s{i}", to=[f"u{i}@example.com"]) for i in range(3)]
        return [replace(v, actor=key) for v in validate_many([*made, made[0]], policy)]

    def stored(run_id: str) -> list:
        return rows(
            db_url,
            "SELECT s.step_id, s.status, s.reason, s.hold, e.kind, e.actor, e.detail FROM steps_now s "
            "JOIN evidence e ON e.step_id = s.id WHERE s.run_id = %s ORDER BY s.step_id, e.id",
            (run_id,),
        )

    with psycopg.connect(db_url) as conn:
        fast = run_sync(conn, enqueue_many_op(batch("fast"), NOW, policy.approval))
        slow = [run_sync(conn, gated_op(r, policy.approval, NOW)) for r in batch("slow")]
        conn.commit()
    assert [(r.created, r.status) for r in fast] == [(r.created, r.status) for r in slow]
    assert [r.created for r in fast] == [True, True, True, False] and fast[3].id == fast[0].id
    assert {r.status for r in fast} == {Status.HELD}
    assert stored("fast") == stored("slow") and len(stored("fast")) == 3
    assert [r["rule"] for r in stored("fast")[0]["hold"]["rules"]] == ["always", "first_contact"]
    assert stored("fast")[0]["kind"] == "held" and stored("fast")[0]["actor"] == "agent-always"
    # The same key with another payload in a batch: refused, and nothing of the batch stays.
    changed = batch("fast")
    changed[3] = replace(changed[3], payload_sha256="0" * 64)
    with psycopg.connect(db_url) as conn, pytest.raises(IdempotencyConflict):
        run_sync(conn, enqueue_many_op(changed[1:], NOW, policy.approval))
