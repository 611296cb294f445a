"""evq bench: evq measured against the raw SQL ceiling and a peer queue, in one run.

Every figure is the median (and min-max) of repeated runs, and is also printed as
a ratio to the ceiling and the peer measured minutes earlier on the same machine:
on a shared, noisy machine the ratios hold much better than the absolute numbers.

Modes (README, "Benchmark"):
- drain: N steps enqueued by the batch enqueue, drained by 1 and 2 worker
  processes through the null adapter: the real claim, attempt and outcome path.
- latency: the null adapter answering after 50 ms, concurrency 50/200/500 per
  process, against the ideal ``concurrency / delay``.
- enqueue: single enqueue through the Python API (decision and step in one
  statement, its own transaction; and inside a caller's BEGIN ... COMMIT), and
  batch enqueue (``enqueue_many``).
- pickup: an idle worker; steps enqueued one at a time; enqueue-to-claim p50/p99 (from the commit)
  with LISTEN/NOTIFY and with polling only (both read from the rows' own times).
- scale: the drain with 1,000,000 terminal rows already present, and the metrics
  collector's query at that size (the one /metrics runs, QueueStatsReader).
- ceiling and peer: claim 100 rows with SKIP LOCKED and finish them with one
  batched UPDATE (and with one commit per row); pgqueuer (the optional ``bench``
  extra) draining the same number of no-op jobs, and its single and batch enqueue.

Worker processes are real processes (``python -m ops.bench.harness CHILD-JSON``): each one
wires itself, says it is ready, and starts when told, so start-up is never timed.
Every worker reports its peak RSS. The benchmark creates its own databases on the
server it is pointed at (it needs CREATE DATABASE) and drops them afterwards.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import psycopg

from evq.ops.bench.modes import MODES
from evq.worker.errors import ConfigError, EvqError

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True, slots=True)
class BenchConfig:
    server_url: str
    steps: int = 20_000
    runs: int = 3
    modes: tuple[str, ...] = MODES
    drain_processes: tuple[int, ...] = (1, 2)
    drain_concurrency: int = 200
    batch_size: int = 100
    latency_delay: float = 0.05
    latency_concurrency: tuple[int, ...] = (50, 200, 500)
    latency_waves: int = 20  # each run sends concurrency x waves steps
    enqueue_single: int = 2_000
    pickup_samples: int = 200
    poll_interval: float = 0.25
    scale_rows: int = 1_000_000
    peer: str = "auto"  # auto: measure pgqueuer when it is installed; on: require it; off

    @classmethod
    def quick(cls, server_url: str, **overrides: Any) -> BenchConfig:
        """CI-sized: every mode, seconds each, one run."""
        base = cls(
            server_url,
            steps=2_000,
            runs=1,
            latency_waves=4,
            enqueue_single=200,
            pickup_samples=20,
            scale_rows=20_000,
        )
        return replace(base, **overrides)

    def validate(self) -> BenchConfig:
        problems = []
        if self.steps < 100:
            problems.append("--steps must be at least 100")
        if self.runs < 1:
            problems.append("--runs must be at least 1")
        if self.scale_rows < 1000:
            problems.append("--scale-rows must be at least 1000")
        if not self.drain_processes or not all(1 <= p <= 64 for p in self.drain_processes):
            problems.append("--processes must be between 1 and 64")
        if unknown := set(self.modes) - set(MODES):
            problems.append(f"unknown mode(s) {', '.join(sorted(unknown))}; known: {', '.join(MODES)}")
        if self.peer not in ("auto", "on", "off"):
            problems.append("peer must be auto, on or off")
        if problems:
            raise ConfigError("; ".join(problems))
        return self


@dataclass
class Figure:
    """One measured quantity over repeated runs."""

    mode: str
    name: str
    unit: str
    values: list[float]
    rss_mb: float | None = None
    ratios: dict[str, float | None] = field(default_factory=dict)
    note: str | None = None

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "name": self.name,
            "unit": self.unit,
            "median": round(self.median, 3),
            "min": round(min(self.values), 3),
            "max": round(max(self.values), 3),
            "runs": [round(v, 3) for v in self.values],
            "rss_mb": None if self.rss_mb is None else round(self.rss_mb, 1),
            "ratios": {k: None if v is None else round(v, 3) for k, v in self.ratios.items()},
            "note": self.note,
        }


# -- databases --------------------------------------------------------------------


def _with_database(url: str, name: str) -> str:
    info = psycopg.conninfo.conninfo_to_dict(url)
    info["dbname"] = name
    return psycopg.conninfo.make_conninfo(**info)


class Databases:
    """Scratch databases on the server: one migrated template, a clone per run."""

    def __init__(self, server_url: str):
        self.server_url = server_url
        self.prefix = f"evq_bench_{os.getpid()}"
        self.template = f"{self.prefix}_tpl"
        self._made: list[str] = []
        self._n = 0

    def _admin(self, sql: str) -> None:
        with psycopg.connect(self.server_url, autocommit=True, connect_timeout=10) as conn:
            conn.execute(sql)

    def create(self, template: str | None = None) -> str:
        self._n += 1
        name = f"{self.prefix}_{self._n}"
        self._admin(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else ""))
        self._made.append(name)
        return name

    def url(self, name: str) -> str:
        return _with_database(self.server_url, name)

    def migrated_template(self) -> None:
        from evq.adapters.postgres.database import upgrade

        self._admin(f'CREATE DATABASE "{self.template}"')
        self._made.append(self.template)
        upgrade(self.url(self.template))

    @contextmanager
    def fresh(self) -> Iterator[str]:
        """A clone of the migrated template for one run, dropped afterwards."""
        name = self.create(self.template)
        try:
            yield self.url(name)
        finally:
            self.drop(name)

    def drop(self, name: str) -> None:
        self._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        if name in self._made:
            self._made.remove(name)

    def drop_all(self) -> None:
        for name in reversed(list(self._made)):
            try:
                self.drop(name)
            except psycopg.Error:
                pass


# -- requests -----------------------------------------------------------------------


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


def _policy() -> Any:
    from evq.ops.settings import ADAPTERS
    from evq.worker.request import Policy

    return Policy(providers=tuple(ADAPTERS), default_provider="null")


class Prefill:
    """Validated requests, made once and enqueued into each run's fresh database."""

    def __init__(self) -> None:
        self._valid: dict[int, list[Any]] = {}
        self.validate_seconds: dict[int, float] = {}

    def valid(self, n: int) -> list[Any]:
        from evq.adapters.postgres.enqueue import validate_many

        if n not in self._valid:
            started = time.perf_counter()
            self._valid[n] = validate_many(bench_requests(n), _policy())
            self.validate_seconds[n] = time.perf_counter() - started
        return self._valid[n]

    def enqueue(self, url: str, n: int, *, run_id: str = "bench") -> float:
        """Batch-enqueue n steps; the seconds the write took (one transaction)."""
        from evq.adapters.postgres.enqueue import enqueue_many_op, run_sync
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


