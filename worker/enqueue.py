"""Enqueue rules that do not depend on the database: validation with its counter,
the step's Message-ID, and what a repeated key means.

The SQL that writes decision and step lives in adapters/postgres; the Python API
for callers (inside their own transaction or not) is adapters/postgres/enqueue.py.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from evq.worker import metrics
from evq.worker.errors import IdempotencyConflict, InvalidRequest, Unresolvable
from evq.worker.records import EnqueueResult
from evq.worker.request import REQUEST_FIELDS, Policy, ValidRequest, ascii_domain, parse
from evq.worker.states import Status


def validate(request: Mapping[str, Any] | ValidRequest, policy: Policy) -> ValidRequest:
    if isinstance(request, ValidRequest):
        valid = request
    else:
        try:
            valid = parse(request, policy)
        except InvalidRequest as exc:
            _count(exc)
            raise
    refuse_unresolvable([valid], policy)
    return valid


def _count(exc: InvalidRequest) -> None:
    for reason in {_reason(e["field"]) for e in exc.errors}:
        metrics.VALIDATION_ERRORS.labels(reason=reason).inc()


def ambiguity(request: ValidRequest, policy: Policy) -> str | None:
    """``"unresolvable"`` when the step's provider could never settle a lost answer (the
    policy's ``unresolvable``, from each provider's profile); None otherwise."""
    return "unresolvable" if request.provider in policy.unresolvable else None


def flag_ambiguity(result: EnqueueResult, request: ValidRequest, policy: Policy) -> EnqueueResult:
    """The enqueue's answer with its ``ambiguity`` (every interface and the Python API say it)."""
    flag = ambiguity(request, policy)
    return result if flag == result.ambiguity else replace(result, ambiguity=flag)


def refuse_unresolvable(requests: Sequence[ValidRequest], policy: Policy, *, indexed: bool = False) -> None:
    """E_UNRESOLVABLE (an InvalidRequest: recorded as a refusal like the others) naming every
    request whose provider could never settle a lost answer, when the policy refuses them
    (EVQ_REFUSE_UNRESOLVABLE); nothing otherwise. Checked after the fields: a request
    with field errors is refused for those first."""
    if not policy.refuse_unresolvable:
        return
    errors = [
        {
            "field": f"[{i}].provider" if indexed else "provider",
            "message": f"provider {r.provider!r} could never settle this send if its answer were lost "
            "(no dedupe, no lookup, no webhook), and EVQ_REFUSE_UNRESOLVABLE is on",
        }
        for i, r in enumerate(requests)
        if ambiguity(r, policy) is not None
    ]
    if errors:
        exc = Unresolvable(
            errors,
            hint="send through a provider that can settle a lost answer (`evq providers list` shows which: "
            "resolvable true), configure one (a webhook, EVQ_SMTP_RELAY), or unset EVQ_REFUSE_UNRESOLVABLE; "
            "nothing was enqueued",
        )
        metrics.VALIDATION_ERRORS.labels(reason="provider").inc()
        raise exc


def _reason(field: str) -> str:
    root = field.split("[", 1)[0].split(".", 1)[0]
    return root if root in _REASONS else "unknown_field"


# The metric's reason label: a request field, or "$" for the request as a whole.
_REASONS = frozenset((*REQUEST_FIELDS, "$"))


def new_message_id(request: ValidRequest) -> str:
    """RFC 5322 Message-ID, fixed at enqueue and reused by every attempt (invariant 1).

    128 random bits as 32 hex digits (uuid4's source, without building a UUID: a
    batch enqueue makes one per row)."""
    return f"<evq.{os.urandom(16).hex()}@{ascii_domain('x@' + request.sender_domain)}>"


def existing_or_conflict(row: Mapping[str, Any], request: ValidRequest) -> EnqueueResult:
    """A row already holds this key: the same request gets it back, a different one is refused."""
    same = (
        row["payload_sha256"] == request.payload_sha256
        and row["run_id"] == request.run_id
        and row["step_id"] == request.step_id
        and row["idempotency_key"] == request.idempotency_key
    )
    if not same:
        raise IdempotencyConflict(
            f"idempotency key {request.idempotency_key!r} (run {request.run_id!r}, step {request.step_id!r}) "
            "is already used by a different request; nothing was written",
            hint="a retry must send exactly the same request; a new email needs a new step_id",
            context={"existing_id": row["id"], "idempotency_key": request.idempotency_key},
        )
    return result_from_row(row)


def result_from_row(row: Mapping[str, Any]) -> EnqueueResult:
    return EnqueueResult(
        id=row["id"],
        run_id=row["run_id"],
        step_id=row["step_id"],
        idempotency_key=row["idempotency_key"],
        message_id=row["message_id"],
        status=Status(row["status"]),
        created=bool(row["created"]),
    )


def validate_many(requests: Sequence[Any], policy: Policy) -> list[ValidRequest]:
    """Validate every request first, so one bad line writes nothing at all."""
    valid: list[ValidRequest] = []
    errors: list[dict[str, str]] = []
    for index, request in enumerate(requests):
        try:
            valid.append(validate(request, replace(policy, refuse_unresolvable=False)))
        except InvalidRequest as exc:
            errors += [{"field": f"[{index}].{e['field']}", "message": e["message"]} for e in exc.errors]
    if errors:
        raise InvalidRequest(errors, hint="nothing was enqueued; fix the listed requests and run again")
    refuse_unresolvable(valid, policy, indexed=True)
    return valid
