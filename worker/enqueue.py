"""Enqueue rules that do not depend on the database: validation with its counter,
the step's Message-ID, and what a repeated key means.

A step's identity is its key, its run and step ids, its payload (``payload_sha256``) and its
provider: a request that differs in any of them is a different send (:func:`existing_or_conflict`,
the one place every path compares a stored row, a step's or, for a key whose step evq prune
removed, the key ledger's: ``pruned``, invariant 12). EVQ_REFUSE_UNRESOLVABLE refuses only what would
be created: a request it concerns is looked up first (:func:`must_look_up`) and never inserted;
one a stored row holds is answered as that row is (:func:`answer_held`).

The SQL that writes decision and step lives in adapters/postgres; the Python API
for callers (inside their own transaction or not) is adapters/postgres/enqueue.py.
"""

from __future__ import annotations

import os
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace
from typing import Any

from evq.worker import metrics
from evq.worker.domains import ascii_domain
from evq.worker.errors import IdempotencyConflict, InvalidRequest, Unresolvable
from evq.worker.records import EnqueueResult
from evq.worker.request import REQUEST_FIELDS, Policy, ValidRequest, parse
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
    return valid


def _count(exc: InvalidRequest) -> None:
    for reason in {_reason(e["field"]) for e in exc.errors}:
        metrics.VALIDATION_ERRORS.labels(reason=reason).inc()


def ambiguity(request: ValidRequest, policy: Policy) -> str | None:
    """``"unresolvable"`` when the step's provider could never settle a lost answer (the
    policy's ``unresolvable``, from each provider's profile); None otherwise."""
    return _flag(request.provider, policy)


def _flag(provider: str, policy: Policy) -> str | None:
    return "unresolvable" if provider in policy.unresolvable else None


def flag_ambiguity(result: EnqueueResult, request: ValidRequest, policy: Policy) -> EnqueueResult:
    """The enqueue's answer with its ``ambiguity`` (every interface and the Python API say it):
    that of the stored step's provider when the result names it (a row answered as it is),
    else the request's."""
    flag = _flag(result.provider or request.provider, policy)
    return result if flag == result.ambiguity else replace(result, ambiguity=flag)


def must_look_up(requests: Sequence[ValidRequest], policy: Policy) -> list[int]:
    """The indexes of the requests EVQ_REFUSE_UNRESOLVABLE concerns (through a provider that
    could never settle a lost answer): each is looked up by key before anything is written and
    never inserted; :func:`answer_held` answers or refuses them. Empty without the setting."""
    if not policy.refuse_unresolvable:
        return []
    return [i for i, r in enumerate(requests) if ambiguity(r, policy) is not None]


def answer_held(
    requests: Sequence[ValidRequest],
    held: Mapping[int, Mapping[str, Any] | None],
    policy: Policy,
    *,
    indexed: bool = False,
) -> dict[int, EnqueueResult]:
    """The looked-up requests (:func:`must_look_up`, ``held``: index -> the stored row holding
    its key or its run and step ids, None: none). E_UNRESOLVABLE naming every one nothing
    holds (it would be created); otherwise each answered as its row is (created false, the
    ambiguity of the row's provider), or IdempotencyConflict when the row is another send."""
    refuse_unresolvable(requests, policy, indexed=indexed, held={i for i, row in held.items() if row is not None})
    return {
        i: flag_ambiguity(existing_or_conflict({**row, "created": False}, requests[i]), requests[i], policy)
        for i, row in held.items()
        if row is not None
    }


def merge_answers(answered: Mapping[int, EnqueueResult], enqueued: Sequence[EnqueueResult]) -> list[EnqueueResult]:
    """The results in request order: the answered indexes from ``answered``, the others, in
    order, from what the store enqueued (the requests not in ``answered``)."""
    rest = iter(enqueued)
    return [answered[i] if i in answered else next(rest) for i in range(len(answered) + len(enqueued))]


