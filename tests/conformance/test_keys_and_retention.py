"""API keys as worker/keys.py reads them, and retention (evq_prune_batch), against the PostgreSQL store."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from evq.worker.approval_policy import ApprovalPolicy, Budget
from evq.worker.errors import AuthFailed, Conflict
from evq.worker.keys import NewKey, Role, hash_secret, verify_secret
from evq.worker.notices import NoticeConfig
from evq.worker.outcomes import Accepted, Rejected
from evq.worker.ports import StepFilter
from evq.worker.pruner import Pruner, PrunerConfig
from evq.worker.states import Status
from tests.conformance.helpers import claim, kinds, settle
from tests.support import valid

PAST = datetime(2020, 1, 1, tzinfo=UTC)  # the prune refuses a cutoff after the clock


async def test_a_key_is_found_by_its_id_with_the_pepper_and_rehashed_only_from_its_old_hash(store):
    key = NewKey(key_id="0123456789ab", secret="s3cret")
    made = await store.create_key(name="first", role=Role.ADMIN, key=key, created_by=None)
    assert (made["name"], made["role"], made["key_id"], made["created_by"]) == ("first", "admin", key.key_id, None)
    with pytest.raises(AuthFailed):  # a second bootstrap once an admin key exists
        await store.create_key(name="second", role=Role.AGENT, key=NewKey("0123456789ac", "x"), created_by=None)
    with pytest.raises(Conflict):  # names are never reused
        await store.create_key(name="first", role=Role.AGENT, key=NewKey("0123456789ad", "x"), created_by="first")
    found = await store.key_by_id(key.key_id)
    assert (found["name"], found["role"], found["revoked_at"], found["session_generation"]) == (
        "first",
        "admin",
        None,
        0,
    )
    pepper = bytes(found["pepper"])
    assert len(pepper) >= 32 and verify_secret("s3cret", found["secret_hash"], pepper)
    assert await store.key_by_id("ffffffffffff") is None
    new = hash_secret("s3cret", pepper)
    await store.rehash_key(key.key_id, old="not-the-stored-hash", new="hmac-sha256$nope")
    assert (await store.key_by_id(key.key_id))["secret_hash"] == found["secret_hash"]
    await store.rehash_key(key.key_id, old=found["secret_hash"], new=new)
    assert (await store.key_by_id(key.key_id))["secret_hash"] == new


async def closed_step(store, outcome, *, at: datetime, **kw) -> int:
    e = await store.enqueue(valid(**kw), now=at)
    [step] = await claim(store, now=at, providers=(kw.get("provider", "smtp"),))
    assert step.id == e.id
    await store.record([settle(step, outcome)], actor="w", now=at)
    return e.id


async def test_prune_removes_closed_history_before_the_cutoff_with_its_notices(store):
    store.notices = NoticeConfig()
    old = await closed_step(store, Accepted("pm"), at=PAST)
    told = await closed_step(store, Rejected("550"), at=PAST, notify="owner@example.com")
    recent = await closed_step(store, Accepted("pm"), at=PAST + timedelta(days=30), provider="null")
    waiting = await store.enqueue(valid(), now=PAST)
    cutoff = PAST + timedelta(days=1)
    # The notice of `told` is still pending: neither it nor `told` may go yet.
    counts = await store.prune_count(cutoff=cutoff)
    assert (counts.steps, counts.evidence, counts.decisions) == (1, 2, 1)
    done = await store.prune_batch(cutoff=cutoff, limit=10, actor="admin", run=uuid.uuid4(), batch=1)
    assert (done.steps, done.evidence, done.decisions, done.batches) == (1, 2, 1, 1)
    remaining, _ = await store.list_steps(StepFilter(limit=None))
    [notice] = [s.id for s in remaining if s.id not in (told, recent, waiting.id)]
    assert old not in {s.id for s in remaining}
    assert (await store.prune_count(cutoff=cutoff)).steps == 0
    assert await kinds(store, told) == ["attempt_started", "provider_response", "notice_enqueued"]
    # Once its notice is closed too, the original goes and its notice with it, in one batch.
    [sent] = [c for c in await claim(store, now=PAST + timedelta(hours=2), limit=10) if c.id == notice]
    await store.record([settle(sent, Accepted("pm-notice"))], actor="w", now=PAST + timedelta(hours=2))
    done = await store.prune_batch(cutoff=cutoff, limit=1, actor="admin", run=uuid.uuid4(), batch=2)
    assert (done.steps, done.evidence, done.decisions) == (2, 5, 2)
    remaining, _ = await store.list_steps(StepFilter(limit=None))
    assert {s.id for s in remaining} == {recent, waiting.id}
    with pytest.raises(Exception):  # noqa: B017 - the database refuses a cutoff after its clock
        await store.prune_batch(
            cutoff=datetime.now(UTC) + timedelta(days=1), limit=10, actor="admin", run=uuid.uuid4(), batch=2
        )


async def test_prune_cutoff_is_the_stores_clock_less_the_age(store):
    before = datetime.now(UTC)
    cutoff = await store.prune_cutoff(older_than=timedelta(days=7))
    assert before - timedelta(days=7, seconds=5) <= cutoff <= datetime.now(UTC) - timedelta(days=7)


async def test_prune_deletes_the_budget_counters_whose_window_closed_and_keeps_the_rest(store):
    every = ApprovalPolicy(
        budgets=(
            (Budget.RUN_RECIPIENTS, 100),
            (Budget.KEY_HOURLY, 100),
            (Budget.KEY_DAILY, 100),
            (Budget.DOMAIN_HOURLY, 100),
        )
    )
    day = timedelta(days=1)
    # Day 1: a run whose one step closes, then goes by the batches. Day 2: a run still waiting.
    # Day 3, ten past midnight: a run whose hour and day are not over at the cutoff.
    gone = await store.enqueue(valid(run_id="gone", step_id="g"), now=PAST, approval=every)
    [step] = await claim(store, now=PAST)
    assert step.id == gone.id
    await store.record([settle(step, Accepted("pm"))], actor="w", now=PAST)
    await store.enqueue(valid(run_id="live", step_id="l"), now=PAST + day, approval=every)
    late = PAST + 2 * day + timedelta(minutes=10)
    await store.enqueue(valid(run_id="late", step_id="x"), now=late, approval=every)
    cutoff = PAST + 2 * day + timedelta(minutes=30)
    assert (await store.prune_batch(cutoff=cutoff, limit=10, actor="admin", run=uuid.uuid4(), batch=1)).steps == 1

    async def one_pass(dry_run: bool) -> int:
        closed, after, batches = 0, None, 0
        while True:
            part = await store.prune_budgets(cutoff=cutoff, limit=3, after=after, dry_run=dry_run)
            closed, after, batches = closed + part.budgets, part.last, batches + 1
            if after is None:
                return closed
            assert batches < 10, "the pass does not end"

    def usage(rows):
        return sorted((u["budget"], u["scope"], u["window_start"]) for u in rows)

    before = usage(await store.budget_usage(now=PAST + day, limit=100))
    # The run "gone", and every hour's and day's counter of days 1 and 2 (day 2 ended at the
    # cutoff's midnight): seven. A dry run counts them and deletes none.
    assert await one_pass(dry_run=True) == 7
    assert usage(await store.budget_usage(now=PAST + day, limit=100)) == before
    assert await one_pass(dry_run=False) == 7
    assert await one_pass(dry_run=True) == 0
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    assert usage(await store.budget_usage(now=PAST + day, limit=100)) == [
        ("run_recipients", "late", epoch),
        ("run_recipients", "live", epoch),
    ]
    hour = late.replace(minute=0)
    assert usage(await store.budget_usage(now=late, limit=100)) == [
        ("domain_hourly", "example.com", hour),
        ("key_daily", "", hour.replace(hour=0)),
        ("key_hourly", "", hour),
        ("run_recipients", "late", epoch),
        ("run_recipients", "live", epoch),
    ]


async def budget_pass(store, cutoff: datetime, *, dry_run: bool = False) -> int:
    closed, after = 0, None
    while True:
        part = await store.prune_budgets(cutoff=cutoff, limit=2, after=after, dry_run=dry_run)
        closed, after = closed + part.budgets, part.last
        if after is None:
            return closed


@pytest.mark.parametrize("how", ["held by a budget", "a batch held by a rule"])
async def test_a_held_send_leaves_its_counters_to_prune_when_their_window_closes(store, how):
    """A counter charged and given back (a later one was over its cap), or locked by a batch
    and never charged, stays at 0 until its window closes: prune takes it then."""
    if how == "held by a budget":
        policy = ApprovalPolicy(budgets=((Budget.KEY_HOURLY, 100), (Budget.RUN_RECIPIENTS, 1)))
        made = await store.enqueue(valid(run_id="r", cc=["b@example.com"]), now=PAST, approval=policy)
    else:
        policy = ApprovalPolicy(budgets=((Budget.KEY_HOURLY, 100), (Budget.RUN_RECIPIENTS, 100)), max_recipients=1)
        [made] = await store.enqueue_many([valid(run_id="r", cc=["b@example.com"])], now=PAST, approval=policy)
    assert made.status == Status.HELD
    assert await store.budget_usage(now=PAST, limit=100) == []  # a held send charges nothing
    # The hour is over; the run has its held step, so its counter (if any) stays.
    assert await budget_pass(store, PAST + timedelta(hours=2), dry_run=True) == 1
    assert await budget_pass(store, PAST + timedelta(hours=2)) == 1


async def test_the_first_interrupt_ends_a_dry_runs_budget_pass_too(store):
    policy = ApprovalPolicy(budgets=((Budget.DOMAIN_HOURLY, 100),))
    for i in range(5):
        await store.enqueue(valid(run_id="p", step_id=f"s{i}", to=[f"a@d{i}.example"]), now=PAST, approval=policy)
    asked: list[int] = []

    def stop() -> bool:  # asked between batches: yes once the budget pass has begun
        asked.append(1)
        return len(asked) > 1

    dry = Pruner(
        store, PrunerConfig(older_than=timedelta(days=1), batch=2, dry_run=True), actor="dry-run", should_stop=stop
    )
    counts = await dry.run_once()
    assert dry.stopped and counts.budgets == 4  # two batches of two
