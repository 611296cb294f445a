"""Small builders shared by the tests."""

from __future__ import annotations

import contextlib
import itertools
import os
import resource
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

import psycopg
from psycopg.rows import dict_row

from evq.worker.request import Policy, ValidRequest, parse

_seq = itertools.count(1)
POLICY = Policy(providers=("smtp", "http", "null"), default_provider="smtp")


def _wire_keys() -> Any:
    from evq.adapters.http import WireKeys

    return WireKeys.from_pepper(b"an installation's pepper, tests".ljust(32, b"."), keyed_from=1)


# The HTTP adapter's idempotency keys in tests that build it by hand (evq's worker derives them
# from its database's pepper: ops/wiring.py); tests/integration/test_wire_keys.py tests those.
WIRE_KEYS = _wire_keys()


def request(**overrides: Any) -> dict[str, Any]:
    n = next(_seq)
    base: dict[str, Any] = {
        "run_id": "run-1",
        "step_id": f"step-{n}",
        "to": [f"user{n}@example.com"],
        "from": "agent@example.org",
        "subject": f"Subject {n}",
        "text": f"Body {n}",
        "intent": "tell the user",
        "decision": {"model": "m-1", "tool": "send_email", "instruction_version": "v1", "rationale": "asked"},
    }
    base.update(overrides)
    return {k: v for k, v in base.items() if v is not None}


def valid(**overrides: Any) -> ValidRequest:
    return parse(request(**overrides), POLICY)


def rows(url: str, sql: str, params: Any = None) -> list[dict[str, Any]]:
    with psycopg.connect(url, row_factory=dict_row) as conn:
        return conn.execute(sql, params).fetchall()


def step_row(url: str, step_id: int) -> dict[str, Any]:
    return rows(url, "SELECT * FROM steps_now WHERE id = %s", (step_id,))[0]


QUEUE_COLUMNS = frozenset(
    {"attempts", "first_attempt_at", "dedupe_until", "maybe_delivered", "next_attempt_at", "priority", "updated_at"}
)
LEASE_COLUMNS = frozenset({"lease_owner", "lease_token", "lease_expires_at"})


def put_in_state(url: str, step_id: int, status: str, assignments: str = "") -> None:
    """Raw SQL puts one step straight into a state as the tables hold it (the tests' privilege; no
    runtime path does this): in flight is its queue row's lease (email_steps keeps the state it was
    claimed from, pending); pending and retryable keep the queue row, which takes the assignments
    to its columns too; every other state has no queue row. ``assignments``: a SET clause."""
    pairs, depth, start = [], 0, 0
    for i, ch in enumerate(assignments):
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            pairs.append(assignments[start:i].strip())
            start = i + 1
    pairs = [p for p in [*pairs, assignments[start:].strip()] if p]
    named = {p.split("=", 1)[0].strip(): p for p in pairs}
    queue = [p for c, p in named.items() if c in QUEUE_COLUMNS | LEASE_COLUMNS]
    steps = [p for c, p in named.items() if c not in LEASE_COLUMNS]
    if status == "in_flight":
        rows(url, f"UPDATE step_queue SET {', '.join(queue)} WHERE id = %s RETURNING id", (step_id,))
        return
    rows(
        url,
        f"UPDATE email_steps SET {', '.join(['status = %s', *steps])} WHERE id = %s RETURNING id",
        (status, step_id),
    )
    if status in ("pending", "retryable"):
        if queue:
            rows(url, f"UPDATE step_queue SET {', '.join(queue)} WHERE id = %s RETURNING id", (step_id,))
    else:
        rows(url, "DELETE FROM step_queue WHERE id = %s RETURNING id", (step_id,))


def evidence_kinds(url: str, step_id: int) -> list[str]:
    return [r["kind"] for r in rows(url, "SELECT kind FROM evidence WHERE step_id = %s ORDER BY id", (step_id,))]


