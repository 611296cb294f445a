"""The enqueue mode: single enqueue through the Python API (its own transaction, and inside a
caller's), batch enqueue (``enqueue_many``) and request validation, each run paired with
pgqueuer's enqueue when it is installed."""

from __future__ import annotations

import statistics
import time
from typing import TYPE_CHECKING, Any

import psycopg

from bench import peer as pgqueuer_peer
from bench.config import Figure
from bench.prefill import bench_requests, policy

if TYPE_CHECKING:
    from bench.harness import Bench


def single_enqueues(conn: psycopg.Connection[Any], requests: list[Any], validation_policy: Any) -> tuple[float, float]:
    """Each request enqueued alone on ``conn`` (committed after each unless it autocommits):
    the rate, and the median call's milliseconds (as pgqueuer's are timed)."""
    from evq.adapters.postgres.enqueue import enqueue

    calls = []
    started = time.perf_counter()
    for request in requests:
        call = time.perf_counter()
        enqueue(conn, request, policy=validation_policy)
        if not conn.autocommit:
            conn.commit()
        calls.append(time.perf_counter() - call)
    return len(requests) / (time.perf_counter() - started), statistics.median(calls) * 1000


def mode_enqueue(bench: Bench) -> None:
    c = bench.config
    requests = bench_requests(c.enqueue_single, run_id="single")
    validation_policy = policy()

    def single(autocommit: bool) -> tuple[float, float]:
        """The rate, and the median call's milliseconds (as pgqueuer's are timed)."""
        # Autocommit: the one statement is the transaction, as the store's pool does it
        # (and as pgqueuer's single enqueue is measured). Otherwise the caller's BEGIN
        # and COMMIT add two round trips around the same statement.
        with bench.db.fresh() as url, psycopg.connect(url, autocommit=autocommit) as conn:
            return single_enqueues(conn, requests, validation_policy)

    # Each run measures evq and (when installed) pgqueuer back to back, so the ratio
    # compares the two under the same load, not minutes apart on a shared machine.
    own, own_p50, in_caller, batch, peer = [], [], [], [], []
    writes = bench.batch_enqueue_seconds  # the drain mode's batch enqueues, when it ran
    for _ in range(c.runs):
        rate, p50 = single(True)
        own.append(rate)
        own_p50.append(p50)
        if bench.peer_driver is not None:
            peer.append(pgqueuer_peer.enqueue_once(bench))
        in_caller.append(single(False)[0])
        if not writes:
            batch.append(_batch_once(bench)[0])
    figures = (
        (
            bench.add(
                Figure(
                    "enqueue",
                    "evq single enqueue (Python API, own transaction)",
                    "steps/s",
                    own,
                    note="validation + decision and step in one statement, autocommit: one round trip each",
                )
            ),
            "pgqueuer_single",
            0,
        ),
        (
            bench.add(
                Figure(
                    "enqueue",
                    "evq single enqueue (Python API, in a caller's transaction)",
                    "steps/s",
                    in_caller,
                    note="BEGIN, validation + decision and step, COMMIT: three round trips each",
                )
            ),
            "pgqueuer_single",
            0,
        ),
        (
            bench.add(
                Figure(
                    "enqueue",
                    "evq batch enqueue (enqueue_many)",
                    "steps/s",
                    batch or [c.steps / s for s in writes],
                    note=f"{c.steps} validated requests in one transaction",
                )
            ),
            "pgqueuer_batch",
            2,
        ),
        (
            bench.add(
                Figure(
                    "enqueue",
                    "evq single enqueue p50 (own transaction)",
                    "ms",
                    own_p50,
                    note="each call's time, validation included, autocommit",
                )
            ),
            "pgqueuer_single_p50",
            1,
        ),
    )
    if peer:
        pgqueuer_peer.add_enqueue_figures(bench, peer, "measured alternately with evq's enqueue")
        # Paired runs: the median of each run's own ratio, so a burst of load that
        # hits one run of both does not skew the ratio of the medians.
        for fig, key, i in figures:
            if len(fig.values) == len(peer):
                fig.ratios[key] = statistics.median(v / p[i] for v, p in zip(fig.values, peer, strict=True))
    validate = bench.prefill.validate_seconds.get(c.steps)
    if validate:
        bench.add(
            Figure(
                "enqueue",
                "evq request validation (before any write)",
                "requests/s",
                [c.steps / validate],
                note="parse + address checks, in the caller's process",
            )
        )


def _batch_once(bench: Bench) -> tuple[float, None]:
    with bench.db.fresh() as url:
        return bench.config.steps / bench.prefill.enqueue(url, bench.config.steps), None
