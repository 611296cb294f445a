"""The overview's pictures (worker/ports/charts.py) against the PostgreSQL store: sends by outcome per
bucket, unknown rows by age, the per-provider figures, and the queue sampler's minutes (first
writer wins, older than the kept window deleted as it writes)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from evq.worker.errors import InvalidRequest
from evq.worker.outcomes import Accepted, Rejected
from evq.worker.window import KEEP_SAMPLES
from tests.conformance.helpers import T0, at, claim, rescue, settle
from tests.support import valid


async def _sends(store):
    """Four attempts at T0+10s: two accepted (10 and 30 ms), one rejected (20 ms), and one
    whose lease ran out with no answer, made unknown by the rescuer at T0+71s."""
    for i in range(4):
        await store.enqueue(valid(step_id=f"c{i}"), now=T0)
    steps = sorted(await claim(store, now=at(10)), key=lambda s: s.id)
    answers = [(Accepted("m1"), 10.0), (Accepted("m2"), 30.0), (Rejected("550 no such user"), 20.0)]
    await store.record(
        [settle(s, outcome, latency_ms=ms) for s, (outcome, ms) in zip(steps, answers, strict=False)],
        actor="w1",
        now=at(11),
    )
    await rescue(store, at(71))
    return steps


async def test_sends_are_counted_per_bucket_by_outcome_with_the_lost_answer_apart(store):
    await _sends(store)
    rows = await store.chart_sends(1, now=at(600))
    got = [(r["at"], r["outcome"], r["n"]) for r in rows]
    assert got == [(T0, "accepted", 2), (T0, "rejected", 1), (at(60), "no_answer", 1)]
    # Six-hour buckets are five minutes wide: everything falls in T0's.
    assert [(r["at"], r["n"]) for r in await store.chart_sends(6, now=at(600))] == [
        (T0, 2),
        (T0, 1),
        (T0, 1),
    ]
    # A window that ends before the sends, or starts after them, holds none.
    assert await store.chart_sends(1, now=at(5)) == []
    assert await store.chart_sends(1, now=at(2 * 3600)) == []


async def test_each_provider_shows_attempts_answers_and_latency_in_the_window(store):
    await _sends(store)
    [smtp] = await store.chart_providers(1, now=at(600))
    assert smtp["provider"] == "smtp"
    counts = {k: smtp[k] for k in ("attempts", "accepted", "rejected", "retryable", "unknown", "no_answer")}
    assert counts == {"attempts": 4, "accepted": 2, "rejected": 1, "retryable": 0, "unknown": 0, "no_answer": 1}
    assert smtp["p50_ms"] == pytest.approx(20.0) and smtp["p95_ms"] == pytest.approx(29.0)
    assert await store.chart_providers(24, now=at(2 * 86400)) == []


async def test_unknown_rows_are_counted_by_their_age_now(store):
    await _sends(store)
    assert await store.chart_unknown_ages(now=at(71 + 60)) == [1, 0, 0, 0, 0, 0, 0]
    assert await store.chart_unknown_ages(now=at(71 + 400)) == [0, 1, 0, 0, 0, 0, 0]
    assert await store.chart_unknown_ages(now=at(71 + 4 * 86400)) == [0, 0, 0, 0, 0, 0, 1]


async def test_a_window_other_than_1_6_or_24_hours_is_refused(store):
    with pytest.raises(InvalidRequest):
        await store.chart_sends(2, now=T0)
    with pytest.raises(InvalidRequest):
        await store.chart_queue_samples(0, now=T0)


async def test_the_first_sample_of_a_minute_wins_and_old_minutes_go_as_it_writes(store):
    await _sends(store)
    assert await store.sample_queue("w1", keep_seconds=KEEP_SAMPLES, now=at(100))
    assert not await store.sample_queue("w2", keep_seconds=KEEP_SAMPLES, now=at(110))  # same minute
    assert await store.sample_queue("w2", keep_seconds=KEEP_SAMPLES, now=at(190))  # the next one
    rows = await store.chart_queue_samples(1, now=at(600))
    assert [r["at"] for r in rows] == [at(60), at(180)]
    first = rows[0]
    figures = {k: first[k] for k in ("pending", "claimable", "in_flight", "retryable", "unknown", "held")}
    assert figures == {"pending": 0, "claimable": 0, "in_flight": 0, "retryable": 0, "unknown": 1, "held": 0}
    assert first["unknown_oldest_seconds"] == pytest.approx(29.0) and first["lag_seconds"] == 0
    # Eight days later a sample deletes both: the minute at(100) can be written again.
    assert await store.sample_queue("w1", keep_seconds=KEEP_SAMPLES, now=at(100) + timedelta(days=8))
    assert await store.sample_queue("w1", keep_seconds=KEEP_SAMPLES, now=at(100))
    assert [r["at"] for r in await store.chart_queue_samples(1, now=at(600))] == [at(60)]


async def test_a_sample_counts_what_waits_and_how_long_the_oldest_due_has_waited(store):
    await store.enqueue(valid(step_id="w1"), now=T0)
    await store.enqueue(valid(step_id="w2"), now=at(30))
    assert await store.sample_queue("w1", keep_seconds=KEEP_SAMPLES, now=at(90))
    [row] = await store.chart_queue_samples(1, now=at(90))
    assert (row["pending"], row["claimable"], row["unknown"], row["unknown_oldest_seconds"]) == (2, 2, 0, None)
    assert row["lag_seconds"] == pytest.approx(90.0)


async def test_rolled_up_minutes_give_the_same_sends_as_the_evidence_at_every_window(store):
    """The sends chart reads rollups for the complete minutes and evidence for the rest: the
    totals are the direct count's before and after a rollup, for a window starting mid-minute,
    and for rows recorded after the watermark (counted live until the next rollup)."""
    await _sends(store)
    views = [(h, at(600)) for h in (1, 6, 24)] + [(1, at(3600 + 40))]
    before = [await store.chart_sends(h, now=t) for h, t in views]
    providers_before = [await store.chart_providers(h, now=t) for h, t in views]
    assert all(p and p[0]["attempts"] for p in providers_before[:3])
    # First run at T0+10m: from 24 h back up to T0+8m (minutes that ended 2 minutes ago).
    assert await store.roll_up_sends(keep_seconds=KEEP_SAMPLES, now=at(600)) == 24 * 60 - 2
    assert await store.roll_up_sends(keep_seconds=KEEP_SAMPLES, now=at(610)) == 0  # nothing new complete
    assert [await store.chart_sends(h, now=t) for h, t in views] == before
    # The per-provider counts read the same rollups: the same figures, latencies included
    # (those are read live over the window's last hour, never from rollups).
    assert [await store.chart_providers(h, now=t) for h, t in views] == providers_before
    # Starting at T0+40s, T0's minute is only partly in the window: its answers are out, the
    # no-answer at T0+71s is in.
    assert [(r["at"], r["outcome"], r["n"]) for r in before[3]] == [(at(60), "no_answer", 1)]
    # An answer recorded at T0+650s, after the watermark: counted live, then rolled up.
    await store.enqueue(valid(step_id="late"), now=at(640))
    [late] = await claim(store, now=at(645))
    await store.record([settle(late, Accepted("m9"), latency_ms=5.0)], actor="w1", now=at(650))
    expected = [(T0, "accepted", 2), (T0, "rejected", 1), (at(60), "no_answer", 1), (at(600), "accepted", 1)]
    got = [(r["at"], r["outcome"], r["n"]) for r in await store.chart_sends(1, now=at(700))]
    assert got == expected
    assert await store.roll_up_sends(keep_seconds=KEEP_SAMPLES, now=at(900)) == 5  # T0+8m .. T0+13m
    got = [(r["at"], r["outcome"], r["n"]) for r in await store.chart_sends(1, now=at(900))]
    assert got == expected