# -- worker processes ------------------------------------------------------------------


@dataclass
class ChildResult:
    started: float  # wall clock, time.time(), when it was told to go
    finished: float
    rss_mb: float
    detail: dict[str, Any]


class Child:
    """A worker process that prepares, says ready, runs on 'go', and reports one JSON line."""

    def __init__(self, spec: dict[str, Any]):
        self.log = tempfile.NamedTemporaryFile(prefix="evq-bench-", suffix=".log", delete=False)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "evq.ops.bench.harness", json.dumps(spec)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            cwd=ROOT,
            env=env,
            text=True,
        )

    def wait_ready(self, timeout: float = 60) -> None:
        line = self._readline(timeout)
        if line.strip() != "ready":
            raise self._failed(f"did not become ready (said {line.strip()[:200]!r})")

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def result(self, timeout: float = 600) -> ChildResult:
        line = self._readline(timeout)
        try:
            self.proc.wait(timeout=30)
            data = json.loads(line)
        except (ValueError, subprocess.TimeoutExpired):
            raise self._failed(f"gave no result (said {line.strip()[:200]!r})") from None
        if self.proc.returncode != 0:
            raise self._failed(f"exited {self.proc.returncode}")
        self._cleanup()
        return ChildResult(data["started"], data["finished"], data["rss_mb"], data.get("detail", {}))

    def stop(self) -> None:
        self.proc.terminate()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._cleanup()

    def _readline(self, timeout: float) -> str:
        """The next line of the protocol ('ready' or a JSON object); a library's chatter is skipped."""
        assert self.proc.stdout is not None
        # A stuck child must fail the benchmark, not hang it.
        timer = _Watchdog(timeout, self.proc.kill)
        try:
            while line := self.proc.stdout.readline():
                if line.strip() == "ready" or line.startswith("{"):
                    return line
            return ""
        finally:
            timer.cancel()

    def _failed(self, what: str) -> EvqError:
        self.kill()
        tail = Path(self.log.name).read_text(errors="replace")[-2000:]
        return EvqError(f"benchmark worker process {what}", context={"log_tail": tail})

    def _cleanup(self) -> None:
        self.log.close()
        Path(self.log.name).unlink(missing_ok=True)


class _Watchdog:
    def __init__(self, seconds: float, action: Callable[[], None]):
        import threading

        self._timer = threading.Timer(seconds, action)
        self._timer.daemon = True
        self._timer.start()

    def cancel(self) -> None:
        self._timer.cancel()


