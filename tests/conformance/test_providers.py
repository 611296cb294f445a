"""Provider rows through the Store port, against the PostgreSQL store: the shared rate limit's bucket
and pause (worker/ratelimit.py), and the circuit breaker's states, events and probe
(worker/circuit.py), including how an open circuit holds back the claim."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from evq.worker.approval_policy import ApprovalPolicy
from tests.conformance.helpers import LEASE, T0, at, claim
from tests.support import valid


async def take(store, want, now, *, per_second=2.0, burst=3):
    return await store.rate_take(provider="http", per_second=per_second, burst=burst, want=want, now=now)


async def test_the_bucket_starts_full_refills_by_the_clock_and_never_overflows(store):
    g = await take(store, 5, T0)
    assert (g.granted, g.paused_for) == (3, 0.0) and g.next_token_in == pytest.approx(0.5)
    g = await take(store, 1, T0)
    assert g.granted == 0 and g.next_token_in == pytest.approx(0.5)
    assert (await take(store, 5, at(1))).granted == 2  # 2 tokens a second
    assert (await take(store, 10, at(100))).granted == 3  # never more than the burst
    await store.rate_refund(provider="http", burst=3, tokens=2)
    g = await take(store, 10, at(100))
    assert g.granted == 2 and g.next_token_in == pytest.approx(0.5)
    await store.rate_refund(provider="http", burst=3, tokens=50)
    assert (await take(store, 10, at(100))).granted == 3


async def test_a_pause_grants_nothing_only_grows_and_ends(store):
    assert await store.rate_pause(provider="http", seconds=10, now=T0) == pytest.approx(10)
    assert await store.rate_pause(provider="http", seconds=2, now=at(1)) == pytest.approx(9)  # the later end stays
    g = await take(store, 1, at(5))
    assert (g.granted, g.next_token_in) == (0, 0.0) and g.paused_for == pytest.approx(5)
    # First paused with an empty bucket that refills from the pause: by T0+10 it holds 3 (the burst).
    assert (await take(store, 5, at(10))).granted == 3


async def trip(store, now, *, provider="smtp", reason="connection_refused"):
    return await store.circuit_trip(
        provider=provider, reason=reason, detail="refused", actor="w1", probe_base=10, probe_max=25, now=now
    )


async def circuit(store, now, provider="smtp"):
    return next((c for c in await store.circuits(now=now) if c["provider"] == provider), None)


async def test_an_open_circuit_holds_its_providers_steps_until_a_probe_is_due(store):
    e = await store.enqueue(valid(), now=T0)
    other = await store.enqueue(valid(provider="http"), now=T0)
    assert await store.circuits(now=T0) == []
    opened = await trip(store, T0)
    assert (opened["from_state"], opened["probes"], opened["probe_in"]) == ("closed", 0, 10.0)
    assert await trip(store, at(1)) is None  # already open: no second event
    c = await circuit(store, at(4))
    assert (c["state"], c["reason"], c["opened_at"], c["probe_in"], c["open_for"], c["openings"]) == (
        "open",
        "connection_refused",
        T0,
        6.0,
        4.0,
        1,
    )
    # Only the provider whose circuit is open is held back.
    claimed = await claim(store, now=at(4), providers=("smtp", "http"))
    assert [s.id for s in claimed] == [other.id]
    assert not await store.claimable_exists(providers=["smtp"], lease_seconds=LEASE, now=at(4))
    assert not await store.circuit_probe_take(
        provider="smtp", owner="w1", hold_seconds=30, lease_seconds=LEASE, now=at(4)
    )
    # Due: claimable again (for the probe), and one worker takes it.
    assert await store.claimable_exists(providers=["smtp"], lease_seconds=LEASE, now=at(10))
    assert await store.circuit_probe_take(provider="smtp", owner="w1", hold_seconds=30, lease_seconds=LEASE, now=at(10))
    assert not await store.circuit_probe_take(
        provider="smtp", owner="w2", hold_seconds=30, lease_seconds=LEASE, now=at(11)
    )
    c = await circuit(store, at(11))
    assert (c["state"], c["probe_owner"], c["probe_hold_left"], c["probe_at"]) == ("half_open", "w1", 29.0, None)
    assert await claim(store, now=at(11)) == []  # still held for everyone else
    [probe] = await claim(store, now=at(11), limit=1, probe=True)
    assert probe.id == e.id


async def test_probe_idle_and_a_failed_probe_reopen_with_backoff_and_a_success_closes(store):
    await store.enqueue(valid(), now=T0)
    await trip(store, T0)
    take = dict(provider="smtp", hold_seconds=30, lease_seconds=LEASE)
    assert await store.circuit_probe_take(owner="w1", **take, now=at(10))
    assert not await store.circuit_probe_idle(provider="smtp", owner="w2", probe_base=10, now=at(11))
    assert await store.circuit_probe_idle(provider="smtp", owner="w1", probe_base=10, now=at(11))
    c = await circuit(store, at(11))
    assert (c["state"], c["probes"], c["probe_in"], c["probe_owner"]) == ("open", 0, 10.0, None)
    assert await store.circuit_probe_take(owner="w1", **take, now=at(21))
    again = await trip(store, at(22), reason="tls_failed")  # the probe failed
    assert (again["from_state"], again["probes"], again["probe_in"]) == ("half_open", 1, 20.0)
    assert await store.circuit_probe_take(owner="w2", **take, now=at(42))
    assert (await trip(store, at(43)))["probe_in"] == 25.0  # at most probe_max
    # A half-open probe whose holder let the hold lapse is taken by another worker.
    assert await store.circuit_probe_take(owner="w3", **take, now=at(68))
    assert await store.circuit_probe_take(owner="w4", **take, now=at(99))
    assert await store.circuit_close(provider="smtp", reason="probe_succeeded", detail="ok", actor="w4", now=at(100))
    assert not await store.circuit_close(provider="smtp", reason="x", detail="y", actor="w4", now=at(101))
    c = await circuit(store, at(101))
    assert (c["state"], c["opened_at"], c["probes"], c["probe_at"], c["open_for"], c["openings"]) == (
        "closed",
        None,
        0,
        None,
        None,
        4,  # every move to open: the trip, the idle probe, two failed probes
    )
    assert len(await claim(store, now=at(101))) == 1


async def test_a_probe_is_taken_only_when_a_step_waits(store):
    await trip(store, T0, provider="http")
    take = dict(provider="http", owner="w1", hold_seconds=30, lease_seconds=LEASE)
    assert not await store.circuit_probe_take(**take, now=at(10))
    await store.enqueue(valid(provider="http"), now=at(20))
    assert await store.circuit_probe_take(**take, now=at(20))
    assert not await store.circuit_close(provider="smtp", reason="x", detail="y", actor="w1", now=at(21))


async def test_waiting_counts_what_a_drain_leaves_per_provider(store):
    """`evq worker run --drain`'s last read: due, later (send_at, with the earliest) and held, per provider."""
    assert await store.waiting(providers=["smtp", "http"], now=T0) == []
    for n in range(2):
        await store.enqueue(valid(step_id=f"due-{n}"), now=T0)
    soon, later = T0 + timedelta(hours=1), T0 + timedelta(hours=2)
    await store.enqueue(replace(valid(step_id="later"), send_at=later), now=T0)
    await store.enqueue(replace(valid(step_id="soon"), send_at=soon), now=T0)
    await store.enqueue(valid(step_id="held", require_approval=True), now=T0, approval=ApprovalPolicy(always=True))
    await store.enqueue(valid(step_id="other", provider="http"), now=T0)
    [sent] = await claim(store, now=at(1), providers=("http",))  # in flight: owed nothing more now
    assert sent.provider == "http"
    await store.enqueue(valid(step_id="elsewhere", provider="null"), now=T0)  # not asked about
    got = await store.waiting(providers=["smtp", "http"], now=at(2))
    assert got == [{"provider": "smtp", "due": 2, "later": 2, "next_at": soon, "held": 1}]
    # Time passes: the scheduled ones are due.
    [smtp] = await store.waiting(providers=["smtp"], now=later)
    assert (smtp["due"], smtp["later"], smtp["next_at"], smtp["held"]) == (4, 0, None, 1)