def refuse_unresolvable(
    requests: Sequence[ValidRequest], policy: Policy, *, indexed: bool = False, held: Collection[int] = ()
) -> None:
    """E_UNRESOLVABLE (an InvalidRequest: recorded as a refusal like the others) naming every
    request whose provider could never settle a lost answer, when the policy refuses them
    (EVQ_REFUSE_UNRESOLVABLE); nothing otherwise. ``held``: the indexes a stored row already
    holds, answered as they are and never refused (nothing would be created). Checked after
    the fields: a request with field errors is refused for those first."""
    if not policy.refuse_unresolvable:
        return
    errors = [
        {
            "field": f"[{i}].provider" if indexed else "provider",
            "message": f"provider {r.provider!r} could never settle this send if its answer were lost "
            "(no dedupe, no lookup, no webhook), and EVQ_REFUSE_UNRESOLVABLE is on",
        }
        for i, r in enumerate(requests)
        if ambiguity(r, policy) is not None and i not in held
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

    32 hex digits, as a UUIDv7 orders them: the enqueue time in milliseconds (48 bits), then
    80 random bits. Time first, so the ledger's unique index (uq_step_keys_message_id) takes
    each insert at its right edge rather than at a random page of an index of millions
    (a full-page image per checkpoint for each page touched); 80 random bits per millisecond
    keep them unguessable and distinct."""
    stamp = time.time_ns() // 1_000_000 & 0xFFFF_FFFF_FFFF
    return f"<evq.{stamp:012x}{os.urandom(10).hex()}@{ascii_domain('x@' + request.sender_domain)}>"


def existing_or_conflict(row: Mapping[str, Any], request: ValidRequest) -> EnqueueResult:
    """A row already holds this key: the same request gets it back, a different one is refused.

    The one comparison of a stored row with a request (every store, the dry run's plan, the
    Python API): the same key, run and step ids, payload (or the one an approver corrected) and provider. The provider is not in
    ``payload_sha256``, so it is compared on its own: the same key through another provider is
    another send (it would never be sent through the one asked for)."""
    # An approver's correction (issue 17) changed the stored payload; the agent's own hash is
    # kept in requested_sha256, so a retry of its original request still gets its step.
    same = (
        request.payload_sha256 in (row["payload_sha256"], row.get("requested_sha256"))
        and row["run_id"] == request.run_id
        and row["step_id"] == request.step_id
        and row["idempotency_key"] == request.idempotency_key
    )
    where = f"idempotency key {request.idempotency_key!r} (run {request.run_id!r}, step {request.step_id!r})"
    context = {"existing_id": row["id"], "idempotency_key": request.idempotency_key}
    if row.get("pruned"):
        # The key ledger's answer (invariant 12): the step is gone, its key is not.
        context["pruned"] = True
    if row["provider"] != request.provider and row["idempotency_key"] == request.idempotency_key:
        raise IdempotencyConflict(
            f"this key was enqueued through {row['provider']}; {where} cannot be sent through {request.provider}"
            + ("" if same else " (and the request differs too)")
            + "; nothing was written",
            hint=f"a retry must name the same provider ({row['provider']}) and request; to send through "
            f"{request.provider}, enqueue a new step_id (the step {row['id']} stays as it is)",
            context={**context, "existing_provider": row["provider"], "provider": request.provider},
        )
    if not same or row["provider"] != request.provider:
        raise IdempotencyConflict(
            f"{where} is already used by a different request; nothing was written",
            hint="a retry must send exactly the same request; a new email needs a new step_id",
            context=context,
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
        provider=row.get("provider"),
        reason=row.get("reason"),
        maybe_delivered=bool(row.get("maybe_delivered")),
        hold=row.get("hold"),
        pruned=bool(row.get("pruned")),
        hold_expires_at=row.get("hold_expires_at"),
    )


def validate_many(requests: Sequence[Any], policy: Policy) -> list[ValidRequest]:
    """Validate every request first, so one bad line writes nothing at all."""
    valid: list[ValidRequest] = []
    errors: list[dict[str, str]] = []
    for index, request in enumerate(requests):
        try:
            valid.append(validate(request, policy))
        except InvalidRequest as exc:
            errors += [{"field": f"[{index}].{e['field']}", "message": e["message"]} for e in exc.errors]
    if errors:
        raise InvalidRequest(errors, hint="nothing was enqueued; fix the listed requests and run again")
    return valid
