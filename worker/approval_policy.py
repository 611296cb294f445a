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
from dataclasses import dataclass, replace
from datetime import UTC, datetime, time, timedelta
from enum import StrEnum
from typing import Any
from zoneinfo import ZoneInfo


class HoldRule(StrEnum):
    """Why a send was held (``email_steps.hold`` and the ``held`` evidence name these)."""

    ALWAYS = "always"  # every send waits for a person: EVQ_APPROVAL_ALWAYS, or the key's approval (``key``)
    REQUESTED = "requested"  # the agent asked for it (request field require_approval)
    FIRST_CONTACT = "first_contact"  # a recipient this sender was never allowed to mail
    FIRST_CONTACT_DOMAIN = "first_contact_domain"  # a recipient domain this sender never mailed
    TOO_MANY_RECIPIENTS = "too_many_recipients"  # more than EVQ_APPROVAL_MAX_RECIPIENTS
    OUTSIDE_HOURS = "outside_hours"  # outside EVQ_APPROVAL_HOURS in EVQ_APPROVAL_TIMEZONE
    BUDGET = "budget"  # over a blast-radius budget (which one: the hold's ``budgets``)


class KeyApproval(StrEnum):
    """Whether an API key's sends wait for a person (``api_keys.approval``, migration 0030): the
    admin's word per key, read with the key at every call, so it holds on every interface that
    enqueues with a key (CLI, HTTP, MCP, the Python API given ``api_key=``)."""

    ALWAYS = "always"  # every send by the key is held (an agent key's default)
    POLICY = "policy"  # the installation's rules (EVQ_APPROVAL_*, EVQ_BUDGET_*): operator and admin keys' default
    # No rule asks for a person (EVQ_APPROVAL_*: always, first contact, recipients, hours). Two
    # things still hold: the agent's own require_approval (it asked for a person), and the
    # budgets, which cap the blast radius rather than review a send (over one: held or refused,
    # as EVQ_BUDGET_ACTION says). Unattended means unreviewed, not unlimited.
    NEVER = "never"


def key_approval(actor: Any) -> KeyApproval:
    """The approval of the key behind ``actor`` (worker/request.py's Actor). No actor, or one
    without a key (the Python API without ``api_key=``): ``policy``, the installation's rules.
    A key whose approval nobody read (an actor stamped without it) fails closed: ``always``."""
    if actor is None or actor.key_id is None:
        return KeyApproval.POLICY
    return KeyApproval(actor.approval) if actor.approval else KeyApproval.ALWAYS


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


