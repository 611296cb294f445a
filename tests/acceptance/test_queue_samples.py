"""A worker run for real samples the queue (worker/sampler.py): `evq worker run --drain` writes
this minute's row, signed with its owner, and the minutes older than 7 days are gone after it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from tests.acceptance.conftest import Evq
from tests.support import execute, rows, valid, with_store


def test_a_drained_worker_run_writes_a_queue_sample_and_drops_week_old_ones(db_url):
    old = (datetime.now(UTC) - timedelta(days=7, minutes=5)).replace(second=0, microsecond=0)
    kept = (datetime.now(UTC) - timedelta(days=6)).replace(second=0, microsecond=0)
    for at in (old, kept):
        execute(
            db_url,
            "INSERT INTO queue_samples (at, pending, claimable, lag_seconds, in_flight, retryable, unknown, held, sampled_by)"
            " VALUES (%s, 0, 0, 0, 0, 0, 0, 0, 'test')",
            (at,),
        )
    # One send waiting for a provider this worker does not run: it stays pending, and is counted.
    with_store(
        db_url, lambda store: store.enqueue(valid(provider="http"), now=datetime.now(UTC) - timedelta(minutes=3))
    )
    done = Evq(db_url, process=True).run("worker", "run", "--drain", EVQ_ADAPTER="smtp")
    assert done.returncode == 0, done.stderr[-2000:]
    samples = rows(db_url, "SELECT * FROM queue_samples ORDER BY at")
    assert [s["at"] for s in samples[:1]] == [kept]  # the week-old minute went with the write
    [mine] = [s for s in samples if s["sampled_by"] != "test"]
    assert mine["at"] > datetime.now(UTC) - timedelta(minutes=2)
    assert (mine["pending"], mine["claimable"], mine["unknown"], mine["unknown_oldest_seconds"]) == (1, 1, 0, None)
    assert 170 <= mine["lag_seconds"] <= 3600
    assert mine["sampled_by"].count(":") == 2  # the worker's owner: host:pid:token
