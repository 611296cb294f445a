"""What the app (every interface) reads and writes of steps: enqueue, the reads, an operator's verdict."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from evq.adapters.postgres.batch_enqueue import enqueue_many_op
from evq.adapters.postgres.notices import notice_op
from evq.adapters.postgres.op_runner import run_async
from evq.adapters.postgres.queries import Q
from evq.adapters.postgres.single_enqueue import enqueue_op, gated_op, preview_op
from evq.adapters.postgres.store.base import PostgresBase, fetch_all
from evq.worker import metrics
from evq.worker.approval_policy import ApprovalPolicy, gated
from evq.worker.deadline import DEADLINE_SHARE
from evq.worker.errors import NotFound, StateConflict
from evq.worker.logs import get_logger
from evq.worker.ports import COUNT_CAP, SUBJECT_SCAN_CAP, StatusCount, StepFilter, SubjectPage
from evq.worker.pruner import step_not_found
from evq.worker.records import (
    EnqueueResult,
    Resolved,
    RunDetail,
    StepDetail,
    StepSummary,
)
from evq.worker.request import ValidRequest
from evq.worker.resolution import Resolution, Verdict
from evq.worker.retry_guard import retry_after_acceptance, retry_after_redaction, retry_too_soon
from evq.worker.search import search_terms
from evq.worker.states import Status

log = get_logger("evq.store")


def _filter_params(where: StepFilter) -> dict[str, Any]:
    """step_list's and step_count_by_status's filter parameters (NULL: no condition)."""
    terms = search_terms(where.search) if where.search is not None else None
    return {
        "ids": list(where.ids) or None,
        "run_id": where.run_id,
        "provider": where.provider,
        "created_before": where.created_before,
        "recipient_domain": where.recipient_domain,
        "search": terms.text if terms else None,
        "search_id": terms.step_id if terms else None,
        "search_recipient": terms.recipient if terms else None,
        "search_message_id": terms.message_id if terms else None,
        "count_cap": COUNT_CAP,
    }


# A search's page read in growing windows of its newest hits before all of them (hours; None: no
# window). A big search (a domain's 50,000 steps) would otherwise read every hit's row, most of
# the table, to sort them; its newest page is nearly always within the last hour. A small one
# costs a few cheap reads more. Unknown and held hits (the page's first rows) are never cut.
SEARCH_WINDOWS: tuple[float | None, ...] = (1.0, 24.0, None)
SEARCH_FEW_CUT = 2_000  # a window that cut no more hits than this is followed by the whole
WAITING = frozenset({str(Status.UNKNOWN), str(Status.HELD)})


def _search_windows(where: StepFilter, window: int | None) -> tuple[float | None, ...]:
    """The windows list_steps tries: none but the whole when there is no search, no page size,
    or only waiting states are asked for (the window cuts only the others)."""
    if where.search is None or window is None or (where.statuses and {str(s) for s in where.statuses} <= WAITING):
        return (None,)
    return SEARCH_WINDOWS


class PostgresSteps(PostgresBase):
    """Enqueue, reading back and resolving."""

    async def enqueue(
        self, request: ValidRequest, *, now: datetime | None = None, approval: ApprovalPolicy = ApprovalPolicy()
    ) -> EnqueueResult:
        if not gated(approval, [request]):
            async with self._op("enqueue") as conn:
                return await run_async(conn, enqueue_op(request, now))
        # The policy's reads, the budgets' charges and the step commit together (their row
        # locks held until then): adapters/postgres/single_enqueue.py, gated_op.
        async with self._op("enqueue") as conn, conn.transaction():
            return await run_async(conn, gated_op(request, approval, now))

    async def enqueue_many(
        self,
        requests: Sequence[ValidRequest],
        *,
        now: datetime | None = None,
        approval: ApprovalPolicy = ApprovalPolicy(),
    ) -> list[EnqueueResult]:
        # Multi-row statements inside one transaction: all or nothing.
        async with self._op("enqueue_many") as conn, conn.transaction():
            return await run_async(conn, enqueue_many_op(requests, now, approval))

    async def preview_holds(
        self, request: ValidRequest, approval: ApprovalPolicy, *, now: datetime | None = None
    ) -> list[dict[str, Any]]:
        """What the policy would hold this request for if it were a new step (a dry run; no write)."""
        async with self._snapshot("preview_holds") as conn:
            holds: list[dict[str, Any]] = await run_async(conn, preview_op(request, approval, now))
            return holds

    async def budget_usage(self, *, now: datetime | None = None, limit: int = 20) -> list[dict[str, Any]]:
        """The blast-radius counters of the current windows, most used first (`evq policy show`)."""
        return await self._fetch("budget_usage", Q["budget_usage"], {"now": now, "limit": limit})

    async def find_by_key(self, request: ValidRequest) -> dict[str, Any] | None:
        """The step holding this request's key (or its run and step ids), if any."""
        rows = await self._fetch(
            "find_by_key",
            Q["step_get_by_key"],
            {"idempotency_key": request.idempotency_key, "run_id": request.run_id, "step_id": request.step_id},
        )
        return rows[0] if rows else None

    async def get_step(self, step_id: int) -> StepDetail:
        async with self._snapshot("get_step") as conn:
            rows = await fetch_all(conn, Q["step_get"], {"id": step_id})
            if not rows:
                pruned = await fetch_all(conn, Q["step_pruned"], {"id": step_id})
                raise step_not_found(step_id, pruned[0] if pruned else None)
            step = rows[0]
            decision = await fetch_all(conn, Q["decision_get"], {"id": step["decision_id"]})
            evidence = await fetch_all(conn, Q["evidence_for_step"], {"id": step_id})
        return StepDetail(step=step, decision=decision[0] if decision else None, evidence=evidence)

    async def get_steps(self, step_ids: Sequence[int]) -> list[StepDetail]:
        if not step_ids:
            return []
        ids = list(step_ids)
        async with self._snapshot("get_steps") as conn:
            steps = {r["id"]: r for r in await fetch_all(conn, Q["steps_get"], {"ids": ids})}
            decision_ids = sorted({s["decision_id"] for s in steps.values()})
            decisions = {r["id"]: r for r in await fetch_all(conn, Q["decisions_get"], {"ids": decision_ids})}
            evidence: dict[int, list[dict[str, Any]]] = {}
            for e in await fetch_all(conn, Q["evidence_for_steps"], {"ids": ids}):
                evidence.setdefault(e["step_id"], []).append(e)
        return [
            StepDetail(step=steps[i], decision=decisions.get(steps[i]["decision_id"]), evidence=evidence.get(i, []))
            for i in dict.fromkeys(ids)
            if i in steps
        ]

    async def get_run(self, run_id: str, *, limit: int, offset: int = 0) -> RunDetail:
        """A page of one run's steps with their decisions and evidence, read from one snapshot."""
        async with self._snapshot("get_run") as conn:
            [counted] = await fetch_all(conn, Q["run_step_count"], {"run_id": run_id, "count_cap": COUNT_CAP})
            if not counted["n"]:
                raise NotFound(f"no steps in run {run_id!r}", hint="`evq steps list` shows the run ids")
            page = {"run_id": run_id, "limit": limit, "offset": offset}
            steps = await fetch_all(conn, Q["run_steps"], page)
            ids = [s["id"] for s in steps]
            decision_ids = sorted({s["decision_id"] for s in steps})
            decisions = await fetch_all(conn, Q["decisions_get"], {"ids": decision_ids}) if ids else []
            evidence = await fetch_all(conn, Q["evidence_for_steps"], {"ids": ids}) if ids else []
        return RunDetail(run_id=run_id, steps=steps, decisions=decisions, evidence=evidence, total=counted["n"])

    async def last_answers(self, step_ids: Sequence[int]) -> dict[int, dict[str, Any]]:
        """The latest provider answer of each step that has one, by step id."""
        if not step_ids:
            return {}
        rows = await self._fetch("last_answers", Q["evidence_last_answers"], {"ids": list(step_ids)})
        return {r["step_id"]: r for r in rows}

    async def list_facts(self, step_ids: Sequence[int]) -> dict[int, dict[str, Any]]:
        if not step_ids:
            return {}
        rows = await self._fetch("list_facts", Q["step_list_facts"], {"ids": list(step_ids)})
        return {r["id"]: r for r in rows}

    async def list_by_subject(self, where: StepFilter, *, now: datetime | None = None) -> SubjectPage:
        """step_subject_scan: the newest SUBJECT_SCAN_CAP steps the other filters leave, read
        once, matched against the subject there (docs/design.md, "Search by subject")."""
        assert where.subject is not None
        params = {
            **_filter_params(where),
            "now": now,
            "statuses": [str(s) for s in where.statuses] or None,
            "subject": where.subject.lower(),
            "scan_cap": SUBJECT_SCAN_CAP,
            "limit": where.limit,
            "offset": where.offset,
        }
        rows = await self._tuned_read("list_by_subject", Q["list_settings"], Q["step_subject_scan"], params)
        head = rows[0]
        counted = head["by_status"] or {}
        return SubjectPage(
            rows=[StepSummary.from_row(r) for r in rows if r["id"] is not None],
            scanned=head["scanned"],
            cap=SUBJECT_SCAN_CAP,
            by_status={str(s): int(counted.get(str(s), 0)) for s in Status},
        )

    async def list_steps(self, where: StepFilter, *, now: datetime | None = None) -> tuple[list[StepSummary], int]:
        if where.subject is not None:
            # Every caller (a bulk close's selection too) honours the subject: never more rows.
            found = await self.list_by_subject(where, now=now)
            return found.rows, found.total(where.statuses)
        window = None if where.limit is None else where.limit + where.offset
        params = {
            **_filter_params(where),
            "now": now,
            "statuses": [str(s) for s in where.statuses] or None,
            "limit": where.limit,
            "offset": where.offset,
            # Each state's branch reads this many rows of its own; the page is cut from them.
            "window": window,
            "search_since": None,
        }
        async with self._snapshot("list_steps") as conn:
            await conn.execute(Q["list_settings"])
            windows = list(_search_windows(where, window))
            while windows:
                hours = windows.pop(0)
                params["search_since"] = None if hours is None else (now or datetime.now(UTC)) - timedelta(hours=hours)
                rows = await fetch_all(conn, Q["step_list"], params)
                # Complete when no window cut the search, when it cut nothing, or when the window
                # alone holds at least `window` of the page's newest-first rows: every hit it left
                # out is older than all of them, so none of it could be on the page
                # (docs/design.md, "Search").
                if hours is None or rows[0]["cut"] == 0 or rows[0]["recent"] >= window:
                    break
                if rows[0]["cut"] <= SEARCH_FEW_CUT:
                    windows = [None]  # so few left out that reading them all costs less than a window
        # One row always comes back: it carries the total (a window's cut hits counted too), and
        # no step when the page is empty.
        total = rows[0]["total"] if rows else 0
        return [StepSummary.from_row(r) for r in rows if r["id"] is not None], total

    async def count_by_status(self, where: StepFilter) -> dict[str, StatusCount]:
        if where.subject is not None:
            found = await self.list_by_subject(replace(where, statuses=(), limit=0, offset=0))
            # A cut scan's counts are "at least": older steps were not searched.
            return {
                s: StatusCount(min(n, COUNT_CAP), n <= COUNT_CAP and not found.cut) for s, n in found.by_status.items()
            }
        rows = await self._tuned_read(
            "count_by_status", Q["list_settings"], Q["step_count_by_status"], _filter_params(where)
        )
        counted = {r["status"]: r["n"] for r in rows}
        return {str(s): StatusCount.capped(counted.get(str(s), 0)) for s in Status}

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
            rows = await fetch_all(conn, Q["step_resolve"], params)
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
        if row["to_status"] is None and resolution.verdict is Verdict.RETRY and row["content_redacted_at"] is not None:
            raise retry_after_redaction(step_id, row["content_redacted_at"])
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

    async def schema_revision(self) -> str | None:
        rows = await self._fetch("schema_revision", Q["schema_revision"], {})
        return rows[0]["version_num"] if rows else None
