"""The approval policy at enqueue (docs/design.md, "Approvals and budgets"), against both
stores: which new steps are held and why, the budgets they charge, the refusal, the repeat."""

from __future__ import annotations

from dataclasses import replace
from datetime import time, timedelta

import pytest

from evq.worker.approval_policy import ApprovalPolicy, Budget, FirstContact, Hours, OverBudget
from evq.worker.errors import BudgetExceeded
from evq.worker.states import Status
from tests.conformance.helpers import T0, claim, kinds, row
from tests.support import valid

ALWAYS = ApprovalPolicy(always=True)


async def test_a_held_step_is_written_held_with_its_reasons_and_a_repeat_gets_it_back(store):
    req = valid(step_id="held", require_approval=True)
    first = await store.enqueue(req, now=T0, approval=ALWAYS)
    assert first.created and first.status == Status.HELD
    assert [r["rule"] for r in first.hold["rules"]] == ["always", "requested"]
    step = await row(store, first.id)
    assert (step["status"], step["reason"], step["held_since"]) == ("held", "approval_required", T0)
    assert step["hold_expires_at"] == T0 + timedelta(days=3)
    assert step["hold"] == first.hold
    assert await kinds(store, first.id) == ["held"]
    # The repeat is answered as the stored row is, judged by nothing: no second evidence row.
    again = await store.enqueue(req, now=T0 + timedelta(hours=1), approval=ApprovalPolicy())
    assert (again.id, again.created, again.status, again.hold) == (first.id, False, Status.HELD, first.hold)
    assert await kinds(store, first.id) == ["held"]
    assert await claim(store, now=T0 + timedelta(hours=1)) == []


async def test_an_inactive_policy_writes_pending_with_its_priority_and_schedule(store):
    later = T0 + timedelta(hours=2)
    made = await store.enqueue(replace(valid(step_id="p"), priority="high", send_at=later), now=T0)
    assert made.status == Status.PENDING and made.hold is None
    step = await row(store, made.id)
    assert (step["priority"], step["send_at"], step["next_attempt_at"], step["retry_from"]) == (1, later, later, later)
    # A past send_at is now.
    past = await store.enqueue(replace(valid(step_id="q"), send_at=T0 - timedelta(days=1)), now=T0)
    assert (await row(store, past.id))["next_attempt_at"] == T0


async def test_first_contact_holds_until_a_send_that_was_not_held_made_the_recipient_known(store):
    strict = ApprovalPolicy(first_contact=FirstContact.ADDRESS)
    first = await store.enqueue(valid(step_id="a", to=["Bob@example.com"]), now=T0, approval=strict)
    assert first.status == Status.HELD and first.hold["rules"][0]["rule"] == "first_contact"
    # A held send teaches nothing; one a policy let through does (here: a recipient cap it passed).
    taught = await store.enqueue(
        valid(step_id="b", to=["bob@example.com"]), now=T0, approval=ApprovalPolicy(max_recipients=5)
    )
    assert taught.status == Status.PENDING
    known = await store.enqueue(valid(step_id="c", to=["bob@example.com"]), now=T0, approval=strict)
    assert known.status == Status.PENDING
    other = await store.enqueue(valid(step_id="d", to=["carol@example.com"]), now=T0, approval=strict)
    assert other.status == Status.HELD and other.hold["rules"][0]["recipients"] == ["carol@example.com"]
    by_domain = ApprovalPolicy(first_contact=FirstContact.DOMAIN)
    same_domain = await store.enqueue(valid(step_id="e", to=["dave@example.com"]), now=T0, approval=by_domain)
    assert same_domain.status == Status.PENDING
    new_domain = await store.enqueue(valid(step_id="f", to=["erin@example.net"]), now=T0, approval=by_domain)
    assert new_domain.status == Status.HELD and new_domain.hold["rules"][0]["rule"] == "first_contact_domain"


