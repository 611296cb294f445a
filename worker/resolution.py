"""An operator's verdict on an ``unknown`` step (docs/design.md, "States and transitions", invariant 5).

Only ``unknown`` rows are resolved. ``accepted`` and ``rejected`` close the row;
``retry`` means "verified not sent": the row goes back to ``retryable`` and the
next attempt reuses the same idempotency key and Message-ID (invariant 1). ``retry``
also requeues a ``rejected`` row whose attempts or retry budget ran out on temporary
failures only (:data:`REQUEUE_REASONS`), with a fresh budget.
Validation here is pure, so every interface refuses the same input the same way.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from urllib.parse import urlsplit

from evq.worker.errors import InvalidRequest
from evq.worker.states import Reason, Status


class Verdict(StrEnum):
    ACCEPTED = "accepted"
    REJECTED = "rejected"
    RETRY = "retry"

    @property
    def to_status(self) -> Status:
        return {Verdict.ACCEPTED: Status.ACCEPTED, Verdict.REJECTED: Status.REJECTED, Verdict.RETRY: Status.RETRYABLE}[
            self
        ]


# A rejected step whose attempts or retry budget ran out on temporary failures only may
# be requeued (``retry``), like a dead-letter queue: none of its attempts can have been
# delivered (a step that may have been ends ``unknown``; the statement checks it too).
REQUEUE_REASONS = frozenset({Reason.ATTEMPTS_EXHAUSTED.value, Reason.RETRY_BUDGET_EXHAUSTED.value})


def requeueable(status: str, reason: str | None) -> bool:
    return status == Status.REJECTED and reason in REQUEUE_REASONS


MAX_NOTE = 2000
MAX_REFERENCE = 998  # an RFC 5322 line: provider ids are copied from headers and logs
_REASON = re.compile(r"^[a-z][a-z0-9_]{0,63}$")


@dataclass(frozen=True, slots=True)
class Resolution:
    verdict: Verdict
    note: str
    reason: str | None = None
    provider_message_id: str | None = None
    evidence_url: str | None = None

    @classmethod
    def parse(
        cls,
        verdict: str,
        note: str | None,
        *,
        reason: str | None = None,
        provider_message_id: str | None = None,
        evidence_url: str | None = None,
    ) -> Resolution:
        """Every failing field at once, named as the command line names it."""
        errors: list[dict[str, str]] = []
        try:
            v = Verdict(verdict)
        except ValueError:
            errors.append({"field": "--as", "message": f"one of {', '.join(Verdict)}, got {verdict!r}"})
            v = Verdict.REJECTED
        text = (note or "").strip()
        if not text:
            errors.append({"field": "--note", "message": "say why (what was checked, what was found)"})
        elif len(text) > MAX_NOTE or "\x00" in text:
            errors.append({"field": "--note", "message": f"at most {MAX_NOTE} characters, no NUL"})
        if reason is not None and not _REASON.match(reason):
            errors.append({"field": "--reason", "message": "a machine key: lowercase letters, digits and _, 1 to 64"})
        if provider_message_id is not None:
            if v is Verdict.RETRY:
                errors.append({"field": "--provider-message-id", "message": "a send verified as not sent has none"})
            elif (
                not provider_message_id.strip()
                or len(provider_message_id) > MAX_REFERENCE
                or _has_control(provider_message_id)
            ):
                errors.append(
                    {"field": "--provider-message-id", "message": f"1 to {MAX_REFERENCE} characters, one line"}
                )
        if evidence_url is not None and not _is_url(evidence_url):
            errors.append({"field": "--evidence-url", "message": "an http(s) URL, at most 2000 characters"})
        if errors:
            raise InvalidRequest(errors, hint="nothing was changed")
        return cls(
            verdict=v,
            note=text,
            reason=reason,
            provider_message_id=provider_message_id.strip() if provider_message_id else None,
            evidence_url=evidence_url,
        )


def _has_control(text: str) -> bool:
    return any(ord(c) < 32 or ord(c) == 127 for c in text)


def _is_url(text: str) -> bool:
    if len(text) > 2000 or _has_control(text) or " " in text:
        return False
    try:
        parts = urlsplit(text)
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname)
