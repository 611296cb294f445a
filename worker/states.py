"""Step states and the transitions between them (docs/design.md, "States and transitions").

The database enforces the same rules with CHECK constraints and guarded UPDATEs;
this module is the vocabulary both the core and the store share.
"""

from __future__ import annotations

from enum import StrEnum


class Status(StrEnum):
    # Stopped at enqueue by the approval policy (worker/approval_policy.py): waits for a person;
    # nothing claims it. Approved: pending, same key and Message-ID; denied or expired: rejected.
    HELD = "held"
    PENDING = "pending"
    IN_FLIGHT = "in_flight"
    RETRYABLE = "retryable"
    UNKNOWN = "unknown"
    ACCEPTED = "accepted"
    REJECTED = "rejected"


CLAIMABLE = frozenset({Status.PENDING, Status.RETRYABLE})
TERMINAL = frozenset({Status.ACCEPTED, Status.REJECTED})

# Which states a step may move to from each state. Anything else is a bug.
TRANSITIONS: dict[Status, frozenset[Status]] = {
    Status.HELD: frozenset({Status.PENDING, Status.REJECTED}),
    Status.PENDING: frozenset({Status.IN_FLIGHT, Status.REJECTED}),
    Status.RETRYABLE: frozenset({Status.IN_FLIGHT, Status.UNKNOWN, Status.REJECTED, Status.ACCEPTED}),
    Status.IN_FLIGHT: frozenset({Status.ACCEPTED, Status.REJECTED, Status.RETRYABLE, Status.UNKNOWN, Status.PENDING}),
    Status.UNKNOWN: frozenset({Status.ACCEPTED, Status.REJECTED, Status.RETRYABLE}),
    Status.ACCEPTED: frozenset(),
    # The one way out of `rejected`: an operator's dead-letter requeue of a step refused only for
    # running out of attempts or retry time (worker/resolution.py REQUEUE_REASONS; the
    # database's step guard, evq_step_guard, lets nothing else reopen a closed step).
    Status.REJECTED: frozenset({Status.RETRYABLE}),
}


class Reason(StrEnum):
    """Machine keys for why a step is where it is (``email_steps.reason``, ``evidence.reason``)."""

    PROVIDER_ACCEPTED = "provider_accepted"
    PROVIDER_REJECTED = "provider_rejected"
    PROVIDER_TEMPORARY = "provider_temporary"  # failed before the provider could have acted
    # The provider refused the session (greeting, HELO name, TLS, AUTH): our settings or
    # its configuration, not the message; retried, and nothing was sent.
    PROVIDER_MISCONFIGURED = "provider_misconfigured"
    # Accepted for some recipients; others were refused (evidence and the step's
    # refused_recipients say which and why; the notify address is told).
    PARTIALLY_REFUSED = "partially_refused"
    POLICY_REFUSED = "policy_refused"  # the adapter's re-check refused the request
    ATTEMPTS_EXHAUSTED = "attempts_exhausted"
    RETRY_BUDGET_EXHAUSTED = "retry_budget_exhausted"  # temporary failures for longer than EVQ_RETRY_FOR
    AMBIGUOUS_RESPONSE = "ambiguous_response"  # the provider may have acted; we cannot tell
    AMBIGUOUS_DEDUPED = "ambiguous_deduped"  # ambiguous, but the provider dedupes our key: safe to retry
    LEASE_EXPIRED = "lease_expired"  # a worker died or stalled while the attempt may have reached the provider
    DEDUPE_WINDOW_CLOSED = "dedupe_window_closed"
    RELEASED = "released"  # claimed, handed back at shutdown before the adapter was called
    LATE_ANSWER = "late_answer"  # settled by a fenced answer that arrived after the rescue
    OPERATOR = "operator"
    RECONCILED = "reconciled"  # the provider, asked by the reconciler, has the message
    RECONCILE_ABSENT = "reconcile_absent"  # evidence only: the provider says it has no such message
    # Approvals (worker/approval_policy.py): held at enqueue, then approved, denied or expired;
    # cancelled by the agent that enqueued it or an operator before it was claimed.
    APPROVAL_REQUIRED = "approval_required"
    APPROVED = "approved"
    DENIED = "denied"
    APPROVAL_EXPIRED = "approval_expired"
    CANCELLED = "cancelled"
    WEBHOOK = "webhook"  # the provider's webhook told of the message (worker/delivery.py): it had it