class ScriptedProvider:
    """A provider for worker tests: records every call; answers from a script per step.

    ``script`` maps a step_id (the agent's) to a list of outcomes, one per attempt;
    anything unscripted is accepted. ``gate``, when set, holds every send until it opens.
    """

    name = "smtp"
    dedupe_window = None

    def __init__(self, script=None, gate=None, delay: float = 0.0):
        import collections

        self.script = {k: list(v) for k, v in (script or {}).items()}
        self.gate = gate
        self.delay = delay
        self.calls: list[Any] = []
        self.sent = collections.Counter()
        self.in_send = 0

    async def send(self, request):
        import asyncio

        from evq.worker.outcomes import Accepted

        self.calls.append(request)
        self.in_send += 1
        try:
            if self.gate is not None:
                await self.gate.wait()
            if self.delay:
                await asyncio.sleep(self.delay)
            plan = self.script.get(request.run_id + "/" + _step_of(request), [])
            outcome = plan.pop(0) if plan else Accepted(f"pm-{request.step_id}-{request.attempt}")
            if outcome.kind == "accepted":
                self.sent[request.message_id] += 1
            return outcome
        finally:
            self.in_send -= 1

    async def close(self) -> None:
        return None


def _step_of(request) -> str:
    return request.idempotency_key.split(":", 1)[1]


def execute(url: str, sql: str, params: Any = None) -> None:
    with psycopg.connect(url) as conn:
        conn.execute(sql, params)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def refusing_port() -> Iterator[int]:
    """A loopback port that refuses every connection for as long as the block runs: bound and
    never listening, so no other test process can take it meanwhile (a port a test merely closed
    can be another xdist worker's server a moment later)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


def require_binary(name: str, package: str = "prometheus") -> str:
    """The path of a tool the test needs: missing fails under CI (CI=true), skips elsewhere."""
    import os
    import shutil

    import pytest

    path = shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin")
    if path:
        return path
    if os.environ.get("CI") == "true":
        pytest.fail(f"{name} is not installed: .ci/run installs Debian's {package} package", pytrace=False)
    pytest.skip(f"{name} is not installed (apt-get install {package}); under CI this fails instead")


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """GET a /metrics page over HTTP: {(sample name, sorted labels): value}."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def sample(page: dict, name: str, **labels: str) -> float | None:
    return page.get((name, tuple(sorted(labels.items()))))


def wait_until(predicate, timeout: float = 20, what: str = "condition", interval: float = 0.05):
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout`` seconds."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


async def unknown_steps(store: Any, n: int = 1, *, now: Any = None, **overrides: Any) -> list[Any]:
    """``n`` steps taken to ``unknown`` the way the worker does it: enqueue, claim, an ambiguous answer."""
    from evq.worker.backoff import Backoff
    from evq.worker.outcomes import Unknown
    from evq.worker.transitions import decide

    made = [await store.enqueue(valid(**overrides), now=now) for _ in range(n)]
    claimed = await store.claim(
        owner="w-test",
        providers=[overrides.get("provider", "smtp")],
        limit=n,
        lease_seconds=60,
        dedupe_windows={},
        now=now,
    )
    settled = [
        decide(
            c,
            Unknown("connection lost after the final dot"),
            default_max_attempts=3,
            backoff=Backoff(1, 1),
            dedupe_window_open=False,
        )
        for c in claimed
    ]
    await store.record(settled, actor="w-test", now=now)
    return made


async def accepted_step(store: Any, req: dict[str, Any], *, now: Any) -> Any:
    """``req`` enqueued, sent and accepted at ``now`` (the worker's claim and recorded answer); its EnqueueResult."""
    from evq.worker.backoff import Backoff
    from evq.worker.outcomes import Accepted
    from evq.worker.transitions import decide

    made = await store.enqueue(valid(**req), now=now)
    [claimed] = await store.claim(
        owner="w-test", providers=[made.provider or "smtp"], limit=1, lease_seconds=60, dedupe_windows={}, now=now
    )
    assert claimed.id == made.id
    answer = decide(claimed, Accepted("pm"), default_max_attempts=3, backoff=Backoff(1, 1), dedupe_window_open=False)
    await store.record([answer], actor="w-test", now=now)
    return made


