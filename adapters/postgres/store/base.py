"""The PostgreSQL store: the core's Store port over a psycopg async pool.

Every call passes one chokepoint (:meth:`PostgresStore._op`): it times the call
into a histogram by operation and outcome, logs it with the step identifiers bound,
and translates driver errors into evq errors. Pool connections run in autocommit:
every operation is one statement, atomic on its own, which saves the BEGIN/COMMIT
round trips that would otherwise double the cost of a small transaction. The few
that need more than one statement (a transition that owes a failure notice) run
inside :meth:`PostgresStore.transaction`, which pins one connection for every store
call made within it.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from contextvars import ContextVar
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from evq.adapters.postgres.conninfo import normalise
from evq.adapters.postgres.database import connect_kwargs, translate
from evq.adapters.postgres.enqueue import enqueue_many_op, enqueue_op, run_async
from evq.adapters.postgres.notices import notice_op
from evq.adapters.postgres.queries import Q
from evq.worker import metrics
from evq.worker.deadline import DEADLINE_SHARE
from evq.worker.errors import AuthFailed, Conflict, NotFound, StateConflict
from evq.worker.keys import NewKey, Role, hash_secret
from evq.worker.logs import get_logger
from evq.worker.notices import NoticeConfig
from evq.worker.ports import StepFilter
from evq.worker.pruner import PruneCounts
from evq.worker.ratelimit import Grant
from evq.worker.records import (
    ClaimedStep,
    EnqueueResult,
    RecordResult,
    RescueCounts,
    Resolved,
    RunDetail,
    StepDetail,
    StepSummary,
    Transition,
    UnknownStep,
)
from evq.worker.request import ValidRequest
from evq.worker.resolution import Resolution, Verdict
from evq.worker.retry_guard import retry_after_acceptance, retry_too_soon
from evq.worker.states import Status

log = get_logger("evq.store")

# The connection of the store transaction the current task is inside, if any.
_PINNED: ContextVar[tuple[PostgresStore, psycopg.AsyncConnection] | None] = ContextVar("evq_pinned", default=None)


def _misconfigured(exc: psycopg.Error) -> bool:
    """The server answered and refused this URL for good: no such database or role, bad login."""
    state = exc.sqlstate or ""
    if state.startswith("28") or state == "3D000":
        return True
    # libpq gives no SQLSTATE for a refused connection: the server's FATAL text is what there is.
    text = str(exc)
    return "FATAL" in text and any(m in text for m in _MISCONFIGURED)


_MISCONFIGURED = ("does not exist", "authentication failed", "no pg_hba.conf entry", "permission denied")


class PostgresStore:
    def __init__(self, pool: AsyncConnectionPool, *, notices: NoticeConfig = NoticeConfig()):
        self.pool = pool
        self.notices = notices

    @classmethod
    async def open(
        cls,
        url: str,
        *,
        min_size: int = 1,
        max_size: int = 4,
        prepare: bool = True,
        notices: NoticeConfig = NoticeConfig(),
        patient: bool = True,
    ) -> PostgresStore:
        """``patient``: whether a server that does not answer (nothing listening, starting up,
        shutting down) is waited for, up to 15 s, as a worker restarting with its database wants;
        a one-shot command passes False and fails at once, as it does for a wrong database."""
        url = normalise(url)
        kwargs: dict[str, Any] = {**connect_kwargs(), "autocommit": True}
        # One direct connection first: a database that does not exist or refuses our login
        # is a clear error now, not a pool retrying it for 15 s. A server that is not
        # answering (refused, starting, shutting down) may be restarting: the pool waits,
        # unless the caller is not patient.
        try:
            probe = await psycopg.AsyncConnection.connect(url, **connect_kwargs())
        except psycopg.OperationalError as exc:
            if _misconfigured(exc) or not patient:
                raise translate(exc) or exc from None
        else:
            await probe.close()
        if not prepare:
            # PgBouncer in transaction mode cannot keep server-side prepared statements.
            kwargs["prepare_threshold"] = None
        pool = AsyncConnectionPool(
            # A short wait for a connection: when the database is out of reach the caller
            # hears about it (and logs it) within seconds, instead of hanging silently.
            url,
            min_size=min_size,
            max_size=max_size,
            kwargs=kwargs,
            open=False,
            name="evq",
            timeout=10,
        )
        try:
            await pool.open(wait=True, timeout=15)
        except Exception as exc:
            await pool.close()
            raise translate(exc) or exc from exc
        return cls(pool, notices=notices)

    async def close(self) -> None:
        await self.pool.close()

    @asynccontextmanager
    async def _op(self, name: str) -> AsyncIterator[psycopg.AsyncConnection]:
        started = time.perf_counter()
        outcome = "ok"
        pinned = _PINNED.get()
        try:
            if pinned is not None and pinned[0] is self:
                yield pinned[1]
            else:
                async with self.pool.connection() as conn:
                    yield conn
        except BaseException as exc:
            outcome = "error"
            mapped = translate(exc) if isinstance(exc, Exception) else None
            if mapped is not None and mapped is not exc:
                raise mapped from exc
            raise
        finally:
            metrics.labelled(metrics.STORE_SECONDS, name, outcome).observe(time.perf_counter() - started)

    @asynccontextmanager
    async def transaction(self, name: str) -> AsyncIterator[psycopg.AsyncConnection]:
        """One transaction: every call on this store inside it (in this task) runs in it."""
        async with self._op(name) as conn, conn.transaction():
            token = _PINNED.set((self, conn))
            try:
                yield conn
            finally:
                _PINNED.reset(token)

    async def _fetch(self, name: str, query: str, params: Mapping[str, Any]) -> list[dict[str, Any]]:
        async with self._op(name) as conn:
            return await _rows(conn, query, params)

    @asynccontextmanager
    async def _snapshot(self, name: str) -> AsyncIterator[psycopg.AsyncConnection]:
        """A read-only transaction whose statements all see one snapshot."""
        async with self._op(name) as conn, conn.transaction():
            await conn.execute(Q["snapshot_read"])
            yield conn

    # -- enqueue -------------------------------------------------------------

    async def enqueue(self, request: ValidRequest, *, now: datetime | None = None) -> EnqueueResult:
        async with self._op("enqueue") as conn:
            return await run_async(conn, enqueue_op(request, now))

    async def enqueue_many(self, requests: Sequence[ValidRequest]) -> list[EnqueueResult]:
        # Multi-row statements inside one transaction: all or nothing.
        async with self._op("enqueue_many") as conn, conn.transaction():
            return await run_async(conn, enqueue_many_op(requests))

    # -- the worker's transitions ---------------------------------------------

    async def claim(
        self,
        *,
        owner: str,
        providers: Sequence[str],
        limit: int,
        lease_seconds: float,
        dedupe_windows: Mapping[str, float],
        claim_id: str | None = None,
        probe: bool = False,
        now: datetime | None = None,
    ) -> list[ClaimedStep]:
        """Claim up to ``limit`` rows. Their lease tokens derive from ``claim_id`` (a fresh
        one when not given), so a caller that never got the answer can name them later
        (:meth:`release_orphans`)."""
        rows = await self._fetch(
            "claim",
            Q["step_claim"],
            {
                "now": now,
                "claim_id": claim_id or new_claim_id(),
                "probe": probe,
                "owner": owner,
                "providers": list(providers),
                "limit": limit,
                "lease_seconds": lease_seconds,
                "dedupe_windows": json.dumps(dict(dedupe_windows)),
            },
        )
        return [ClaimedStep.from_row(r) for r in rows]

    async def record(
        self, transitions: Sequence[Transition], *, actor: str, now: datetime | None = None
    ) -> list[RecordResult]:
        if not self.notices.due([t.to_status for t in transitions], [t.reason for t in transitions]):
            return await self._record(transitions, actor=actor, now=now)
        # The rare batch that rejects a step: its notice is enqueued in the same transaction.
        async with self.transaction("record_with_notices"):
            results = await self._record(transitions, actor=actor, now=now)
            await self.enqueue_notices([r.step_id for r in results if r.applied or r.settled], actor=actor, now=now)
        return results

    async def _record(
        self, transitions: Sequence[Transition], *, actor: str, now: datetime | None = None
    ) -> list[RecordResult]:
        if not transitions:
            return []
        rows = await self._fetch(
            "record", Q["step_record"], {"transitions": _transitions_json(transitions), "actor": actor, "now": now}
        )
        not_applied = set(rows[0]["fenced"])
        results = [RecordResult(step_id=t.step_id, applied=True) for t in transitions if t.step_id not in not_applied]
        fenced = [t for t in transitions if t.step_id in not_applied]
        if fenced:
            late = await self._fetch(
                "record_late",
                Q["step_record_late"],
                {"transitions": _transitions_json(fenced), "actor": actor, "now": now},
            )
            by_id = {r["id"]: r for r in late}
            for t in fenced:
                row = by_id.get(t.step_id, {"recorded": False, "settled": False})
                results.append(
                    RecordResult(
                        step_id=t.step_id, applied=False, settled=row["settled"], duplicate=not row["recorded"]
                    )
                )
        return results

    async def release(self, steps: Sequence[ClaimedStep], *, actor: str, now: datetime | None = None) -> int:
        return await self._release([(s.id, s.lease_token, s.attempt) for s in steps], actor=actor, now=now)

    async def release_orphans(
        self, *, owner: str, held: Sequence[Any], claims: Sequence[str], now: datetime | None = None
    ) -> int:
        """Release rows of ``claims`` (claims whose answer was lost) that this worker never
        received: only tokens derived from those claim ids, never one in ``held``."""
        if not claims:
            return 0
        rows = await self._fetch(
            "orphan_claims",
            Q["step_orphan_claims"],
            {"owner": owner, "held": [str(t) for t in held], "claims": list(claims)},
        )
        return await self._release([(r["id"], r["lease_token"], r["attempts"]) for r in rows], actor=owner, now=now)

    async def _release(self, held: Sequence[tuple[int, Any, int]], *, actor: str, now: datetime | None) -> int:
        if not held:
            return 0
        ids, tokens, attempts = (list(column) for column in zip(*held, strict=True))
        rows = await self._fetch(
            "release",
            Q["step_release"],
            {"now": now, "actor": actor, "ids": ids, "lease_tokens": tokens, "attempts": attempts},
        )
        return len(rows)

    async def enqueue_notices(
        self, step_ids: Sequence[int], *, actor: str, now: datetime | None = None
    ) -> list[tuple[int, int]]:
        """Failure notices for those of ``step_ids`` that owe one: [(notice id, step id)].

        Call it inside :meth:`transaction`, with the statement that closed the steps,
        so transition and notice commit together. Repeating it is a no-op.
        """
        async with self._op("notices") as conn:
            return await run_async(conn, notice_op(step_ids, self.notices, actor=actor, now=now))

    async def rescue(
        self, *, limit: int, lease_seconds: float, default_max_attempts: int, actor: str, now: datetime | None = None
    ) -> RescueCounts:
        if Status.UNKNOWN not in self.notices.statuses:
            counts, _ = await self._rescue(limit, lease_seconds, default_max_attempts, actor, now)
            return counts
        async with self.transaction("rescue_with_notices"):
            counts, unknown = await self._rescue(limit, lease_seconds, default_max_attempts, actor, now)
            await self.enqueue_notices(unknown, actor=actor, now=now)
        return counts

    async def _rescue(
        self, limit: int, lease_seconds: float, default_max_attempts: int, actor: str, now: datetime | None
    ) -> tuple[RescueCounts, list[int]]:
        rows = await self._fetch(
            "rescue",
            Q["step_rescue"],
            {
                "now": now,
                "limit": limit,
                "lease_seconds": lease_seconds,
                "default_max_attempts": default_max_attempts,
                "actor": actor,
            },
        )
        closed = await self._fetch(
            "close_windows",
            Q["step_close_windows"],
            {"now": now, "limit": limit, "lease_seconds": lease_seconds, "actor": actor},
        )
        unknown = [r["id"] for r in rows if r["status"] == "unknown"]
        counts = RescueCounts(unknown=len(unknown), retryable=len(rows) - len(unknown), window_closed=len(closed))
        return counts, unknown + [r["id"] for r in closed]

    async def claimable_exists(
        self, *, providers: Sequence[str], lease_seconds: float, now: datetime | None = None
    ) -> bool:
        rows = await self._fetch(
            "claimable_exists",
            Q["step_claimable_exists"],
            {"providers": list(providers), "lease_seconds": lease_seconds, "now": now},
        )
        return bool(rows[0]["claimable"])

    # -- provider rate limits (worker/ratelimit.py) ----------------------------------

    async def rate_take(
        self, *, provider: str, per_second: float, burst: int, want: int, now: datetime | None = None
    ) -> Grant:
        params = {"provider": provider, "per_second": per_second, "burst": burst, "want": want, "now": now}
        rows = await self._fetch("rate_take", Q["rate_limit_take"], params)
        if not rows:
            # First use of this provider's bucket; every later take is the one statement above.
            await self._fetch("rate_seed", Q["rate_limit_seed"], params)
            rows = await self._fetch("rate_take", Q["rate_limit_take"], params)
        row = rows[0]
        return Grant(granted=row["granted"], paused_for=row["paused_for"], next_token_in=row["next_token_in"])

    async def rate_refund(self, *, provider: str, burst: int, tokens: int, now: datetime | None = None) -> None:
        await self._fetch(
            "rate_refund", Q["rate_limit_refund"], {"provider": provider, "burst": burst, "tokens": tokens}
        )

    async def rate_pause(self, *, provider: str, seconds: float, now: datetime | None = None) -> float:
        rows = await self._fetch(
            "rate_pause", Q["rate_limit_pause"], {"provider": provider, "seconds": seconds, "now": now}
        )
        return float(rows[0]["paused_for"])

    # -- provider circuits (worker/circuit.py) -------------------------------------

    async def circuit_trip(
        self,
        *,
        provider: str,
        reason: str,
        detail: str,
        actor: str,
        probe_base: float,
        probe_max: float,
        now: datetime | None = None,
    ) -> dict[str, Any] | None:
        """Open the circuit (or reopen it after a failed probe); the change, or None if it was open."""
        params = {
            "provider": provider,
            "reason": reason,
            "detail": detail,
            "actor": actor,
            "probe_base": probe_base,
            "probe_max": probe_max,
            "now": now,
        }
        row = (await self._fetch("circuit_trip", Q["circuit_trip"], params))[0]
        if not row["present"]:
            await self._fetch("circuit_seed", Q["circuit_seed"], params)
            row = (await self._fetch("circuit_trip", Q["circuit_trip"], params))[0]
        return row if row["from_state"] is not None else None

    async def circuit_close(
        self, *, provider: str, reason: str, detail: str, actor: str, now: datetime | None = None
    ) -> bool:
        rows = await self._fetch(
            "circuit_close",
            Q["circuit_close"],
            {"provider": provider, "reason": reason, "detail": detail, "actor": actor, "now": now},
        )
        return bool(rows)

    async def circuit_probe_take(
        self, *, provider: str, owner: str, hold_seconds: float, lease_seconds: float, now: datetime | None = None
    ) -> bool:
        rows = await self._fetch(
            "circuit_probe_take",
            Q["circuit_probe_take"],
            {
                "provider": provider,
                "owner": owner,
                "hold_seconds": hold_seconds,
                "lease_seconds": lease_seconds,
                "now": now,
            },
        )
        return bool(rows)

    async def circuit_probe_idle(
        self,
        *,
        provider: str,
        owner: str,
        probe_base: float,
        detail: str = "the probe found no step to send",
        now: datetime | None = None,
    ) -> bool:
        rows = await self._fetch(
            "circuit_probe_idle",
            Q["circuit_probe_idle"],
            {"provider": provider, "owner": owner, "probe_base": probe_base, "detail": detail, "now": now},
        )
        return bool(rows)

    async def circuits(self, *, now: datetime | None = None) -> list[dict[str, Any]]:
        return await self._fetch("circuits", Q["circuit_list"], {"now": now})

    # -- the reconciler -------------------------------------------------------------

    async def reconcile_claim(
        self, *, providers: Sequence[str], max_checks: int, hold_seconds: float, now: datetime | None = None
    ) -> UnknownStep | None:
        rows = await self._fetch(
            "reconcile_claim",
            Q["step_reconcile_claim"],
            {
                "now": now,
                "providers": list(providers),
                "max_checks": max_checks,
                "hold_seconds": hold_seconds,
                "limit": 1,
            },
        )
        return UnknownStep.from_row(rows[0]) if rows else None

    async def reconcile_found(
        self,
        step_id: int,
        *,
        provider_message_id: str | None,
        message: str,
        detail: Mapping[str, Any],
        actor: str,
        now: datetime | None = None,
    ) -> bool:
        rows = await self._fetch(
            "reconcile_found",
            Q["step_reconcile_found"],
            {
                "now": now,
                "id": step_id,
                "provider_message_id": provider_message_id,
                "message": message,
                "detail": _json(detail),
                "actor": actor,
            },
        )
        for row in rows:
            metrics.observe_closed(row["created_at"], row["closed_at"])
        return bool(rows)

    async def reconcile_absent(
        self,
        step_id: int,
        *,
        next_check: float,
        detail: Mapping[str, Any],
        actor: str,
        now: datetime | None = None,
    ) -> bool:
        rows = await self._fetch(
            "reconcile_absent",
            Q["step_reconcile_absent"],
            {"now": now, "id": step_id, "next_check": next_check, "detail": _json(detail), "actor": actor},
        )
        return bool(rows[0]["n"])

    # -- retention (evq prune: an administrator's write) ---------------------------

    async def prune_cutoff(self, *, older_than: timedelta) -> datetime:
        rows = await self._fetch("prune_cutoff", Q["prune_cutoff"], {"older_than": older_than})
        return rows[0]["cutoff"]

    async def prune_batch(self, *, cutoff: datetime, limit: int, actor: str, run: Any, batch: int) -> PruneCounts:
        """One batch in one transaction: the deletes, and the prune_log row that records them."""
        rows = await self._fetch(
            "prune", Q["steps_prune"], {"cutoff": cutoff, "limit": limit, "actor": actor, "run": run, "batch": batch}
        )
        row = rows[0]
        return PruneCounts(steps=row["steps"], evidence=row["evidence"], decisions=row["decisions"], batches=1)

    async def prune_count(self, *, cutoff: datetime) -> PruneCounts:
        rows = await self._fetch("prune_count", Q["steps_prune_count"], {"cutoff": cutoff})
        return PruneCounts(steps=rows[0]["steps"], evidence=rows[0]["evidence"], decisions=rows[0]["decisions"])

    # -- reading back -----------------------------------------------------------

    async def get_step(self, step_id: int) -> StepDetail:
        async with self._snapshot("get_step") as conn:
            rows = await _rows(conn, Q["step_get"], {"id": step_id})
            if not rows:
                raise NotFound(f"no step with id {step_id}", hint="`evq steps list` shows the ids")
            step = rows[0]
            decision = await _rows(conn, Q["decision_get"], {"id": step["decision_id"]})
            evidence = await _rows(conn, Q["evidence_for_step"], {"id": step_id})
        return StepDetail(step=step, decision=decision[0] if decision else None, evidence=evidence)

    async def get_run(self, run_id: str) -> RunDetail:
        """One run's steps, decisions and evidence, read from one snapshot."""
        async with self._snapshot("get_run") as conn:
            steps = await _rows(conn, Q["run_steps"], {"run_id": run_id})
            if not steps:
                raise NotFound(f"no steps in run {run_id!r}", hint="`evq steps list` shows the run ids")
            decisions = await _rows(conn, Q["run_decisions"], {"run_id": run_id})
            evidence = await _rows(conn, Q["run_evidence"], {"run_id": run_id})
        return RunDetail(run_id=run_id, steps=steps, decisions=decisions, evidence=evidence)

    async def last_answers(self, step_ids: Sequence[int]) -> dict[int, dict[str, Any]]:
        """The latest provider answer of each step that has one, by step id."""
        if not step_ids:
            return {}
        rows = await self._fetch("last_answers", Q["evidence_last_answers"], {"ids": list(step_ids)})
        return {r["step_id"]: r for r in rows}

    async def list_steps(self, where: StepFilter, *, now: datetime | None = None) -> tuple[list[StepSummary], int]:
        rows = await self._fetch(
            "list_steps",
            Q["step_list"],
            {
                "now": now,
                "ids": list(where.ids) or None,
                "statuses": [str(s) for s in where.statuses] or None,
                "run_id": where.run_id,
                "provider": where.provider,
                "created_before": where.created_before,
                "recipient_domain": where.recipient_domain,
                "limit": where.limit,
                "offset": where.offset,
            },
        )
        # One row always comes back: it carries the total, and no step when the page is empty.
        total = rows[0]["total"] if rows else 0
        return [StepSummary.from_row(r) for r in rows if r["id"] is not None], total

    # -- operators ----------------------------------------------------------------

    async def resolve(
        self,
        step_id: int,
        resolution: Resolution,
        *,
        actor: str,
        default_max_attempts: int,
        now: datetime | None = None,
    ) -> Resolved:
        """Close one unknown row with an operator's verdict and its evidence, atomically.

        Raises NotFound, or StateConflict when the row is not unknown (someone
        closed it first, or it never was).
        """
        params = {
            "now": now,
            "id": step_id,
            "to_status": str(resolution.verdict.to_status),
            "verdict": str(resolution.verdict),
            "note": resolution.note,
            "reason": resolution.reason,
            "provider_message_id": resolution.provider_message_id,
            "evidence_url": resolution.evidence_url,
            "actor": actor,
            "default_max_attempts": default_max_attempts,
            "deadline_share": DEADLINE_SHARE,
        }
        async with self._op("resolve") as conn, conn.transaction():
            rows = await _rows(conn, Q["step_resolve"], params)
            if rows and rows[0]["to_status"] == str(Status.REJECTED):
                # The sender learns its email did not go out, in the transaction of the verdict.
                await run_async(conn, notice_op([step_id], self.notices, actor=actor, now=now))
        if not rows:
            raise NotFound(f"no step with id {step_id}", hint="`evq steps list --status unknown` shows the ids")
        row = rows[0]
        if (
            row["to_status"] is None
            and resolution.verdict is Verdict.RETRY
            and row["accepted_evidence"] is not None
            and (row["current_status"] == str(Status.UNKNOWN) or row["requeueable"])
        ):
            raise retry_after_acceptance(step_id, row["accepted_evidence"], row["current_status"])
        if row["to_status"] is None and row["current_status"] == str(Status.UNKNOWN):
            raise retry_too_soon(step_id, row["retry_not_before"], row["db_now"])
        if row["to_status"] is None:
            log.info("resolve_conflict", step=step_id, status=row["current_status"])
            raise StateConflict(
                f"step {step_id} is {row['current_status']}, not unknown: only unknown rows can be resolved "
                "(and, with --as retry, rejected rows whose attempts or retry budget ran out on temporary "
                "failures only)",
                hint=f"`evq steps show {step_id}` shows who changed it and when",
                context={"id": step_id, "status": row["current_status"], "reason": row["current_reason"]},
            )
        metrics.RESOLUTIONS.labels(**{"as": str(resolution.verdict)}).inc()
        if row["to_status"] in (str(Status.ACCEPTED), str(Status.REJECTED)):
            metrics.observe_closed(row["created_at"], row["resolved_at"])
        return Resolved(
            step_id=row["id"],
            run_id=row["run_id"],
            from_status=Status(row["current_status"]),
            to_status=Status(row["to_status"]),
            evidence_id=row["evidence_id"],
            resolved_at=row["resolved_at"],
            attempts=row["attempts"],
            max_attempts_before=row["max_attempts_before"],
            max_attempts_after=row["max_attempts_after"],
        )

    # -- API keys -------------------------------------------------------------------

    async def key_by_id(self, key_id: str) -> dict[str, Any] | None:
        """The key with this id and the server's pepper (worker.keys.KeyLookup); None: no such key."""
        rows = await self._fetch("key_by_id", Q["api_key_by_id"], {"key_id": key_id})
        return rows[0] if rows and rows[0]["name"] is not None else None

    async def rehash_key(self, key_id: str, *, old: str, new: str) -> None:
        await self._fetch("rehash_key", Q["api_key_rehash"], {"key_id": key_id, "old": old, "new": new})

    async def end_sessions(self, key_id: str, generation: int) -> None:
        """Sign-out of the ops page: sessions of this key made under ``generation`` end."""
        await self._fetch("end_sessions", Q["api_key_end_sessions"], {"key_id": key_id, "generation": generation})

    async def key_state(self, name: str) -> dict[str, Any]:
        return (await self._fetch("key_state", Q["api_key_state"], {"name": name}))[0]

    async def create_key(
        self, *, name: str, role: Role, key: NewKey, created_by: str | None, now: datetime | None = None
    ) -> dict[str, Any]:
        """Store a new key (hashed). ``created_by=None`` is the bootstrap: allowed
        only while no active admin key exists."""
        params = {
            "now": now,
            "name": name,
            "role": str(role),
            "key_id": key.key_id,
            "created_by": created_by,
            "bootstrap": created_by is None,
        }
        async with self._op("create_key") as conn, conn.transaction():
            await conn.execute(Q["api_key_lock"])
            [pepper] = await _rows(conn, Q["api_key_pepper"], {})
            params["secret_hash"] = hash_secret(key.secret, bytes(pepper["pepper"]))
            row = (await _rows(conn, Q["api_key_create"], params))[0]
        if not row["allowed"]:
            raise AuthFailed(
                "an admin key exists now: creating a key needs one",
                hint="set EVQ_API_KEY or pass --api-key (role admin)",
            )
        if row["name"] is None:
            raise Conflict(
                f"a key named {name!r} exists (names are never reused, even after a revoke)",
                hint="choose another name; `evq keys list` shows the names",
                context={"name": name},
            )
        return {k: v for k, v in row.items() if k != "allowed"}

    async def revoke_key(
        self, name: str, *, actor: str | None, dry_run: bool = False, now: datetime | None = None
    ) -> dict[str, Any]:
        """Revoke the key called ``name``; with ``dry_run`` the same statement runs and is rolled back."""
        async with self._op("revoke_key") as conn:
            async with conn.transaction(force_rollback=dry_run):
                await conn.execute(Q["api_key_lock"])
                rows = await _rows(conn, Q["api_key_revoke"], {"now": now, "name": name, "actor": actor})
        if not rows:
            raise NotFound(f"no key named {name!r}", hint="`evq keys list` shows the names")
        row = rows[0]
        if not row["changed"] and not row["already_revoked"]:
            raise StateConflict(
                f"{name!r} is the last active admin key: revoking it would leave nobody able to manage keys",
                hint="create another admin key first (`evq keys create --name NAME --role admin`)",
                context={"name": name},
            )
        return row

    async def list_keys(self) -> list[dict[str, Any]]:
        return await self._fetch("list_keys", Q["api_key_list"], {})

    async def find_by_key(self, request: ValidRequest) -> dict[str, Any] | None:
        """The step holding this request's key (or its run and step ids), if any."""
        rows = await self._fetch(
            "find_by_key",
            Q["step_get_by_key"],
            {"idempotency_key": request.idempotency_key, "run_id": request.run_id, "step_id": request.step_id},
        )
        return rows[0] if rows else None

    async def schema_revision(self) -> str | None:
        rows = await self._fetch("schema_revision", Q["schema_revision"], {})
        return rows[0]["version_num"] if rows else None


def new_claim_id() -> str:
    """Random and unguessable, so two claims never derive the same lease token."""
    return uuid.uuid4().hex


def _transitions_json(transitions: Sequence[Transition]) -> str:
    return json.dumps(
        [
            {
                "id": t.step_id,
                "lease_token": str(t.lease_token),
                "attempt": t.attempt,
                "to_status": str(t.to_status),
                "reason": str(t.reason),
                "outcome": t.outcome,
                "provider_message_id": t.provider_message_id,
                "retry_delay": t.retry_delay,
                "maybe_delivered": t.maybe_delivered,
                "latency_ms": t.latency_ms,
                "detail": t.detail,
                "message": _message(t),
                "charged": t.charged,
            }
            for t in transitions
        ],
        ensure_ascii=False,
        default=str,
    )


def _json(value: Mapping[str, Any]) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def _message(t: Transition) -> str | None:
    message = t.detail.get("message")
    return str(message)[:1000] if message is not None else None


async def _rows(conn: psycopg.AsyncConnection, query: str, params: Mapping[str, Any]) -> list[dict[str, Any]]:
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(query, params)
        return await cur.fetchall() if cur.description else []