# How long each windowed budget's window lasts (a run's has one window, for good): `evq prune`
# deletes a counter once its window ended before the cutoff. Seconds, never a calendar day,
# which a time zone's clock change makes 23 or 25 hours long.
WINDOW_SECONDS: dict[Budget, float] = {
    Budget.KEY_HOURLY: 3600.0,
    Budget.KEY_DAILY: 86400.0,
    Budget.DOMAIN_HOURLY: 3600.0,
}


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
    # Set only in the policy one send is judged by (:func:`applied`): the name of the API key
    # whose approval is ``always`` (holds every send of it). Never part of the settings.
    key_always: str | None = None

    @property
    def active(self) -> bool:
        """Whether any rule could hold a send (the enqueue skips every check otherwise;
        ``require_approval`` on a request holds it whatever the policy)."""
        return bool(
            self.always
            or self.key_always is not None
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


def applied(policy: ApprovalPolicy, request: Any) -> ApprovalPolicy:
    """The policy one request (ValidRequest) is judged by: the installation's, as its API key's
    approval (:func:`key_approval`) bends it. ``always`` adds a hold of every send; ``never``
    turns off every rule that asks a person to look, keeping the budgets (and the request's own
    require_approval, which static_holds reads from the request); ``policy`` is the installation's.
    Every enqueue path (gated_op, preview_op, the memory store) judges through this one rule."""
    actor = request.actor
    match key_approval(actor):
        case KeyApproval.ALWAYS:
            return replace(policy, key_always=actor.name or actor.key_id)
        case KeyApproval.NEVER:
            return replace(policy, always=False, first_contact=FirstContact.OFF, max_recipients=None, hours=None)
    return policy


def static_holds(policy: ApprovalPolicy, *, recipients: int, now: datetime, requested: bool) -> list[dict[str, Any]]:
    """The rules that need no database, each as ``{"rule": ..., "why": ...}``, in a fixed order."""
    holds: list[dict[str, Any]] = []
    if policy.key_always is not None:
        # The rule "always" (every send waits), from the key rather than the settings: ``key``
        # says which (an added field, so the hold's enumeration of rules is unchanged).
        holds.append(
            {
                "rule": HoldRule.ALWAYS.value,
                "key": policy.key_always,
                "why": f"every send by API key {policy.key_always!r} waits for a person (the key's approval is "
                f"always; an admin changes it with `evq keys update {policy.key_always} --approval policy|never`)",
            }
        )
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


def going_out(at: datetime, send_at: datetime | None) -> datetime:
    """When a send would go out: now, or its ``send_at``. The hours rule and the hourly and daily
    budgets judge this time, not the enqueue's (else a day's sends scheduled for one hour would
    all pass an hourly cap)."""
    return max(at, send_at) if send_at is not None else at


def contacts(recipients: Sequence[str], notify: str | None) -> list[str]:
    """Whom evq would mail on a request's word: its recipients and its ``notify`` address."""
    return [*recipients, notify] if notify else list(recipients)


def recipient_domain(address: str) -> str:
    return address.rsplit("@", 1)[1].lower()


def contact_keys(policy: ApprovalPolicy, recipients: Sequence[str]) -> list[str]:
    """What the first-contact rule looks up in ``known_recipients`` for these recipients, sorted
    and unique: each address (lowercased), or each ``@domain``; none when the rule is off.
    Callers pass the request's ``notify`` address among them: evq mails it (a failure notice,
    a denial, an expiry) on the request's word, so a stranger there is a first contact too."""
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


def batch_counters(
    policy: ApprovalPolicy, requests: Sequence[Any], *, now: datetime
) -> list[tuple[str, str, datetime]]:
    """Every counter a batch of requests (ValidRequest) may charge, ``(budget, scope, window_start)``,
    sorted: a batch takes all their row locks first, in this order (budget_lock), so two batches
    never wait on each other in a cycle. ``now`` is the batch's clock."""
    return sorted(
        {
            (budget, scope, window)
            for r in requests
            for budget, scope, window, _amount, _cap in budget_charges(
                policy,
                run_id=r.run_id,
                actor=r.actor.name if r.actor else None,
                recipients=r.recipients,
                now=going_out(now, r.send_at),
            )
        }
    )


# -- settings (ops/settings.py reads them with every other option) --------------------------

_WEEKDAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")


def hours_range(value: str) -> tuple[time, time]:
    """``08:00-18:00`` (``22:00-06:00`` spans midnight)."""
    try:
        start, end = (time.fromisoformat(part.strip()) for part in value.split("-"))
    except ValueError:
        raise ValueError("expected HH:MM-HH:MM, e.g. 08:00-18:00") from None
    if start.tzinfo is not None or end.tzinfo is not None:
        # A time with an offset cannot be compared with the local wall-clock times the rule reads.
        raise ValueError("no offset in the hours: give the zone as EVQ_APPROVAL_TIMEZONE (e.g. Europe/Berlin)")
    if start == end:
        raise ValueError("the start and the end are the same time: no hour would be allowed")
    return start, end


_FULL_WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")


def _weekday(name: str) -> int:
    """``mon`` or ``monday`` (any case) -> 0; anything else (``monkey``) is refused."""
    name = name.strip().lower()
    if name in _WEEKDAYS:
        return _WEEKDAYS.index(name)
    return _FULL_WEEKDAYS.index(name)


def weekday_list(value: str) -> tuple[int, ...]:
    """``mon-fri``, ``sat,sun`` or ``mon-wed,fri`` as weekday numbers (0 Monday .. 6 Sunday)."""
    days: set[int] = set()
    for part in (p.strip().lower() for p in value.split(",")):
        if not part:
            continue
        first, _, last = part.partition("-")
        try:
            a, b = _weekday(first), _weekday(last or first)
        except ValueError:
            raise ValueError(f"expected weekdays like mon-fri or sat,sun, got {part!r}") from None
        days.update(range(a, b + 1) if a <= b else [*range(a, 7), *range(b + 1)])
    if not days:
        raise ValueError("name at least one weekday")
    return tuple(sorted(days))


def time_zone(value: str) -> str:
    name = value.strip()
    try:
        ZoneInfo(name)
    except (ValueError, KeyError):  # ZoneInfoNotFoundError is a KeyError
        raise ValueError(f"not an IANA time zone: {name!r} (e.g. Europe/Berlin, UTC)") from None
    return name


def duration_or_never(value: str) -> float | None:
    """A duration (``72h``, ``3d``, seconds), or ``never``."""
    from evq.worker.options import duration

    if value.strip().lower() == "never":
        return None
    try:
        seconds = duration(value)
    except ValueError:
        raise ValueError("expected a duration like 72h or 3d (or seconds), or never") from None
    if seconds <= 0:
        raise ValueError("must be a positive duration, or never")
    return seconds


def _lower(value: str) -> str:
    return value.strip().lower()


def approval_options() -> tuple[Any, ...]:
    """The EVQ_APPROVAL_* and EVQ_BUDGET_* options (worker/options.py's Option)."""
    from evq.worker.options import Option, boolean

    return (
        Option(
            "approval_always",
            boolean,
            False,
            "Hold every send for a person's approval (`evq steps approve`), the Python API's without a key too; "
            "a key whose approval is never is not held by it (an agent key holds every send by default).",
        ),
        Option(
            "approval_first_contact",
            _lower,
            "off",
            "Hold a send to a recipient (address) or a recipient domain (domain) its sender never mailed "
            "without a hold before: off, address or domain.",
            choices=tuple(f.value for f in FirstContact),
        ),
        Option(
            "approval_max_recipients",
            int,
            None,
            "Hold a send to more than this many recipients (to + cc + bcc); unset: no such hold.",
            minimum=1,
        ),
        Option(
            "approval_hours",
            hours_range,
            None,
            "Allowed sending hours, HH:MM-HH:MM (22:00-06:00 spans midnight) in EVQ_APPROVAL_TIMEZONE; a send "
            "enqueued (or scheduled, send_at) outside them is held. Unset: any hour.",
        ),
        Option(
            "approval_weekdays",
            weekday_list,
            None,
            "Allowed sending weekdays, e.g. mon-fri or mon,wed,fri; a send outside them is held. Unset: every day.",
        ),
        Option("approval_timezone", time_zone, "UTC", "IANA time zone of the allowed hours and weekdays."),
        Option(
            "approval_expires",
            duration_or_never,
            3 * 86400.0,
            "How long a held send waits for a decision before it is rejected (approval_expired): a duration "
            "(72h, 3d) or never.",
        ),
        Option(
            "budget_run_recipients",
            int,
            None,
            "Most recipients one run may send to over its whole life; unset: no cap.",
            minimum=1,
        ),
        Option("budget_key_hourly", int, None, "Most recipients per API key per clock hour; unset: no cap.", minimum=1),
        Option("budget_key_daily", int, None, "Most recipients per API key per UTC day; unset: no cap.", minimum=1),
        Option(
            "budget_domain_hourly",
            int,
            None,
            "Most recipients per recipient domain per clock hour; unset: no cap.",
            minimum=1,
        ),
        Option(
            "budget_action",
            _lower,
            "hold",
            "What a send over a budget gets: hold (waits for a person) or refuse (E_BUDGET, exit 2).",
            choices=tuple(o.value for o in OverBudget),
        ),
    )


def policy_from(
    *,
    always: bool = False,
    first_contact: str = "off",
    max_recipients: int | None = None,
    hours: tuple[time, time] | None = None,
    weekdays: tuple[int, ...] | None = None,
    timezone: str = "UTC",
    expires: float | None = 3 * 86400.0,
    run_recipients: int | None = None,
    key_hourly: int | None = None,
    key_daily: int | None = None,
    domain_hourly: int | None = None,
    over_budget: str = "hold",
) -> ApprovalPolicy:
    """The policy the settings describe. Weekdays without hours allow the whole of each day."""
    window = None
    if hours is not None or weekdays is not None:
        start, end = hours if hours is not None else (time(0, 0), time.max)
        window = Hours(start=start, end=end, timezone=timezone, weekdays=weekdays or tuple(range(7)))
    caps = (
        (Budget.RUN_RECIPIENTS, run_recipients),
        (Budget.KEY_HOURLY, key_hourly),
        (Budget.KEY_DAILY, key_daily),
        (Budget.DOMAIN_HOURLY, domain_hourly),
    )
    return ApprovalPolicy(
        always=always,
        first_contact=FirstContact(first_contact),
        max_recipients=max_recipients,
        hours=window,
        expires_after=None if expires is None else timedelta(seconds=expires),
        budgets=tuple((b, cap) for b, cap in caps if cap is not None),
        over_budget=OverBudget(over_budget),
    )


def sender_of(payload: dict[str, Any]) -> str:
    """Whose memory the first-contact rule reads: the sender's address, lowercased."""
    return str(payload["from"]["email"]).lower()


def budget_hold(charge: tuple[str, str, datetime, int, int], used: int) -> dict[str, Any]:
    """The hold (or refusal) a counter that would pass its cap makes."""
    budget, scope, _window, amount, cap = charge
    return {
        "rule": HoldRule.BUDGET.value,
        "budget": budget,
        "scope": scope,
        "cap": cap,
        "used": used,
        "why": f"{amount} more recipients would pass the {budget} budget of {scope or 'this caller'!s} "
        f"({used} of {cap} used)",
    }


def contact_holds(policy: ApprovalPolicy, keys: Sequence[str], known: Sequence[str]) -> list[dict[str, Any]]:
    """The first-contact hold for the keys not in ``known`` (none when every one is)."""
    new = [k for k in keys if k not in set(known)]
    if not new:
        return []
    if policy.first_contact is FirstContact.DOMAIN:
        return [
            {
                "rule": HoldRule.FIRST_CONTACT_DOMAIN.value,
                "recipients": new,
                "why": f"this sender never mailed {', '.join(new)} (EVQ_APPROVAL_FIRST_CONTACT=domain)",
            }
        ]
    return [
        {
            "rule": HoldRule.FIRST_CONTACT.value,
            "recipients": new,
            "why": f"this sender never mailed {', '.join(new)} (EVQ_APPROVAL_FIRST_CONTACT=address)",
        }
    ]


def gated(policy: ApprovalPolicy, requests: Sequence[Any]) -> bool:
    """Whether the policy must look at these requests (ValidRequests): its rules are on, one
    asks for a person, or one's key holds every send. Otherwise an enqueue is the one statement
    it always was (a key at ``policy`` or ``never`` under no rule costs nothing more)."""
    return policy.active or any(r.require_approval or key_approval(r.actor) is KeyApproval.ALWAYS for r in requests)


def budget_refusal(over: dict[str, Any]) -> Exception:
    """The E_BUDGET refusal of a send over ``over``'s budget (EVQ_BUDGET_ACTION=refuse)."""
    from evq.worker.errors import BudgetExceeded

    return BudgetExceeded(
        [{"field": f"budget.{over['budget']}", "message": over["why"]}],
        hint="`evq policy show` shows each budget's use; wait for its window to pass, or ask an operator; "
        "nothing was written",
    )


def memory_keys(recipients: Sequence[str]) -> list[str]:
    """What a send that was not held teaches ``known_recipients``: each address (lowercased)
    and each ``@domain``, whichever first-contact mode is on, so switching the mode (or turning
    it on later) keeps what the gated enqueues before it learnt."""
    return sorted({r.lower() for r in recipients} | {"@" + recipient_domain(r) for r in recipients})
