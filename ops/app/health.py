"""The health gate: the first call an agent makes before it writes (`evq admin health`,
``GET /v1/health``, the MCP tool ``evq_admin_health``), one function every interface calls.

``{"healthy": bool, "checks": [{"name", "ok", "detail"}]}``, the checks in this order:

- ``database``: PostgreSQL answers, and evq's transactions there start READ COMMITTED
  (adapters/postgres/isolation.py);
- ``schema``: it is at this evq's head revision;
- ``workers``: a worker beat within :data:`SEEN_WITHIN_SECONDS` (each running worker
  upserts its ``worker_heartbeats`` row every :data:`HEARTBEAT_SECONDS`, ops/wiring.py);
- ``collector``: the /metrics queue gauges' query answers (within its own timeout);
- ``providers``: no provider's circuit is open or half open (worker/circuit.py).

A check that cannot run because an earlier one failed says so and fails too. Healthy:
status ``success``, exit 0. Unhealthy: status ``partial_failure`` (some checks failed)
with the same data, and the exit code of the first failed check: 9 (E_DB_UNAVAILABLE)
for the database, 5 (E_SCHEMA_MISMATCH) for the schema, 6 (E_PARTIAL_FAILURE) for the
rest. Over HTTP: 200 or 503.

It reads through the port :class:`~evq.worker.ports.HealthReader` (adapters/postgres/health.py: short connections
of its own, so it answers when no store could open).
"""

from __future__ import annotations

from typing import Any

from evq.ops.app.contract import EXIT_CODES
from evq.ops.app.service import Caller, Reply
from evq.worker.errors import DatabaseUnavailable, EvqError, SchemaMismatch
from evq.worker.keys import Permission
from evq.worker.ports import HealthReader, KeyLookup

HEARTBEAT_SECONDS = 5.0
# Several missed beats before a worker counts as gone: a busy database may delay a beat or two.
SEEN_WITHIN_SECONDS = 30.0
CHECKS = ("database", "schema", "workers", "collector", "providers")


def _check(name: str, ok: bool, detail: str) -> dict[str, Any]:
    return {"name": name, "ok": ok, "detail": detail}


async def check_health(
    reader: HealthReader, caller: Caller, lookup: KeyLookup | None = None, *, database: str | None = None
) -> Reply:
    """Every check, in order. ``caller`` needs a key of any role, checked first (the command
    line is a trusted reader and needs none). While the database cannot verify a key, the
    answer is only that: the database (or its schema) is not usable, nothing else.
    ``database`` (host:port/name, no password; the command line's) is named in the database
    check's detail, so whoever reads it knows which database answered."""
    where = f" ({database})" if database else ""
    if not caller.trusted_reader:
        if lookup is None:
            raise ValueError("a caller with a key needs a key lookup")
        try:
            await caller.identify(lookup, Permission.READ)
        except DatabaseUnavailable:
            return _reply(
                [_check("database", False, "the database does not answer" + where)], "the database does not answer"
            )
        except SchemaMismatch:
            checks = [_check("database", True, "reachable" + where), _check("schema", False, "not this evq's schema")]
            return _reply(checks, "the schema is not this evq's")
    checks: list[dict[str, Any]] = []
    try:
        current, expected = await reader.schema_revision()
        refused = await reader.isolation()
    except DatabaseUnavailable as exc:
        checks.append(_check("database", False, exc.message + where))
        return _reply(checks, "the database does not answer")
    except SchemaMismatch as exc:
        checks += [_check("database", True, "reachable" + where), _check("schema", False, exc.message)]
        return _reply(checks, "the schema is not this evq's")
    if refused is not None:
        # Every worker and `evq serve` refuses to start on it: say so, and how to fix it.
        checks.append(_check("database", False, f"reachable{where}, but {refused.message}: {refused.hint}"))
        return _reply(checks, "evq does not run on this database as it is configured")
    checks.append(_check("database", True, "reachable" + where))
    if current != expected:
        state = f"is at revision {current}" if current else "has no evq schema"
        checks.append(_check("schema", False, f"the database {state}; this evq needs {expected}: run `evq db upgrade`"))
        return _reply(checks, "the schema is not this evq's")
    checks.append(_check("schema", True, f"at revision {current}"))
    checks.append(await _workers(reader))
    checks.append(await _collector(reader))
    checks.append(await _providers(reader))
    return _reply(checks, "")


async def _workers(reader: HealthReader) -> dict[str, Any]:
    try:
        seen = await reader.workers_seen(SEEN_WITHIN_SECONDS)
    except EvqError as exc:
        return _check("workers", False, exc.message)
    if not seen:
        return _check(
            "workers",
            False,
            f"no worker seen in the last {SEEN_WITHIN_SECONDS:g}s: nothing will be sent (start `evq worker run`)",
        )
    names = ", ".join(str(w["owner"]) for w in seen[:5]) + (", ..." if len(seen) > 5 else "")
    # A worker that sends through other providers does nothing for these steps.
    try:
        waiting = await reader.providers_waiting()
    except EvqError as exc:
        return _check("workers", False, exc.message)
    served = {str(p) for w in seen for p in (w.get("providers") or ())}
    unserved = [p for p in waiting if p not in served]
    if unserved:
        return _check(
            "workers",
            False,
            f"{len(seen)} seen ({names}), but none sends through {', '.join(unserved)}, which steps wait for "
            "(start `evq worker run` with EVQ_ADAPTER including it)",
        )
    return _check("workers", True, f"{len(seen)} seen in the last {SEEN_WITHIN_SECONDS:g}s: {names}")


async def _collector(reader: HealthReader) -> dict[str, Any]:
    try:
        seconds = await reader.collector()
    except EvqError as exc:
        return _check("collector", False, f"the queue gauges cannot be read: {exc.message}")
    return _check("collector", True, f"queue gauges read in {round(seconds * 1000)} ms")


async def _providers(reader: HealthReader) -> dict[str, Any]:
    try:
        circuits = await reader.circuits()
    except EvqError as exc:
        return _check("providers", False, exc.message)
    held = [c for c in circuits if c.get("state") not in (None, "closed")]
    if not held:
        return _check("providers", True, "every known provider's circuit is closed (sending)")
    parts = [f"{c['provider']}: {c['state']} ({c.get('reason') or '?'})" for c in held]
    return _check("providers", False, "held, nothing sent to them until a probe gets through: " + "; ".join(parts))


def _reply(checks: list[dict[str, Any]], skipped: str) -> Reply:
    done = {c["name"] for c in checks}
    for name in CHECKS:
        if name not in done:
            checks.append(_check(name, False, f"not checked: {skipped}"))
    healthy = all(c["ok"] for c in checks)
    failed = sum(1 for c in checks if not c["ok"])
    return Reply(
        {"healthy": healthy, "checks": checks},
        {"failed": failed},
        status="success" if healthy else "partial_failure",
    )


def exit_code(data: dict[str, Any]) -> int:
    """0 when healthy, else the code of the first failed check (the module's docstring)."""
    failed = next((c["name"] for c in data["checks"] if not c["ok"]), None)
    if failed is None:
        return 0
    code = {"database": "E_DB_UNAVAILABLE", "schema": "E_SCHEMA_MISMATCH"}.get(failed, "E_PARTIAL_FAILURE")
    return EXIT_CODES[code]
