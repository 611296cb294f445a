"""The search box (StepFilter.search) and the capped counts, against the PostgreSQL store: each field
finds its step and nothing else, addresses match whatever their case, a domain in each of its
forms, a digit string that is both a step id and a run id finds both, and count_by_status
counts each state of what a filter matches."""

from __future__ import annotations

from dataclasses import replace

from evq.worker.outcomes import Accepted
from evq.worker.ports import COUNT_CAP, StatusCount, StepFilter
from evq.worker.request import Actor
from evq.worker.states import Status
from tests.conformance.helpers import T0, at, claim, settle
from tests.support import valid


async def found(store, text, **kw) -> set[int]:
    rows, total = await store.list_steps(StepFilter(search=text, limit=None, **kw), now=at(100))
    assert total == len(rows)
    return {r.id for r in rows}


async def three_steps(store):
    """a: Bob at example.net, enqueued by key "ops-agent" and accepted by the provider as pm-77;
    b: Carol at bücher.example in cc, run "run-b"; c: someone at example.org, an own key."""
    a = await store.enqueue(
        replace(valid(to=["Bob.Smith@Example.NET"]), actor=Actor("http", "k-1", "ops-agent", "policy")), now=T0
    )
    [step] = await claim(store, now=at(1))
    await store.record([settle(step, Accepted("pm-77"))], actor="w1", now=at(2))
    b = await store.enqueue(valid(run_id="run-b", cc=["carol@bücher.example"]), now=at(3))
    c = await store.enqueue(valid(to=["zed@example.org"], idempotency_key="order-42:receipt"), now=at(4))
    return a, b, c


async def test_each_field_finds_its_step_and_nothing_else(store):
    a, b, c = await three_steps(store)
    assert await found(store, str(b.id)) == {b.id}
    assert await found(store, "bob.smith@example.net") == {a.id}
    assert await found(store, a.message_id) == {a.id}
    assert await found(store, a.message_id.strip("<>")) == {a.id}
    assert await found(store, "pm-77") == {a.id}
    assert await found(store, "order-42:receipt") == {c.id}
    assert await found(store, c.idempotency_key) == {c.id}
    assert await found(store, "run-b") == {b.id}
    assert await found(store, "ops-agent") == {a.id}
    assert await found(store, "  ops-agent\t") == {a.id}  # trimmed
    for nothing in ("nobody@example.net", "ops", "pm-7", "run", "@example.co", "99999999", "example"):
        assert await found(store, nothing) == set(), nothing


async def test_addresses_match_whatever_their_case_and_domains_in_each_form(store):
    a, b, c = await three_steps(store)
    assert await found(store, "BOB.SMITH@EXAMPLE.NET") == {a.id}
    assert await found(store, "@EXAMPLE.net") == {a.id}
    assert await found(store, "example.net") == {a.id}  # a bare domain
    assert await found(store, "@bücher.example") == {b.id}
    assert await found(store, "xn--bcher-kva.example") == {b.id}
    assert await found(store, "@example.com") == {b.id}  # its "to", valid()'s default  # the ASCII form from a log
    assert await found(store, "carol@XN--BCHER-KVA.example") == {b.id}
    # The domain is whole: a parent or a look-alike is another domain.
    assert await found(store, "@net") == set()
    assert await found(store, "mple.net") == set()
    # The search narrows the other filters, never widens them.
    assert await found(store, "example.net", statuses=(Status.PENDING,)) == set()
    assert await found(store, "example.net", statuses=(Status.ACCEPTED,)) == {a.id}
    assert await found(store, "@example.org", recipient_domain="example.org") == {c.id}


async def test_a_digit_string_that_is_also_a_run_id_finds_both(store):
    first = await store.enqueue(valid(), now=T0)
    named = await store.enqueue(valid(run_id=str(first.id)), now=at(1))
    assert await found(store, str(first.id)) == {first.id, named.id}
    # Past a bigint it is no step id, and still a run id it could be.
    assert await found(store, "9" * 30) == set()


async def test_count_by_status_counts_each_state_of_what_the_filter_matches(store):
    await three_steps(store)
    counts = await store.count_by_status(StepFilter())
    assert set(counts) == {str(s) for s in Status}
    assert counts["accepted"] == StatusCount(1, True) and counts["pending"] == StatusCount(2, True)
    assert counts["unknown"] == StatusCount(0, True)
    # The states, the page and its order are not the counts' business; the search is.
    searched = await store.count_by_status(StepFilter(search="@example.org", statuses=(Status.HELD,), limit=1))
    assert {k: v.n for k, v in searched.items() if v.n} == {"pending": 1}
    assert await store.count_by_status(StepFilter(run_id="run-b")) == {
        str(s): StatusCount(int(s == Status.PENDING), True) for s in Status
    }


def test_a_count_past_the_cap_says_it_is_not_exact():
    assert StatusCount.capped(COUNT_CAP) == StatusCount(COUNT_CAP, True)
    assert StatusCount.capped(COUNT_CAP + 1) == StatusCount(COUNT_CAP, False)
