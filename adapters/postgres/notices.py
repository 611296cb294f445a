"""Enqueue failure notices inside the transaction of the transition that owes them.

    from evq.adapters.postgres.notices import enqueue_notices
    with conn.transaction():
        ...                                   # the statement that closed step 42 as rejected
        enqueue_notices(conn, [42], config=settings.notices(), actor="operator:ada")

The store's own paths (record, rescue) use :func:`notice_op` through the same
runner as enqueue; any other path that closes a step (an operator's verdict) calls
:func:`enqueue_notices` or ``PostgresStore.enqueue_notices`` before it commits.
Calling it for steps that owe nothing, or twice for the same transition, is a no-op.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

import psycopg

from evq.adapters.postgres.op_runner import Op, run_sync
from evq.adapters.postgres.queries import Q
from evq.worker import metrics
from evq.worker.enqueue import new_message_id
from evq.worker.errors import InvalidRequest
from evq.worker.logs import get_logger
from evq.worker.notices import NoticeConfig, build_delivery_notice, build_notice
from evq.worker.request import ValidRequest

log = get_logger("evq.notices")


def notice_op(step_ids: Sequence[int], config: NoticeConfig, *, actor: str, now: datetime | None = None) -> Op:
    """Notices for those of ``step_ids`` that owe one; returns [(notice id, step id)] created."""
    if not step_ids:
        return []
    rows = yield Q["notice_candidates"], {"ids": list(step_ids), "statuses": [str(s) for s in config.statuses]}
    return (yield from _enqueue_built(rows, lambda row: build_notice(row, config), actor=actor, now=now))


def _enqueue_built(
    rows: Sequence[Mapping[str, Any]],
    build: Callable[[Mapping[str, Any]], ValidRequest],
    *,
    actor: str,
    now: datetime | None,
    **logged: Any,
) -> Op:
    """Build each candidate's notice and enqueue them in one statement; [(notice id, step id)].

    The transition itself must still commit (with the rest of its batch): a notice that
    cannot be built is logged loudly, never allowed to undo the outcome it is about."""
    notices: list[tuple[int, ValidRequest]] = []
    for row in rows:
        try:
            notices.append((row["id"], build(row)))
        except InvalidRequest as exc:
            log.error("notice_not_built", step=row["id"], error=exc.message, fields=exc.errors)
        except Exception:
            log.exception("notice_not_built", step=row["id"])
    if not notices:
        return []
    created = yield Q["notice_enqueue"], _params(notices, actor=actor, now=now)
    for row in created:
        metrics.NOTICES.inc()
        log.info("notice_enqueued", step=row["notice_of"], notice=row["id"], **logged)
    return [(r["id"], r["notice_of"]) for r in created]


def enqueue_notices(
    conn: psycopg.Connection, step_ids: Sequence[int], *, config: NoticeConfig, actor: str, now: datetime | None = None
) -> list[tuple[int, int]]:
    """The same on a sync psycopg connection, inside the caller's transaction."""
    return run_sync(conn, notice_op(step_ids, config, actor=actor, now=now))


def _params(notices: list[tuple[int, ValidRequest]], *, actor: str, now: datetime | None) -> dict[str, Any]:
    return {
        "now": now,
        "actor": actor,
        "notice_of": [of for of, _ in notices],
        "kinds": [n.decision.rationale["status"] for _, n in notices],
        "run_ids": [n.run_id for _, n in notices],
        "step_ids": [n.step_id for _, n in notices],
        "keys": [n.idempotency_key for _, n in notices],
        "message_ids": [new_message_id(n) for _, n in notices],
        "providers": [n.provider for _, n in notices],
        "payloads": [n.payload_json for _, n in notices],
        "digests": [n.payload_sha256 for _, n in notices],
        "intents": [n.decision.intent for _, n in notices],
        "rationales": [json.dumps(n.decision.rationale, ensure_ascii=False) for _, n in notices],
    }


def delivery_notice_op(
    step_id: int, event: Mapping[str, Any], config: NoticeConfig, *, actor: str, now: datetime | None = None
) -> Op:
    """The notice a hard bounce or a complaint (``event``: type, provider, recipient,
    occurred_at, received_at) owes step ``step_id``, if it is accepted and someone is to be
    told; one per step and type (its key is derived from both). [(notice id, step id)] created."""
    rows = yield Q["delivery_notice_candidates"], {"id": step_id}
    return (
        yield from _enqueue_built(
            rows, lambda row: build_delivery_notice(row, event, config), actor=actor, now=now, kind=event["type"]
        )
    )
