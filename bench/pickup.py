"""The pickup mode: an idle worker, steps enqueued one at a time; enqueue-to-claim p50/p99 (from
the enqueue's commit) with LISTEN/NOTIFY and with polling only, read from the rows' own times."""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import psycopg

from bench.children import Child, evq_worker_spec
from bench.config import Figure
from bench.prefill import bench_requests, policy
from evq.worker.errors import EvqError

if TYPE_CHECKING:
    from bench.harness import Bench


def mode_pickup(bench: Bench) -> None:
    from bench import spawn

    c = bench.config
    spawn.measure(bench)
    for listen, label in (("on", "LISTEN/NOTIFY"), ("off", f"polling every {c.poll_interval:g}s")):
        p50s, p99s, rss = [], [], None
        for _ in range(c.runs):
            p50, p99, run_rss = _pickup_once(bench, listen)
            p50s.append(p50)
            p99s.append(p99)
            rss = max(rss or 0, run_rss)
        bench.add(
            Figure("pickup", f"evq pickup p50, {label}", "ms", p50s, rss, note="enqueue commit to claim, idle worker")
        )
        bench.add(
            Figure("pickup", f"evq pickup p99, {label}", "ms", p99s, rss, note="enqueue commit to claim, idle worker")
        )


def _pickup_once(bench: Bench, listen: str) -> tuple[float, float, float]:
    from evq.adapters.postgres.enqueue import enqueue

    c = bench.config
    samples = c.pickup_samples if listen == "on" else max(10, c.pickup_samples // 5)
    with bench.db.fresh() as url:
        child = Child(
            evq_worker_spec(
                url,
                concurrency=10,
                batch_size=c.batch_size,
                listen=listen,
                poll_interval=c.poll_interval,
                drain=False,
            )
        )
        try:
            child.wait_ready()
            child.go()
            time.sleep(0.3)  # the worker's first (empty) claim and rescue pass
            validation_policy = policy()
            committed: dict[int, float] = {}
            with psycopg.connect(url) as conn:
                for request in bench_requests(samples, run_id="pickup"):
                    step = enqueue(conn, request, policy=validation_policy)
                    # From the commit, when the step exists for a worker: the row's
                    # created_at is its transaction's start, which would also count the
                    # enqueue itself. Same host, same clock as the server's now(). Read
                    # just before COMMIT is sent, not after it returns: the worker's claim
                    # starts only once the commit is visible, so the lag is never negative,
                    # whereas a clock read after the answer (this process descheduled on a
                    # loaded machine) came after the claim: -0.7 ms, an impossible figure.
                    committed[step.id] = time.time()
                    conn.commit()
                    # A random phase against the poll interval; never two in flight.
                    time.sleep(random.uniform(0.01, c.poll_interval) if listen == "off" else 0.02)
                deadline = time.monotonic() + 10 * c.poll_interval + 5
                while time.monotonic() < deadline:
                    left = conn.execute("SELECT count(*) FROM email_steps WHERE status <> 'accepted'").fetchone()[0]
                    conn.commit()
                    if not left:
                        break
                    time.sleep(0.05)
                lags = sorted(
                    (r[1].timestamp() - committed[r[0]]) * 1000
                    for r in conn.execute(
                        "SELECT id, first_attempt_at FROM email_steps WHERE first_attempt_at IS NOT NULL"
                    ).fetchall()
                )
            child.stop()
            result = child.result()
        finally:
            child.kill()
    if len(lags) != samples:
        raise EvqError(f"pickup: {samples - len(lags)} of {samples} steps were never claimed")
    return percentile(lags, 50), percentile(lags, 99), result.rss_mb


def percentile(values: Sequence[float], pct: float) -> float:
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(pct / 100 * (len(ordered) - 1))))
    return float(ordered[k])
