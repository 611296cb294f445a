"""Display labels beside machine keys: the contract's ``_key`` / ``_label`` convention.

``status`` (``in_flight``), ``reason`` (``lease_expired``) and a circuit's ``state``
stay the machine keys an agent branches on; every output that shows one also carries
``status_label`` / ``reason_label`` / ``state_label`` (and ``next_action_label``), a short phrase for people
("in flight"). Labels may be reworded in any version: never parse them. A key with no
label here (a reason a newer evq wrote) is shown as itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from evq.worker.circuit import CONSECUTIVE_FAILURES, PROBE_INCONCLUSIVE, CircuitState
from evq.worker.states import Reason, Status

STATUS_LABELS: dict[str, str] = {
    Status.HELD: "held: waiting for a person's approval",
    Status.PENDING: "waiting to be sent",
    Status.IN_FLIGHT: "in flight",
    Status.RETRYABLE: "waiting to be retried",
    Status.UNKNOWN: "outcome unknown: needs an operator's verdict",
    Status.ACCEPTED: "accepted by the provider",
    Status.REJECTED: "rejected: not sent",
}

REASON_LABELS: dict[str, str] = {
    Reason.PROVIDER_ACCEPTED: "the provider accepted it",
    Reason.PROVIDER_REJECTED: "the provider refused it for good",
    Reason.PROVIDER_TEMPORARY: "the provider failed temporarily, before it could act",
    Reason.PROVIDER_MISCONFIGURED: "the provider refused the session (settings or credentials)",
    Reason.PARTIALLY_REFUSED: "accepted for some recipients, refused for others",
    Reason.POLICY_REFUSED: "refused by evq's sending policy",
    Reason.ATTEMPTS_EXHAUSTED: "out of attempts",
    Reason.RETRY_BUDGET_EXHAUSTED: "failed temporarily for longer than the retry time",
    Reason.AMBIGUOUS_RESPONSE: "the provider may have sent it: its answer was lost or unclear",
    Reason.AMBIGUOUS_DEDUPED: "answer lost, but the provider dedupes the retry",
    Reason.LEASE_EXPIRED: "the worker stopped mid-send: it may have been sent",
    Reason.DEDUPE_WINDOW_CLOSED: "the provider's dedupe window closed before a retry",
    Reason.RELEASED: "handed back unsent at shutdown",
    Reason.LATE_ANSWER: "settled by an answer that arrived late",
    Reason.OPERATOR: "closed by an operator",
    Reason.RECONCILED: "the provider confirmed it has the message",
    Reason.RECONCILE_ABSENT: "the provider says it has no such message",
    Reason.WEBHOOK: "the provider's webhook told of the message: it had it",
    Reason.APPROVAL_REQUIRED: "held by the approval policy",
    Reason.APPROVED: "approved by a person",
    Reason.DENIED: "denied by a person: not sent",
    Reason.APPROVAL_EXPIRED: "nobody approved it in time: not sent",
    Reason.CANCELLED: "cancelled before it was sent",
    # A circuit's reasons (worker/circuit.py): its faults, or why no single fault said so.
    "connection_refused": "nothing answers at the provider's address",
    "tls_failed": "TLS failed (handshake or certificate)",
    "auth_failed": "the provider refused the credentials",
    "forbidden": "the provider's key may not send",
    "starttls_required": "the server requires TLS evq's settings do not use",
    "greeting_refused": "the SMTP server refused the session at its greeting",
    CONSECUTIVE_FAILURES: "too many consecutive temporary failures",
    PROBE_INCONCLUSIVE: "the probe's answer was lost",
}

STATE_LABELS: dict[str, str] = {
    CircuitState.CLOSED: "sending",
    CircuitState.HALF_OPEN: "one probe out",
    CircuitState.OPEN: "held: nothing sent until a probe gets through",
}


# What worker/verdict.py's next_action asks, for people (the machine key is what agents branch on).
NEXT_ACTION_LABELS: dict[str, str] = {
    "wait": "wait: evq is still on it; never resend",
    "wait_for_approval": "waiting for a person's approval; never resend",
    "ask_operator": "ask an operator: nobody can tell whether it was sent; never resend",
    "none": "nothing to do",
    "fix_and_resend": "fix the message, then send it as a new step",
    "resend": "nothing was sent: it may be sent again as a new step",
}


def label(labels: Mapping[str, str], key: str | None) -> str | None:
    return None if key is None else labels.get(key, key)


def with_labels(row: Mapping[str, Any]) -> dict[str, Any]:
    """``row`` with a label after each machine key it has (status, reason, state)."""
    out = dict(row)
    for key, labels in (
        ("status", STATUS_LABELS),
        ("reason", REASON_LABELS),
        ("state", STATE_LABELS),
        ("next_action", NEXT_ACTION_LABELS),
    ):
        if key in row:
            out[key + "_label"] = label(labels, None if row[key] is None else str(row[key]))
    return out
