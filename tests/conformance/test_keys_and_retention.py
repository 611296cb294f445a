"""API keys as worker/keys.py reads them, and retention (evq_prune_batch), against both stores."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from evq.worker.errors import AuthFailed, Conflict
from evq.worker.keys import NewKey, Role, hash_secret, verify_secret
from evq.worker.notices import NoticeConfig
from evq.worker.outcomes import Accepted, Rejected
from evq.worker.ports import StepFilter
from tests.conformance.helpers import claim, kinds, settle
from tests.support import valid

PAST = datetime(2020, 1, 1, tzinfo=UTC)  # the prune refuses a cutoff after the clock


async def test_a_key_is_found_by_its_id_with_the_pepper_and_rehashed_only_from_its_old_hash(any_store):
    key = NewKey(key_id="0123456789ab", secret="s3cret")
    made = await any_store.create_key(name="first", role=Role.ADMIN, key=key, created_by=None)
    assert (made["name"], made["role"], made["key_id"], made["created_by"]) == ("first", "admin", key.key_id, None)
    with pytest.raises(AuthFailed):  # a second bootstrap once an admin key exists
        await any_store.create_key(name="second", role=Role.AGENT, key=NewKey("0123456789ac", "x"), created_by=None)
    with pytest.raises(Conflict):  # names are never reused
        await any_store.create_key(name="first", role=Role.AGENT, key=NewKey("0123456789ad", "x"), created_by="first")
    found = await any_store.key_by_id(key.key_id)
    assert (found["name"], found["role"], found["revoked_at"], found["session_generation"]) == (
        "first",
        "admin",
        None,
        0,
    )
    pepper = bytes(found["pepper"])
    assert len(pepper) >= 32 and verify_secret("s3cret", found["secret_hash"], pepper)
    assert await any_store.key_by_id("ffffffffffff") is None
    new = hash_secret("s3cret", pepper)
    await any_store.rehash_key(key.key_id, old="not-the-stored-hash", new="hmac-sha256$nope")
    assert (await any_store.key_by_id(key.key_id))["secret_hash"] == found["secret_hash"]
    await any_store.rehash_key(key.key_id, old=found["secret_hash"], new=new)
    assert (await any_store.key_by_id(key.key_id))["secret_hash"] == new


async def closed_step(store, outcome, *, at: datetime, **kw) -> int:
    e = await store.enqueue(valid(**kw), now=at)
    [step] = await claim(store, now=at, providers=(kw.get("provider", "smtp"),))
    assert step.id == e.id
    await store.record([settle(step, outcome)], actor="w", now=at)
    return e.id


async def test_prune_removes_closed_history_before_the_cutoff_with_its_notices(any_store):
    any_store.notices = NoticeConfig()
    old = await closed_step(any_store, Accepted("pm"), at=PAST)
    told = await closed_step(any_store, Rejected("550"), at=PAST, notify="owner@example.com")
    recent = await closed_step(any_store, Accepted("pm"), at=PAST + timedelta(days=30), provider="null")
    waiting = await any_store.enqueue(valid(), now=PAST)
    cutoff = PAST + timedelta(days=1)
    # The notice of `told` is still pending: neither it nor `told` may go yet.
    counts = await any_store.prune_count(cutoff=cutoff)
    assert (counts.steps, counts.evidence, counts.decisions) == (1, 2, 1)
    done = await any_store.prune_batch(cutoff=cutoff, limit=10, actor="admin", run=uuid.uuid4(), batch=1)
    assert (done.steps, done.evidence, done.decisions, done.batches) == (1, 2, 1, 1)
    remaining, _ = await any_store.list_steps(StepFilter(limit=None))
    [notice] = [s.id for s in remaining if s.id not in (told, recent, waiting.id)]
    assert old not in {s.id for s in remaining}
    assert (await any_store.prune_count(cutoff=cutoff)).steps == 0
    assert await kinds(any_store, told) == ["attempt_started", "provider_response", "notice_enqueued"]
    # Once its notice is closed too, the original goes and its notice with it, in one batch.
    [sent] = [c for c in await claim(any_store, now=PAST + timedelta(hours=2), limit=10) if c.id == notice]
    await any_store.record([settle(sent, Accepted("pm-notice"))], actor="w", now=PAST + timedelta(hours=2))
    done = await any_store.prune_batch(cutoff=cutoff, limit=1, actor="admin", run=uuid.uuid4(), batch=2)
    assert (done.steps, done.evidence, done.decisions) == (2, 5, 2)
    remaining, _ = await any_store.list_steps(StepFilter(limit=None))
    assert {s.id for s in remaining} == {recent, waiting.id}
    with pytest.raises(Exception):  # noqa: B017 - each store has its own error: a cutoff after its clock
        await any_store.prune_batch(
            cutoff=datetime.now(UTC) + timedelta(days=1), limit=10, actor="admin", run=uuid.uuid4(), batch=2
        )


async def test_prune_cutoff_is_the_stores_clock_less_the_age(any_store):
    before = datetime.now(UTC)
    cutoff = await any_store.prune_cutoff(older_than=timedelta(days=7))
    assert before - timedelta(days=7, seconds=5) <= cutoff <= datetime.now(UTC) - timedelta(days=7)
