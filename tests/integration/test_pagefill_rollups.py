"""The ops-pages fill (bench/pagefill.py) leaves the send rollups a running sampler would:
the watermark a few minutes behind now, 7 days kept, and every rolled-up minute's counts the
evidence's own, so the timed pages read what a running system's pages read (issue 18)."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import psycopg

from bench import pagefill
from evq.adapters.postgres.store import PostgresStore

# The rollup's classification of an evidence row (queries.sql send_rollup).
OUTCOME = """CASE e.kind WHEN 'attempt_started' THEN 'attempt' WHEN 'provider_response' THEN e.outcome
                  ELSE 'no_answer' END"""
COUNTED = """(e.kind IN ('attempt_started', 'provider_response')
              OR (e.kind = 'lease_expired' AND e.to_status = 'unknown'))"""


def test_the_fill_rolls_up_the_sends_as_a_running_sampler_does(db_url):
    pagefill.fill(db_url, 3000)
    with psycopg.connect(db_url) as conn:
        since, upto, now = conn.execute("SELECT since, upto, now() FROM send_rollup_watermark").fetchone()
        # As a sampler running every minute leaves it: complete minutes up to 2-3 minutes ago,
        # 7 days back (the kept window), so a page reads only the last few minutes live.
        assert timedelta(minutes=2) <= now - upto <= timedelta(minutes=4)
        assert now - since >= timedelta(days=pagefill.DAYS) - timedelta(minutes=5)
        rolled = dict(
            conn.execute(
                "SELECT outcome, sum(n)::bigint FROM send_rollups WHERE minute >= %s AND minute < %s GROUP BY 1",
                (since, upto),
            ).fetchall()
        )
        counted = dict(
            conn.execute(
                f"SELECT {OUTCOME}, count(*) FROM evidence e WHERE {COUNTED} "
                "AND e.created_at >= %s AND e.created_at < %s GROUP BY 1",
                (since, upto),
            ).fetchall()
        )
        assert rolled == counted and rolled["attempt"] > 3000 and rolled["accepted"] > 0
        # No minute twice, none outside the watermark's span.
        [[outside]] = conn.execute(
            "SELECT count(*) FROM send_rollups WHERE minute < %s OR minute >= %s", (since, upto)
        ).fetchall()
        assert outside == 0

    async def charted() -> dict[str, int]:
        store = await PostgresStore.open(db_url, max_size=1)
        try:
            rows = await store.chart_sends(24, now=now)
        finally:
            await store.close()
        out: dict[str, int] = {}
        for row in rows:
            out[row["outcome"]] = out.get(row["outcome"], 0) + int(row["n"])
        return out

    # The day's chart (rollups and the live minutes after them) says what the evidence says.
    with psycopg.connect(db_url) as conn:
        live = dict(
            conn.execute(
                f"SELECT {OUTCOME}, count(*) FROM evidence e WHERE {COUNTED} AND e.kind <> 'attempt_started' "
                "AND e.created_at >= %s AND e.created_at < %s GROUP BY 1",
                (now - timedelta(hours=24), now),
            ).fetchall()
        )
    assert asyncio.run(charted()) == live