def prune_closed(url: str) -> int:
    """evq_prune_batch with the database's now() as the cutoff, committed: the steps it removed."""
    with psycopg.connect(url) as conn:
        [(n,)] = conn.execute("SELECT pruned_steps FROM evq_prune_batch(now(), 1000, 'test', gen_random_uuid(), 1)")
        return int(n)


def wait_for_lock_waiters(url: str, n: int, timeout: float = 20) -> None:
    """Block until ``n`` evq sessions wait on a row or advisory lock (a deterministic point in a race)."""
    query = (
        "SELECT count(*) AS n FROM pg_stat_activity WHERE datname = current_database() "
        "AND wait_event_type = 'Lock' AND application_name = 'evq'"
    )
    wait_until(
        lambda: rows(url, query)[0]["n"] >= n,
        timeout=timeout,
        interval=0.02,
        what=f"{n} evq session(s) waiting on a lock",
    )


def with_store(url: str, use: Any) -> Any:
    """Run ``await use(store)`` on a store of its own, from synchronous code (acceptance tests)."""
    import asyncio

    from evq.adapters.postgres.store import PostgresStore

    async def go() -> Any:
        store = await PostgresStore.open(url, max_size=1)
        try:
            return await use(store)
        finally:
            await store.close()

    return asyncio.run(go())


def _default_signals() -> None:
    # A suite launched in the background (`pytest &`, some CI runners) starts with SIGINT ignored,
    # and an ignored signal stays ignored across exec: without this a child could never be stopped
    # by the SIGINT a test sends it (nor would it test its own Ctrl-C handling).
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def spawn(argv: list[str], *, preexec_fn: Any = None, **popen: Any) -> subprocess.Popen:
    """``subprocess.Popen`` for a child a test will stop: SIGINT and SIGTERM are back at their
    defaults in the child whatever the suite inherited. Stop it with :func:`stop`."""

    def prepare() -> None:
        _default_signals()
        if preexec_fn is not None:
            preexec_fn()

    return subprocess.Popen(argv, preexec_fn=prepare, **popen)


def pause(pid: int, timeout: float = 20) -> None:
    """SIGSTOP ``pid`` and return once every one of its threads is stopped.

    kill() returns before a multi-threaded process has stopped: the kernel hands the stop
    to one thread, which stops the others when it next runs. On a loaded machine a thread
    woken by data arriving on its socket can run on for milliseconds first (and finish an
    SMTP conversation a test meant to freeze), so a test that pauses a worker and then lets
    its peer answer must wait for the stop to be complete.
    """
    os.kill(pid, signal.SIGSTOP)

    def states() -> list[str]:
        out = []
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(FileNotFoundError, ProcessLookupError):
                with open(f"/proc/{pid}/task/{task}/stat") as f:
                    # The state follows the parenthesised name, which may itself hold ") ".
                    out.append(f.read().rsplit(")", 1)[1].split()[0])
        return out

    wait_until(lambda: all(s in ("T", "t") for s in states()), timeout=timeout, what=f"process {pid} to stop")


def stop(proc: subprocess.Popen, sig: int = signal.SIGTERM, *, grace: float = 15) -> int:
    """Stop ``proc`` in a way that always works: ``sig`` (if it still runs), then SIGKILL after
    ``grace`` seconds; then close every pipe, so no unread pipe outlives the test (under
    ``filterwarnings = error`` a leaked pipe fails whichever test the garbage collector runs in).
    Returns the exit status (negative: killed by that signal)."""
    try:
        if proc.poll() is None:
            proc.send_signal(sig)
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    finally:
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
    return proc.returncode


