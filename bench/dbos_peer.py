"""The peer "DBOS Transact" (``dbos`` on PyPI, in the optional ``bench`` extra): a durable
workflow per email, whose one step "sends" (a no-op), run from a DBOS queue.

Its setup, kept to what DBOS's documentation shows (DBOSConfig, DBOS.launch, register_queue,
a workflow calling a step):

- its system database is a database of its own on the same server, created and dropped by the
  bench like every other; DBOS makes its schema there at the first launch;
- a fill process (not timed) launches DBOS, registers the queue ``bench`` with
  ``worker_concurrency=0`` (so no process dequeues yet) and enqueues the N workflows;
- each drain process launches DBOS with its own ``executor_id``, says ready, and at ``go`` sets
  the queue's ``worker_concurrency`` to the cap (100 per process: pgqueuer's best task cap);
  the queue is polled every 50 ms (DBOS's default is 1 s, which alone would cap a process at
  100 workflows a second);
- a drain process is done when no workflow of the queue is ENQUEUED or PENDING (it looks every
  20 ms); the parent then checks that all N ended in SUCCESS, each with its step's checkpoint.

Synchronous workflows (DBOS's own examples; each runs on DBOS's thread pool); the application
version is fixed so every process dequeues the same workflows.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import psycopg

from bench.children import run_children, span
from evq.worker.errors import ConfigError, EvqError

if TYPE_CHECKING:
    from bench.harness import Bench

QUEUE = "bench"
WORKER_CONCURRENCY = 100
POLL_SECONDS = 0.05
DONE_CHECK_SECONDS = 0.02
FILL_THREADS = 8


def version() -> str | None:
    try:
        from importlib.metadata import version as installed

        return installed("dbos")
    except Exception:
        return None


def available(bench: Bench) -> str | None:
    """DBOS's version when the peer mode will measure it; None (with a note) when it will not."""
    if bench.config.peer == "off" or "peer" not in bench.config.modes:
        return None
    try:
        import dbos  # noqa: F401
    except ImportError:
        if bench.config.peer == "on":
            raise ConfigError("dbos is not installed", hint="pip install 'evq[bench]'") from None
        bench.notes.append("dbos is not installed (pip install 'evq[bench]'): DBOS Transact figures omitted")
        return None
    return version() or "?"


def system_url(conninfo: str) -> str:
    """The libpq conninfo the bench uses, as the URL DBOS takes (SQLAlchemy's form)."""
    info = psycopg.conninfo.conninfo_to_dict(conninfo)
    user = quote(str(info.get("user", "")), safe="")
    password = info.get("password")
    auth = f"{user}:{quote(str(password), safe='')}@" if password else (f"{user}@" if user else "")
    host = str(info.get("host", ""))
    port = f":{info['port']}" if info.get("port") else ""
    query = ""
    if host.startswith("/"):  # a Unix socket's folder
        query, host = f"?host={quote(host, safe='')}", ""
    return f"postgresql://{auth}{host}{port}/{quote(str(info['dbname']), safe='')}{query}"


def drain_once(bench: Bench, processes: int) -> tuple[float, float]:
    """Workflows/s and peak RSS of ``processes`` DBOS processes draining the queue's N workflows."""
    n = bench.config.steps
    name = bench.db.create()
    url = bench.db.url(name)
    try:
        base = {"kind": "dbos", "url": system_url(url), "check_url": url, "expected": n}
        run_children([{**base, "role": "fill", "executor": "bench-fill"}])
        results = run_children(
            [{**base, "role": "drain", "executor": f"bench-{i}", "cap": WORKER_CONCURRENCY} for i in range(processes)]
        )
        check(url, n)
        if sum(r.detail["workflows"] for r in results) != n:
            raise EvqError("DBOS drain did not run every workflow in its processes")
        return n / span(results), max(r.rss_mb for r in results)
    finally:
        bench.db.drop(name)


def check(url: str, n: int) -> None:
    with psycopg.connect(url) as conn:
        done = conn.execute(
            "SELECT count(*) FROM dbos.workflow_status WHERE queue_name = %s AND status = 'SUCCESS'", (QUEUE,)
        ).fetchone()[0]
        steps = conn.execute("SELECT count(*) FROM dbos.operation_outputs").fetchone()[0]
    if done != n or steps < n:
        raise EvqError(f"DBOS drain: {done} of {n} workflows succeeded, {steps} step checkpoints")


# The child's side (``python -m bench.child`` with kind "dbos"): synchronous, as DBOS's
# queue API is (its register and set calls refuse to run inside an event loop).


def run_child(spec: dict[str, Any], wait_go: Callable[[], float], rss_mb: Callable[[], float]) -> dict[str, Any]:
    from dbos import DBOS, DBOSConfig

    done = 0
    lock = threading.Lock()

    @DBOS.step()
    def send(i: int) -> None:
        """The no-op send."""

    @DBOS.workflow()
    def email(i: int) -> None:
        nonlocal done
        send(i)
        with lock:
            done += 1

    config: DBOSConfig = {
        "name": "evq-bench",
        "system_database_url": spec["url"],
        "application_version": "evq-bench",
        "executor_id": spec["executor"],
        "log_level": "WARNING",
    }
    DBOS(config=config)
    try:
        DBOS.launch()
        queue = DBOS.register_queue(QUEUE, worker_concurrency=0, polling_interval_sec=POLL_SECONDS)
        started = wait_go()
        if spec["role"] == "fill":
            with ThreadPoolExecutor(FILL_THREADS) as pool:
                list(pool.map(lambda i: queue.enqueue(email, i), range(spec["expected"])))
            return {"started": started, "finished": time.time(), "rss_mb": rss_mb(), "detail": {"workflows": 0}}
        queue.set_worker_concurrency(spec["cap"])
        with psycopg.connect(spec["check_url"], autocommit=True) as conn:
            while conn.execute(
                "SELECT EXISTS (SELECT FROM dbos.workflow_status WHERE queue_name = %s"
                " AND status IN ('ENQUEUED', 'PENDING'))",
                (QUEUE,),
            ).fetchone()[0]:
                time.sleep(DONE_CHECK_SECONDS)
        finished = time.time()
        with lock:
            workflows = done
        return {"started": started, "finished": finished, "rss_mb": rss_mb(), "detail": {"workflows": workflows}}
    finally:
        DBOS.destroy()
        sys.stdout.flush()
