"""The benchmark's requests: made and validated once, batch-enqueued into each run's fresh database."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import psycopg

from evq.worker.errors import EvqError


def bench_requests(n: int, *, run_id: str = "bench") -> list[dict[str, Any]]:
    return [
        {
            "run_id": run_id,
            "step_id": f"s{i}",
            "to": [f"user{i}@example.com"],
            "from": "agent@example.org",
            "subject": f"Benchmark message {i}",
            "text": "A benchmark body: the null adapter accepts it without sending anything.",
            "intent": "benchmark",
            "provider": "null",
            "decision": {"model": "bench", "tool": "send_email", "instruction_version": "v1", "rationale": "bench"},
        }
        for i in range(n)
    ]


def policy() -> Any:
    from evq.ops.option_catalogue import ADAPTERS
    from evq.worker.request import Policy

    return Policy(providers=tuple(ADAPTERS), default_provider="null")


class Prefill:
    """Validated requests, made once and enqueued into each run's fresh database."""

    def __init__(self) -> None:
        self._valid: dict[int, list[Any]] = {}
        self.validate_seconds: dict[int, float] = {}

    def valid(self, n: int) -> list[Any]:
        from evq.worker.enqueue import validate_many

        if n not in self._valid:
            started = time.perf_counter()
            self._valid[n] = validate_many(bench_requests(n), policy())
            self.validate_seconds[n] = time.perf_counter() - started
        return self._valid[n]

    def enqueue(self, url: str, n: int, *, run_id: str = "bench") -> float:
        """Batch-enqueue n steps; the seconds the write took (one transaction)."""
        from evq.adapters.postgres.batch_enqueue import enqueue_many_op
        from evq.adapters.postgres.op_runner import run_sync
        from evq.worker.request import default_idempotency_key

        valid = self.valid(n)
        if run_id != "bench":
            valid = [
                replace(v, run_id=run_id, idempotency_key=default_idempotency_key(run_id, v.step_id)) for v in valid
            ]
        with psycopg.connect(url) as conn:
            started = time.perf_counter()
            results = run_sync(conn, enqueue_many_op(valid))
            conn.commit()
            elapsed = time.perf_counter() - started
            conn.execute("ANALYZE email_steps")
        if sum(r.created for r in results) != n:
            raise EvqError("benchmark prefill did not create every step")
        return elapsed