class ServeProcess:
    """An `evq serve` process started by :func:`serve_process`: its URL and what it printed
    (stderr and stdout, in one file): ``log()`` while it runs, ``stderr`` once the block has ended."""

    def __init__(self, proc: subprocess.Popen, url: str, log_path: str):
        self.proc = proc
        self.url = url
        self.stderr = ""
        self._log_path = log_path

    def log(self) -> str:
        with open(self._log_path, encoding="utf-8", errors="replace") as f:
            return f.read()


@contextlib.contextmanager
def serve_process(db_url: str, *, nofile: int | None = None, timeout: float = 30, **env: str) -> Iterator[ServeProcess]:
    """`evq serve` in a process of its own (its own event loop and GIL) on a free loopback
    port, for as long as the block runs; optionally with a lower open-file limit. What it
    prints goes to a file, not a pipe: a chatty log must never fill a pipe nobody reads and stall
    the server mid-test."""
    import httpx

    port = free_port()
    environ = {**os.environ, "EVQ_DATABASE_URL": db_url, "EVQ_LOG_FORMAT": "json", **env}
    if "EVQ_API_KEY" not in env:
        environ.pop("EVQ_API_KEY", None)

    def limit() -> None:
        if nofile is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    fd, log_path = tempfile.mkstemp(prefix="evq-serve-", suffix=".log")
    try:
        with os.fdopen(fd, "w") as stderr:
            proc = spawn(
                [sys.executable, "-m", "tests.child", "serve", "--port", str(port)],
                env=environ,
                stdout=stderr,
                stderr=subprocess.STDOUT,
                preexec_fn=limit,
            )
        served = ServeProcess(proc, f"http://127.0.0.1:{port}", log_path)

        def up() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"evq serve exited {proc.returncode}: {served.log()[-2000:]}")
            try:
                return httpx.get(served.url + "/healthz", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        try:
            wait_until(up, timeout=timeout, what="evq serve")
            yield served
        finally:
            stop(proc)
            served.stderr = served.log()
    finally:
        os.unlink(log_path)


HOLD_RULES = {"rules": [{"rule": "requested", "detail": "the request asked for approval"}]}


async def held_steps(
    store_or_url: Any,
    n: int = 1,
    *,
    now: Any = None,
    expires_at: Any = None,
    hold: Any = None,
    **overrides: Any,
) -> list[Any]:
    """``n`` steps held for approval: enqueued, then (as the owner role, which the step guard lets
    through) made ``held`` as the enqueue of an approval policy writes them, with ``held`` evidence.
    Until the enqueue itself holds (issue 17, helper A), tests make held rows with this.
    ``store_or_url``: a PostgresStore or a database URL."""
    import json
    from datetime import UTC, datetime

    hold = HOLD_RULES if hold is None else hold
    if isinstance(store_or_url, str):
        return with_store(  # type: ignore[no-any-return]
            store_or_url,
            lambda s: held_steps(s, n, now=now, expires_at=expires_at, hold=hold, **overrides),
        )
    store = store_or_url
    made = [await store.enqueue(valid(**overrides), now=now) for _ in range(n)]
    at = now or datetime.now(UTC)
    async with store.pool.connection() as conn:
        for m in made:
            await conn.execute(
                "UPDATE email_steps SET status = 'held', reason = 'approval_required', held_since = %s, "
                "hold_expires_at = %s, hold = %s::jsonb WHERE id = %s",
                (at, expires_at, json.dumps(hold), m.id),
            )
            # A held step is owed no send: it has no queue row until it is approved.
            await conn.execute("DELETE FROM step_queue WHERE id = %s", (m.id,))
            await conn.execute(
                "INSERT INTO evidence (step_id, run_id, attempt, kind, actor, to_status, reason, detail, created_at) "
                "VALUES (%s, %s, 0, 'held', 'enqueue', 'held', 'approval_required', %s::jsonb, %s)",
                (m.id, m.run_id, json.dumps(hold), at),
            )
    return made