async def test_recipient_cap_and_hours(store):
    cap = ApprovalPolicy(max_recipients=1)
    many = await store.enqueue(valid(step_id="m", cc=["c@example.com"]), now=T0, approval=cap)
    assert [r["rule"] for r in many.hold["rules"]] == ["too_many_recipients"]
    # T0 is a Tuesday, 12:00 UTC: inside 08:00-18:00 on weekdays, outside it in Tokyo (21:00).
    office = ApprovalPolicy(hours=Hours(time(8), time(18), "UTC", (0, 1, 2, 3, 4)))
    assert (await store.enqueue(valid(step_id="h1"), now=T0, approval=office)).status == Status.PENDING
    tokyo = ApprovalPolicy(hours=Hours(time(8), time(18), "Asia/Tokyo", (0, 1, 2, 3, 4)))
    late = await store.enqueue(valid(step_id="h2"), now=T0, approval=tokyo)
    assert [r["rule"] for r in late.hold["rules"]] == ["outside_hours"]
    # A send scheduled into the hours is judged at its send_at: 23:00 UTC is 08:00 in Tokyo.
    scheduled = replace(valid(step_id="h3"), send_at=T0 + timedelta(hours=11))
    assert (await store.enqueue(scheduled, now=T0, approval=tokyo)).status == Status.PENDING


async def test_budgets_charge_what_passes_and_hold_or_refuse_the_rest(store):
    run_cap = ApprovalPolicy(budgets=((Budget.RUN_RECIPIENTS, 3),))
    two = await store.enqueue(valid(step_id="b1", cc=["x@example.com"]), now=T0, approval=run_cap)
    assert two.status == Status.PENDING
    over = await store.enqueue(valid(step_id="b2", cc=["y@example.com"]), now=T0, approval=run_cap)
    assert over.status == Status.HELD
    [hold] = over.hold["rules"]
    assert (hold["rule"], hold["budget"], hold["scope"], hold["cap"], hold["used"]) == (
        "budget",
        "run_recipients",
        "run-1",
        3,
        2,
    )
    one = await store.enqueue(valid(step_id="b3"), now=T0, approval=run_cap)
    assert one.status == Status.PENDING
    usage = await store.budget_usage(now=T0)
    assert [(u["budget"], u["scope"], u["used"]) for u in usage] == [("run_recipients", "run-1", 3)]
    refuse = replace(run_cap, over_budget=OverBudget.REFUSE)
    with pytest.raises(BudgetExceeded) as refused:
        await store.enqueue(valid(step_id="b4"), now=T0, approval=refuse)
    assert refused.value.code == "E_BUDGET" and refused.value.errors[0]["field"] == "budget.run_recipients"
    assert await store.find_by_key(valid(step_id="b4")) is None
    # A counter it passed is not charged when a later one stops it (sorted: domain before run).
    both = ApprovalPolicy(budgets=((Budget.DOMAIN_HOURLY, 10), (Budget.RUN_RECIPIENTS, 3)), over_budget=OverBudget.HOLD)
    held = await store.enqueue(valid(step_id="b5", run_id="run-1"), now=T0, approval=both)
    assert held.status == Status.HELD
    assert [u for u in await store.budget_usage(now=T0) if u["budget"] == "domain_hourly"] == []


async def test_a_batch_under_a_policy_is_judged_request_by_request(store):
    run_cap = ApprovalPolicy(budgets=((Budget.RUN_RECIPIENTS, 2),))
    made = await store.enqueue_many(
        [valid(step_id=f"n{i}", run_id="batch") for i in range(4)], now=T0, approval=run_cap
    )
    assert [r.status for r in made] == [Status.PENDING, Status.PENDING, Status.HELD, Status.HELD]
    refuse = replace(run_cap, over_budget=OverBudget.REFUSE)
    with pytest.raises(BudgetExceeded) as refused:
        await store.enqueue_many([valid(step_id="z1", run_id="r2"), valid(step_id="z2", run_id="batch")],
                                     now=T0, approval=refuse)  # fmt: skip
    assert refused.value.errors[0]["field"] == "[1].budget.run_recipients"
    # All or nothing: the first request of the refused batch was not written either.
    assert await store.find_by_key(valid(step_id="z1", run_id="r2")) is None