def run_children(specs: Sequence[dict[str, Any]]) -> list[ChildResult]:
    """Start every child, wait until all are ready, start them together, collect."""
    children = [Child(spec) for spec in specs]
    try:
        for child in children:
            child.wait_ready()
        for child in children:
            child.go()
        return [child.result() for child in children]
    finally:
        for child in children:
            child.kill()


def _span(results: Sequence[ChildResult]) -> float:
    return max(r.finished for r in results) - min(r.started for r in results)


def evq_worker_spec(
    url: str,
    *,
    concurrency: int,
    batch_size: int,
    delay: float = 0.0,
    listen: str = "off",
    poll_interval: float = 1.0,
    drain: bool = True,
) -> dict[str, Any]:
    return {
        "kind": "evq",
        "url": url,
        "drain": drain,
        "settings": {
            "adapter": "null",
            "null_delay": delay,
            "concurrency": concurrency,
            "batch_size": batch_size,
            "listen": listen,
            "poll_interval": poll_interval,
            "log_format": "json",
        },
    }


# -- the modes --------------------------------------------------------------------------


class Bench:
    def __init__(self, config: BenchConfig, *, progress: Callable[[str], None] = lambda _: None):
        self.config = config.validate()
        self.progress = progress
        self.db = Databases(config.server_url)
        self.prefill = Prefill()
        self.figures: list[Figure] = []
        self.notes: list[str] = []
        self.peer_driver: str | None = None

    def run(self) -> dict[str, Any]:
        load_before = os.getloadavg()
        started = time.perf_counter()
        try:
            self.db.migrated_template()
            self.peer_driver = self._peer_driver()
            for mode in MODES:
                if mode in self.config.modes:
                    self.progress(f"{mode}...")
                    getattr(self, f"mode_{mode}")()
        finally:
            self.db.drop_all()
        self._ratios()
        return {
            "revision": git_revision(),
            "config": {k: v for k, v in asdict(self.config).items() if k != "server_url"},
            "machine": {
                "cpus": os.cpu_count(),
                "load_before": [round(x, 2) for x in load_before],
                "load_after": [round(x, 2) for x in os.getloadavg()],
                "postgres": self._server_version(),
                "peer": self.peer_driver and f"pgqueuer {_pgqueuer_version()} ({self.peer_driver})",
            },
            "seconds": round(time.perf_counter() - started, 1),
            "results": [f.to_dict() for f in self.figures],
            "targets": targets(self.figures),
            "notes": self.notes,
        }

    def _server_version(self) -> str:
        with psycopg.connect(self.config.server_url, connect_timeout=10) as conn:
            return str(conn.execute("SHOW server_version").fetchone()[0])

    def _peer_driver(self) -> str | None:
        if self.config.peer == "off" or not ({"peer", "enqueue"} & set(self.config.modes)):
            return None
        try:
            import pgqueuer  # noqa: F401
        except ImportError:
            if self.config.peer == "on":
                raise ConfigError("pgqueuer is not installed", hint="pip install 'evq[bench]'") from None
            self.notes.append("pgqueuer is not installed (pip install 'evq[bench]'): peer figures and ratios omitted")
            return None
        try:
            import asyncpg  # noqa: F401

            return "asyncpg"
        except ImportError:
            return "psycopg"

    def add(self, figure: Figure) -> Figure:
        self.figures.append(figure)
        return figure

    def repeat(self, once: Callable[[], tuple[float, float | None]]) -> tuple[list[float], float | None]:
        values, rss = [], None
        for _ in range(self.config.runs):
            value, run_rss = once()
            values.append(value)
            if run_rss is not None:
                rss = max(rss or 0.0, run_rss)
        return values, rss

    # drain --------------------------------------------------------------------------

    def _drain_once(self, processes: int, *, url: str | None = None, run_id: str = "bench") -> tuple[float, float]:
        c = self.config

        def measure(db_url: str) -> tuple[float, float]:
            write = self.prefill.enqueue(db_url, c.steps, run_id=run_id)
            self.batch_enqueue_seconds.append(write)
            results = run_children(
                [evq_worker_spec(db_url, concurrency=c.drain_concurrency, batch_size=c.batch_size)] * processes
            )
            self._check_drained(db_url, c.steps, run_id)
            return c.steps / _span(results), max(r.rss_mb for r in results)

        if url is not None:
            return measure(url)
        with self.db.fresh() as fresh:
            return measure(fresh)

    def _check_drained(self, url: str, expected: int, run_id: str = "bench") -> None:
        with psycopg.connect(url) as conn:
            done = conn.execute(
                "SELECT count(*) FROM email_steps WHERE status = 'accepted' AND run_id = %s", (run_id,)
            ).fetchone()[0]
        if done != expected:
            raise EvqError(f"benchmark drain left work behind: {done} of {expected} accepted")

    batch_enqueue_seconds: list[float]

    def mode_drain(self) -> None:
        self.batch_enqueue_seconds = []
        for processes in self.config.drain_processes:
            values, rss = self.repeat(functools.partial(self._drain_once, processes))
            self.add(
                Figure(
                    "drain",
                    f"evq drain, {processes} process{'es' if processes > 1 else ''}",
                    "steps/s",
                    values,
                    rss,
                    note=f"concurrency {self.config.drain_concurrency}, batch {self.config.batch_size}, null adapter",
                )
            )

    # latency-bound ------------------------------------------------------------------------

    def mode_latency(self) -> None:
        c = self.config
        for concurrency in c.latency_concurrency:
            n = concurrency * c.latency_waves

            # The loop's values are bound as defaults: a closure would read the variables, not this pass's values.
            def once(n: int = n, concurrency: int = concurrency) -> tuple[float, float]:
                with self.db.fresh() as url:
                    self.prefill.enqueue(url, n)
                    results = run_children(
                        [evq_worker_spec(url, concurrency=concurrency, batch_size=c.batch_size, delay=c.latency_delay)]
                    )
                    self._check_drained(url, n)
                    return n / _span(results), results[0].rss_mb

            values, rss = self.repeat(once)
            ideal = concurrency / c.latency_delay
            fig = self.add(
                Figure(
                    "latency",
                    f"evq latency-bound, concurrency {concurrency}",
                    "steps/s",
                    values,
                    rss,
                    note=f"null adapter answering after {c.latency_delay * 1000:g} ms, 1 process, {n} steps",
                )
            )
            fig.ratios["ideal"] = fig.median / ideal

    # enqueue ---------------------------------------------------------------------------------

    def mode_enqueue(self) -> None:
        from evq.adapters.postgres.enqueue import enqueue

        c = self.config
        requests = bench_requests(c.enqueue_single, run_id="single")
        policy = _policy()

        def single(autocommit: bool) -> tuple[float, None]:
            # Autocommit: the one statement is the transaction, as the store's pool does it
            # (and as pgqueuer's single enqueue is measured). Otherwise the caller's BEGIN
            # and COMMIT add two round trips around the same statement.
            with self.db.fresh() as url, psycopg.connect(url, autocommit=autocommit) as conn:
                started = time.perf_counter()
                for request in requests:
                    enqueue(conn, request, policy=policy)
                    if not autocommit:
                        conn.commit()
                return len(requests) / (time.perf_counter() - started), None

        # Each run measures evq and (when installed) pgqueuer back to back, so the ratio
        # compares the two under the same load, not minutes apart on a shared machine.
        own, in_caller, batch, peer = [], [], [], []
        writes = getattr(self, "batch_enqueue_seconds", [])
        for _ in range(c.runs):
            own.append(single(True)[0])
            if self.peer_driver is not None:
                peer.append(self._pgqueuer_enqueue_once())
            in_caller.append(single(False)[0])
            if not writes:
                batch.append(self._batch_once()[0])
        figures = (
            (
                self.add(
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
                self.add(
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
                self.add(
                    Figure(
                        "enqueue",
                        "evq batch enqueue (enqueue_many)",
                        "steps/s",
                        batch or [c.steps / s for s in writes],
                        note=f"{c.steps} validated requests in one transaction",
                    )
                ),
                "pgqueuer_batch",
                1,
            ),
        )
        if peer:
            self._add_pgqueuer_enqueue(peer, "measured alternately with evq's enqueue")
            # Paired runs: the median of each run's own ratio, so a burst of load that
            # hits one run of both does not skew the ratio of the medians.
            for fig, key, i in figures:
                if len(fig.values) == len(peer):
                    fig.ratios[key] = statistics.median(v / p[i] for v, p in zip(fig.values, peer, strict=True))
        validate = self.prefill.validate_seconds.get(c.steps)
        if validate:
            self.add(
                Figure(
                    "enqueue",
                    "evq request validation (before any write)",
                    "requests/s",
                    [c.steps / validate],
                    note="parse + address checks, in the caller's process",
                )
            )

    def _batch_once(self) -> tuple[float, None]:
        with self.db.fresh() as url:
            return self.config.steps / self.prefill.enqueue(url, self.config.steps), None

    # pickup latency ---------------------------------------------------------------------------

    def mode_pickup(self) -> None:
        c = self.config
        for listen, label in (("on", "LISTEN/NOTIFY"), ("off", f"polling every {c.poll_interval:g}s")):
            p50s, p99s, rss = [], [], None
            for _ in range(c.runs):
                p50, p99, run_rss = self._pickup_once(listen)
                p50s.append(p50)
                p99s.append(p99)
                rss = max(rss or 0, run_rss)
            self.add(
                Figure(
                    "pickup", f"evq pickup p50, {label}", "ms", p50s, rss, note="enqueue commit to claim, idle worker"
                )
            )
            self.add(
                Figure(
                    "pickup", f"evq pickup p99, {label}", "ms", p99s, rss, note="enqueue commit to claim, idle worker"
                )
            )

    def _pickup_once(self, listen: str) -> tuple[float, float, float]:
        from evq.adapters.postgres.enqueue import enqueue

        c = self.config
        samples = c.pickup_samples if listen == "on" else max(10, c.pickup_samples // 5)
        with self.db.fresh() as url:
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
                policy = _policy()
                committed: dict[int, float] = {}
                with psycopg.connect(url) as conn:
                    for request in bench_requests(samples, run_id="pickup"):
                        step = enqueue(conn, request, policy=policy)
                        conn.commit()
                        # From the commit, when the step exists for a worker: the row's
                        # created_at is its transaction's start, which would also count the
                        # enqueue itself. Same host, same clock as the server's now().
                        committed[step.id] = time.time()
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
        return _percentile(lags, 50), _percentile(lags, 99), result.rss_mb

    # scale -------------------------------------------------------------------------------------

    def mode_scale(self) -> None:
        c = self.config
        name = self.db.create(self.db.template)
        url = self.db.url(name)
        try:
            started = time.perf_counter()
            fill_terminal(url, c.scale_rows)
            self.notes.append(f"scale: {c.scale_rows:,} terminal rows made in {time.perf_counter() - started:.0f}s")
            values, rss = [], None
            for run in range(c.runs):
                # Each run's drained rows join the history: a run id of its own keeps the keys apart.
                value, run_rss = self._drain_once(1, url=url, run_id=f"scale{run}")
                values.append(value)
                rss = max(rss or 0, run_rss)
            drain = self.add(
                Figure("scale", f"evq drain, 1 process, {c.scale_rows:,} terminal rows present", "steps/s", values, rss)
            )
            empty = self._find("drain", "evq drain, 1 process")
            drain.ratios["empty_table"] = drain.median / empty.median if empty else None
            timings = time_collector(url, repeat=max(5, 3 * c.runs))
            self.add(
                Figure(
                    "scale",
                    "metrics collector query",
                    "ms",
                    timings,
                    note=f"QueueStatsReader (ops/app/metrics.py's query); {c.scale_rows:,} terminal rows",
                )
            )
        finally:
            self.db.drop(name)

    # ceiling --------------------------------------------------------------------------------------

    def mode_ceiling(self) -> None:
        c = self.config
        for per_row, label, n in (
            (False, "raw SQL ceiling: claim 100 SKIP LOCKED + one batched UPDATE", c.steps),
            (True, "raw SQL, claim 100 + one commit per row", max(1000, c.steps // 4)),
        ):

            def once(n: int = n, per_row: bool = per_row) -> tuple[float, None]:
                name = self.db.create()
                try:
                    return raw_sql_drain(self.db.url(name), n, per_row=per_row), None
                finally:
                    self.db.drop(name)

            values, _ = self.repeat(once)
            self.add(Figure("ceiling", label, "rows/s", values, note=f"{n} rows, one connection"))

    # peer -------------------------------------------------------------------------------------------

    def mode_peer(self) -> None:
        if self.peer_driver is None:
            return
        c = self.config
        configs = (
            ("pgqueuer drain, default (1 process, batch 10)", 1, 10, None),
            ("pgqueuer drain, best (2 processes, batch 50, task cap 100)", 2, 50, 100),
        )
        for label, processes, batch, cap in configs:

            def once(processes: int = processes, batch: int = batch, cap: int | None = cap) -> tuple[float, float]:
                name = self.db.create()
                url = self.db.url(name)
                try:
                    asyncio.run(pgqueuer_setup(url, self.peer_driver, c.steps))
                    spec = {
                        "kind": "pgqueuer",
                        "url": url,
                        "driver": self.peer_driver,
                        "batch_size": batch,
                        "max_concurrent_tasks": cap,
                        "expected": c.steps,
                    }
                    results = run_children([spec] * processes)
                    if sum(r.detail["jobs"] for r in results) != c.steps:
                        raise EvqError("pgqueuer drain did not run every job")
                    return c.steps / _span(results), max(r.rss_mb for r in results)
                finally:
                    self.db.drop(name)

            values, rss = self.repeat(once)
            self.add(Figure("peer", label, "jobs/s", values, rss, note=f"{c.steps} no-op jobs, {self.peer_driver}"))
        if self._find("peer", "pgqueuer single") is None:  # the enqueue mode measures it when it runs
            self._add_pgqueuer_enqueue([self._pgqueuer_enqueue_once() for _ in range(c.runs)], None)

    def _pgqueuer_enqueue_once(self) -> tuple[float, float]:
        """pgqueuer's single and batch enqueue rates, in a fresh database."""
        assert self.peer_driver is not None
        c = self.config
        name = self.db.create()
        try:
            return asyncio.run(pgqueuer_enqueue(self.db.url(name), self.peer_driver, c.enqueue_single, c.steps))
        finally:
            self.db.drop(name)

    def _add_pgqueuer_enqueue(self, runs: list[tuple[float, float]], how: str | None) -> None:
        c, when = self.config, f", {how}" if how else ""
        self.add(
            Figure(
                "peer", "pgqueuer single enqueue", "jobs/s", [s for s, _ in runs], note=f"{c.enqueue_single} jobs{when}"
            )
        )
        self.add(
            Figure(
                "peer",
                "pgqueuer batch enqueue",
                "jobs/s",
                [b for _, b in runs],
                note=f"{c.steps} jobs in one call{when}",
            )
        )

    # ratios ------------------------------------------------------------------------------------------

    def _find(self, mode: str, prefix: str) -> Figure | None:
        return next((f for f in self.figures if f.mode == mode and f.name.startswith(prefix)), None)

    def _ratios(self) -> None:
        ceiling = self._find("ceiling", "raw SQL ceiling")
        default = self._find("peer", "pgqueuer drain, default")
        best = self._find("peer", "pgqueuer drain, best")
        p_single = self._find("peer", "pgqueuer single")
        p_batch = self._find("peer", "pgqueuer batch")
        for f in self.figures:
            if f.mode in ("drain", "scale") and f.unit == "steps/s":
                for key, ref in (("ceiling", ceiling), ("pgqueuer_default", default), ("pgqueuer_best", best)):
                    f.ratios[key] = f.median / ref.median if ref else None
            elif f.name.startswith("evq single enqueue"):
                f.ratios.setdefault("pgqueuer_single", f.median / p_single.median if p_single else None)
            elif f.name.startswith("evq batch enqueue"):
                f.ratios.setdefault("pgqueuer_batch", f.median / p_batch.median if p_batch else None)
            elif f.mode == "peer" and f.unit == "jobs/s" and "drain" in f.name and ceiling:
                f.ratios["ceiling"] = f.median / ceiling.median


def _percentile(values: Sequence[float], pct: float) -> float:
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(pct / 100 * (len(ordered) - 1))))
    return float(ordered[k])


def time_collector(url: str, *, repeat: int) -> list[float]:
    """Milliseconds per read of the metrics collector's query (QueueStatsReader, as /metrics runs it)."""
    from evq.adapters.postgres.queue_stats import QueueStatsReader
    from evq.worker.metrics import UNKNOWN_AGE_BUCKETS

    reader = QueueStatsReader(url)
    try:
        reader.read(UNKNOWN_AGE_BUCKETS)  # connect and warm the cache, as a scrape every 15 s would
        timings = []
        for _ in range(repeat):
            started = time.perf_counter()
            reader.read(UNKNOWN_AGE_BUCKETS)
            timings.append((time.perf_counter() - started) * 1000)
        return timings
    finally:
        reader.close()


def fill_terminal(url: str, rows: int) -> None:
    """History: `rows` accepted steps, each with its decision and its two evidence rows,
    as the worker leaves them; then VACUUM ANALYZE, as autovacuum would."""
    chunk = 250_000
    with psycopg.connect(url, autocommit=True) as conn:
        for start in range(1, rows + 1, chunk):
            end = min(rows, start + chunk - 1)
            params = {"a": start, "b": end}
            conn.execute(
                "INSERT INTO decisions (id, run_id, step_id, intent, model, tool, created_at)"
                " SELECT g, 'hist-' || (g / 1000), 's' || g, 'history', 'm', 'send_email', now() - interval '30 days'"
                " FROM generate_series(%(a)s::bigint, %(b)s::bigint) g",
                params,
            )
            conn.execute(
                "INSERT INTO email_steps (run_id, step_id, decision_id, idempotency_key, message_id, provider,"
                " payload, payload_sha256, status, reason, attempts, first_attempt_at, closed_at,"
                " provider_message_id, created_at, updated_at)"
                " SELECT 'hist-' || (g / 1000), 's' || g, g, 'hist:' || g, '<hist.' || g || '@example.org>', 'null',"
                " jsonb_build_object('to', jsonb_build_array(jsonb_build_object('email', 'u' || g || '@example.com')),"
                "   'subject', 'history ' || g, 'text', 'old message'), repeat('0', 64), 'accepted',"
                " 'provider_accepted', 1, now() - interval '30 days', now() - interval '30 days', 'null-' || g,"
                " now() - interval '30 days', now() - interval '30 days'"
                " FROM generate_series(%(a)s::bigint, %(b)s::bigint) g",
                params,
            )
            conn.execute(
                "INSERT INTO evidence (step_id, run_id, attempt, kind, actor, from_status, to_status, outcome,"
                " reason, lease_token, created_at)"
                " SELECT s.id, s.run_id, 1, k.kind, 'history', k.from_status, k.to_status, k.outcome, k.reason,"
                " gen_random_uuid(), s.created_at"
                " FROM email_steps s CROSS JOIN (VALUES ('attempt_started', 'pending', 'in_flight', NULL, NULL),"
                "   ('provider_response', 'in_flight', 'accepted', 'accepted', 'provider_accepted'))"
                "   AS k(kind, from_status, to_status, outcome, reason)"
                " WHERE s.decision_id BETWEEN %(a)s AND %(b)s",
                params,
            )
        conn.execute("SELECT setval(pg_get_serial_sequence('decisions', 'id'), %s)", (rows,))
        conn.execute("VACUUM ANALYZE")


RAW_SETUP = """
CREATE TABLE bench_jobs (
    id bigserial PRIMARY KEY,
    status text NOT NULL DEFAULT 'queued',
    payload bytea,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz
);
CREATE INDEX bench_jobs_queued ON bench_jobs (id) WHERE status = 'queued';
"""
RAW_CLAIM = """
WITH picked AS (
    SELECT id FROM bench_jobs WHERE status = 'queued' ORDER BY id LIMIT 100 FOR UPDATE SKIP LOCKED
)
UPDATE bench_jobs j SET status = 'picked', updated_at = now() FROM picked WHERE j.id = picked.id
RETURNING j.id, j.payload
"""


def raw_sql_drain(url: str, n: int, *, per_row: bool) -> float:
    """The ceiling: what one connection does with the least a queue must do."""
    with psycopg.connect(url, autocommit=True) as conn:
        for statement in RAW_SETUP.split(";"):
            if statement.strip():
                conn.execute(statement)
        conn.execute("INSERT INTO bench_jobs (payload) SELECT ''::bytea FROM generate_series(1, %s)", (n,))
        conn.execute("ANALYZE bench_jobs")
        started = time.perf_counter()
        done = 0
        while True:
            ids = [r[0] for r in conn.execute(RAW_CLAIM).fetchall()]
            if not ids:
                break
            if per_row:
                for i in ids:
                    conn.execute("UPDATE bench_jobs SET status = 'done', updated_at = now() WHERE id = %s", (i,))
            else:
                conn.execute("UPDATE bench_jobs SET status = 'done', updated_at = now() WHERE id = ANY(%s)", (ids,))
            done += len(ids)
        elapsed = time.perf_counter() - started
    if done != n:
        raise EvqError(f"raw SQL drain did {done} of {n}")
    return n / elapsed


# -- pgqueuer (optional) ------------------------------------------------------------------------


async def _pgq_connect(url: str, driver: str) -> Any:
    if driver == "asyncpg":
        import asyncpg
        from pgqueuer import AsyncpgDriver

        info = psycopg.conninfo.conninfo_to_dict(url)
        keys = {"host": "host", "port": "port", "user": "user", "password": "password", "dbname": "database"}
        return AsyncpgDriver(await asyncpg.connect(**{keys[k]: v for k, v in info.items() if k in keys}))
    from pgqueuer import PsycopgDriver

    return PsycopgDriver(await psycopg.AsyncConnection.connect(url, autocommit=True))


async def pgqueuer_setup(url: str, driver: str, n: int) -> None:
    from pgqueuer import Queries

    queries = Queries(await _pgq_connect(url, driver))
    await queries.install()
    await queries.enqueue(["bench"] * n, [b""] * n, [0] * n)


async def pgqueuer_enqueue(url: str, driver: str, single: int, batch: int) -> tuple[float, float]:
    from pgqueuer import Queries

    queries = Queries(await _pgq_connect(url, driver))
    await queries.install()
    started = time.perf_counter()
    for _ in range(single):
        await queries.enqueue("bench", b"", 0)
    single_rate = single / (time.perf_counter() - started)
    started = time.perf_counter()
    await queries.enqueue(["bench"] * batch, [b""] * batch, [0] * batch)
    return single_rate, batch / (time.perf_counter() - started)


def _pgqueuer_version() -> str:
    try:
        from importlib.metadata import version

        return version("pgqueuer")
    except Exception:
        return "?"


# -- targets (the issue's, on this machine) ----------------------------------------------------------


def targets(figures: Sequence[Figure]) -> list[dict[str, Any]]:
    def find(prefix: str) -> Figure | None:
        return next((f for f in figures if f.name.startswith(prefix)), None)

    out: list[dict[str, Any]] = []

    def check(target: str, value: float | None, threshold: float, *, below: bool = False) -> None:
        met = None if value is None else (value < threshold if below else value >= threshold)
        out.append(
            {"target": target, "value": None if value is None else round(value, 3), "threshold": threshold, "met": met}
        )

    d2, d1 = find("evq drain, 2 processes"), find("evq drain, 1 process")
    check("drain 2 processes / pgqueuer best >= 1", d2 and d2.ratios.get("pgqueuer_best"), 1.0)
    check("drain 2 processes / raw ceiling >= 1/3", d2 and d2.ratios.get("ceiling"), 1 / 3)
    check("drain 1 process / pgqueuer default >= 2", d1 and d1.ratios.get("pgqueuer_default"), 2.0)
    lat = max((f for f in figures if f.mode == "latency"), key=lambda f: f.name.endswith("500"), default=None)
    if lat is not None:
        check(f"{lat.name}: share of ideal >= 0.8", lat.ratios.get("ideal"), 0.8)
        check(f"{lat.name}: worker RSS < 150 MB", lat.rss_mb, 150.0, below=True)
    single, batch = find("evq single enqueue"), find("evq batch enqueue")
    check("single enqueue / pgqueuer single >= 1", single and single.ratios.get("pgqueuer_single"), 1.0)
    check("batch enqueue >= 40,000 steps/s", batch and batch.median, 40_000.0)
    for what, limit in (("p50", 5.0), ("p99", 50.0)):
        f = find(f"evq pickup {what}, LISTEN")
        check(f"pickup {what} with LISTEN/NOTIFY < {limit:g} ms", f and f.median, limit, below=True)
    poll = find("evq pickup p99, polling")
    if poll is not None:
        interval_ms = float(poll.name.rsplit("every ", 1)[1].rstrip("s")) * 1000
        check("pickup p99 polling only < poll interval (ms)", poll.median, interval_ms, below=True)
    scale, collector = find("evq drain, 1 process, "), find("metrics collector")
    check("scale drain / empty-table drain >= 0.8", scale and scale.ratios.get("empty_table"), 0.8)
    check("collector query < 50 ms", collector and collector.median, 50.0, below=True)
    return out


# -- the human table --------------------------------------------------------------------------------


def human(report: dict[str, Any]) -> str:
    lines = [
        f"evq bench  revision {report['revision']}  {report['seconds']}s  "
        f"load {report['machine']['load_before']} -> {report['machine']['load_after']}  "
        f"PostgreSQL {report['machine']['postgres']}  peer: {report['machine']['peer'] or 'none'}",
        "",
    ]
    rows = [("figure", "median", "min-max", "unit", "ratios", "peak RSS")]
    for r in report["results"]:
        ratios = "  ".join(f"{k}={v:.2f}" for k, v in r["ratios"].items() if v is not None)
        rss = "-" if r["rss_mb"] is None else f"{r['rss_mb']:.0f} MB"
        rows.append((r["name"], _num(r["median"]), f"{_num(r['min'])}-{_num(r['max'])}", r["unit"], ratios, rss))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for i, row in enumerate(rows):
        lines.append(
            "  ".join(
                cell.ljust(w) if k in (0, 3, 4) else cell.rjust(w)
                for k, (cell, w) in enumerate(zip(row, widths, strict=True))
            ).rstrip()
        )
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    lines += ["", "targets:"]
    for t in report["targets"]:
        mark = {True: "met    ", False: "NOT met", None: "n/a    "}[t["met"]]
        value = "-" if t["value"] is None else _num(t["value"])
        lines.append(f"  {mark}  {t['target']}  (value {value})")
    for note in report["notes"]:
        lines.append(f"note: {note}")
    return "\n".join(lines)


def _num(value: float) -> str:
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.2f}"


def git_revision() -> str:
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return rev + ("-dirty" if dirty else "")


# -- the child side ---------------------------------------------------------------------------------


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


async def _wait_go() -> float:
    print("ready", flush=True)
    line = await asyncio.to_thread(sys.stdin.readline)
    if line.strip() != "go":
        raise SystemExit(2)
    return time.time()


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

    pgq = PgQueuer(await _pgq_connect(spec["url"], spec["driver"]))
    jobs = 0

    @pgq.entrypoint("bench")
    async def noop(job: Any) -> None:
        nonlocal jobs
        jobs += 1

    started = await _wait_go()
    await pgq.run(
        batch_size=spec["batch_size"], mode=QueueExecutionMode.drain, max_concurrent_tasks=spec["max_concurrent_tasks"]
    )
    return {"started": started, "finished": time.time(), "rss_mb": _rss_mb(), "detail": {"jobs": jobs}}


def child_main(argv: Sequence[str]) -> None:
    spec = json.loads(argv[0])
    run = _child_evq if spec["kind"] == "evq" else _child_pgqueuer
    result = asyncio.run(run(spec))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    child_main(sys.argv[1:])
