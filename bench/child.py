"""One benchmark worker process: ``python -m bench.child SPEC-JSON``.

It wires an evq worker (or a peer: a pgqueuer consumer, with or without evidence rows, or a DBOS
process) from the spec, prints ``ready``, waits for ``go`` on stdin, drains, and prints one JSON
line: when it started and finished (wall clock), its peak RSS and what it did.
bench/children.py is the parent's side.
"""

from __future__ import annotations

import asyncio
import json
import resource
import sys
import time
from collections.abc import Sequence
from typing import Any


def _rss_mb() -> float:
    """Peak RSS of this process image. VmHWM, not ru_maxrss: a child forked from a
    large parent inherits the parent's high-water mark in ru_maxrss, even across exec."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _wait_go_sync() -> float:
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        raise SystemExit(2)
    return time.time()


async def _wait_go() -> float:
    return await asyncio.to_thread(_wait_go_sync)


async def _child_evq(spec: dict[str, Any]) -> dict[str, Any]:
    from evq.ops import wiring
    from evq.ops.settings import Settings

    settings = Settings.load(env={}, database_url=spec["url"], **{k: str(v) for k, v in spec["settings"].items()})
    wiring.setup_logging(settings)
    async with wiring.prepared_worker(settings) as worker:
        started = await _wait_go()
        cpu = _cpu_seconds()
        code = await worker.run(drain=spec["drain"], install_signals=not spec["drain"])
        finished = time.time()
        cpu = _cpu_seconds() - cpu
    return {
        "started": started,
        "finished": finished,
        "rss_mb": _rss_mb(),
        "detail": {
            "exit_code": code,
            "claimed": worker.stats.claimed,
            "flushes": worker.recorder.flushes,
            "cpu_seconds": round(cpu, 3),
        },
    }


async def _child_pgqueuer(spec: dict[str, Any]) -> dict[str, Any]:
    from pgqueuer import PgQueuer
    from pgqueuer.types import QueueExecutionMode

    from bench.evidence_peer import Writer
    from bench.peer import connect

    pgq = PgQueuer(await connect(spec["url"], spec["driver"]))
    jobs = 0
    first_job_at: float | None = None
    # "pgqueuer with evidence" (bench/evidence_peer.py): an attempt row committed before the
    # send, an outcome row after it, each its own transaction.
    writer = await Writer.open(spec["url"], spec["driver"]) if spec.get("evidence") else None

    @pgq.entrypoint("bench")
    async def handler(job: Any) -> None:
        nonlocal jobs, first_job_at
        if first_job_at is None:
            first_job_at = time.time()
        if writer is not None:
            await writer.write(job.id, "attempt")
            # the send: a no-op, as in every other drain of the benchmark
            await writer.write(job.id, "outcome")
        jobs += 1

    # A spawn measurement (bench/spawn.py) times the start-up too: no ready/go.
    started = time.time() if spec.get("spawn") else await _wait_go()
    try:
        await pgq.run(
            batch_size=spec["batch_size"],
            mode=QueueExecutionMode.drain,
            max_concurrent_tasks=spec["max_concurrent_tasks"],
        )
        finished = time.time()
    finally:
        if writer is not None:
            await writer.close()
    detail = {"jobs": jobs, "first_job_at": first_job_at}
    return {"started": started, "finished": finished, "rss_mb": _rss_mb(), "detail": detail}


def child_main(argv: Sequence[str]) -> None:
    spec = json.loads(argv[0])
    if spec["kind"] == "dbos":
        from bench.dbos_peer import run_child

        result = run_child(spec, _wait_go_sync, _rss_mb)
    else:
        run = _child_evq if spec["kind"] == "evq" else _child_pgqueuer
        result = asyncio.run(run(spec))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    child_main(sys.argv[1:])
