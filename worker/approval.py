"""The approval policy: which sends may go out on their own and which wait for a person,
and the blast-radius budgets that cap how much an agent can send (docs/design.md,
"Approvals and budgets").

A policy is configuration (EVQ_APPROVAL_*, EVQ_BUDGET_*; ops/settings.py builds it), carried
by :class:`~evq.worker.request.Policy` to every enqueue path. The rules that need no database
are decided here, without I/O (:func:`static_holds`); first contact and budgets need the
store's rows and are decided in the enqueue's own transaction (the store applies
:func:`budget_charges` and the recipients' :func:`contact_keys`). A send any rule stops is
written ``held`` with the reasons as evidence, before anything could claim it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, time, timedelta
from enum import StrEnum
from typing import Any
from zoneinfo import ZoneInfo


class HoldRule(StrEnum):
    """Why a send was held (``email_steps.hold`` and the ``held`` evidence name these)."""

    ALWAYS = "always"  # EVQ_APPROVAL_ALWAYS: every send waits for a person
    REQUESTED = "requested"  # the agent asked for it (request field require_approval)
    FIRST_CONTACT = "first_contact"  # a recipient this sender was never allowed to mail
    FIRST_CONTACT_DOMAIN = "first_contact_domain"  # a recipient domain this sender never mailed
    TOO_MANY_RECIPIENTS = "too_many_recipients"  # more than EVQ_APPROVAL_MAX_RECIPIENTS
    OUTSIDE_HOURS = "outside_hours"  # outside EVQ_APPROVAL_HOURS in EVQ_APPROVAL_TIMEZONE
    BUDGET = "budget"  # over a blast-radius budget (which one: the hold's ``budgets``)


class FirstContact(StrEnum):
    OFF = "off"
    ADDRESS = "address"  # hold a send to any address the sender never mailed
    DOMAIN = "domain"  # hold a send to any domain the sender never mailed


class Budget(StrEnum):
    """The blast-radius caps, each counted in recipients (to, cc and bcc)."""

    RUN_RECIPIENTS = "run_recipients"  # per run, over its whole life
    KEY_HOURLY = "key_hourly"  # per API key (the actor), per clock hour
    KEY_DAILY = "key_daily"  # per API key, per UTC day
    DOMAIN_HOURLY = "domain_hourly"  # per recipient domain, per clock hour


class OverBudget(StrEnum):
    HOLD = "hold"  # a send over a cap waits for a person (an approval is not counted against it)
    REFUSE = "refuse"  # refused at enqueue (E_BUDGET), written as a refused enqueue


# Request priorities, as the column stores them (higher is claimed first).
PRIORITIES = {"high": 1, "normal": 0, "low": -1}


@dataclass(frozen=True, slots=True)
class Hours:
    """Allowed sending hours (``08:00-18:00``) on allowed weekdays (0 Monday .. 6 Sunday), in
    one time zone. ``start > end`` spans midnight (``22:00-06:00``)."""

    start: time
    end: time
    timezone: str = "UTC"
    weekdays: tuple[int, ...] = (0, 1, 2, 3, 4, 5, 6)

    def allows(self, when: datetime) -> bool:
        local = when.astimezone(ZoneInfo(self.timezone))
        if local.weekday() not in self.weekdays:
            return False
        now = local.time().replace(tzinfo=None)
        if self.start <= self.end:
            return self.start <= now < self.end
        return now >= self.start or now < self.end


@dataclass(frozen=True, slots=True)
class ApprovalPolicy:
    always: bool = False
    first_contact: FirstContact = FirstContact.OFF
    max_recipients: int | None = None  # hold a send to more than this many recipients
    hours: Hours | None = None
    expires_after: timedelta | None = timedelta(days=3)  # a held send's lifetime (None: never)
    budgets: tuple[tuple[Budget, int], ...] = ()  # (budget, cap in recipients)
    over_budget: OverBudget = OverBudget.HOLD

    @property
    def active(self) -> bool:
        """Whether any rule could hold a send (the enqueue skips every check otherwise;
        ``require_approval`` on a request holds it whatever the policy)."""
        return bool(
            self.always
            or self.first_contact is not FirstContact.OFF
            or self.max_recipients is not None
            or self.hours is not None
            or self.budgets
        )

    def describe(self) -> dict[str, Any]:
        """The policy as `evq policy show` and `evq schema` print it."""
        return {
            "always": self.always,
            "first_contact": self.first_contact.value,
            "max_recipients": self.max_recipients,
            "hours": None
            if self.hours is None
            else {
                "start": self.hours.start.strftime("%H:%M"),
                "end": self.hours.end.strftime("%H:%M"),
                "timezone": self.hours.timezone,
                "weekdays": list(self.hours.weekdays),
            },
            "expires_after_seconds": None if self.expires_after is None else self.expires_after.total_seconds(),
            "budgets": [{"budget": b.value, "cap": cap} for b, cap in self.budgets],
            "over_budget": self.over_budget.value,
        }


def static_holds(policy: ApprovalPolicy, *, recipients: int, now: datetime, requested: bool) -> list[dict[str, Any]]:
    """The rules that need no database, each as ``{"rule": ..., "why": ...}``, in a fixed order."""
    holds: list[dict[str, Any]] = []
    if policy.always:
        holds.append({"rule": HoldRule.ALWAYS.value, "why": "every send waits for approval (EVQ_APPROVAL_ALWAYS)"})
    if requested:
        holds.append({"rule": HoldRule.REQUESTED.value, "why": "the request asked for approval"})
    if policy.max_recipients is not None and recipients > policy.max_recipients:
        holds.append(
            {
                "rule": HoldRule.TOO_MANY_RECIPIENTS.value,
                "why": f"{recipients} recipients, more than {policy.max_recipients} (EVQ_APPROVAL_MAX_RECIPIENTS)",
            }
        )
    if policy.hours is not None and not policy.hours.allows(now):
        holds.append(
            {"rule": HoldRule.OUTSIDE_HOURS.value, "why": "outside the allowed sending hours (EVQ_APPROVAL_HOURS)"}
        )
    return holds


def recipient_domain(address: str) -> str:
    return address.rsplit("@", 1)[1].lower()


def contact_keys(policy: ApprovalPolicy, recipients: Sequence[str]) -> list[str]:
    """What the first-contact rule looks up in ``known_recipients`` for these recipients, sorted
    and unique: each address (lowercased), or each ``@domain``; none when the rule is off."""
    if policy.first_contact is FirstContact.ADDRESS:
        return sorted({r.lower() for r in recipients})
    if policy.first_contact is FirstContact.DOMAIN:
        return sorted({"@" + recipient_domain(r) for r in recipients})
    return []


def budget_charges(
    policy: ApprovalPolicy, *, run_id: str, actor: str | None, recipients: Sequence[str], now: datetime
) -> list[tuple[str, str, datetime, int, int]]:
    """The counters one send charges: ``(budget, scope, window_start, amount, cap)``, sorted, so
    every enqueue takes the counters' row locks in the same order (no deadlock between two).
    A key budget without an actor (a Python API enqueue that named none) counts under ``""``."""
    hour = now.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    day = hour.replace(hour=0)
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    charges: list[tuple[str, str, datetime, int, int]] = []
    for budget, cap in policy.budgets:
        if budget is Budget.RUN_RECIPIENTS:
            charges.append((budget.value, run_id, epoch, len(recipients), cap))
        elif budget is Budget.KEY_HOURLY:
            charges.append((budget.value, actor or "", hour, len(recipients), cap))
        elif budget is Budget.KEY_DAILY:
            charges.append((budget.value, actor or "", day, len(recipients), cap))
        elif budget is Budget.DOMAIN_HOURLY:
            per_domain: dict[str, int] = {}
            for r in recipients:
                per_domain[recipient_domain(r)] = per_domain.get(recipient_domain(r), 0) + 1
            charges += [(budget.value, d, hour, n, cap) for d, n in per_domain.items()]
    return sorted(charges)
