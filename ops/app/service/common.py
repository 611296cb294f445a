"""What every operation of the application layer shares: the caller (:class:`Caller`, whose key
and role it is), the answer (:class:`Reply`), the send request's field table and the list filters
every interface describes, and the JSON spelling of a field error."""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from evq.ops.app.labels import NEXT_ACTION_LABELS, label
from evq.worker.errors import (
    AuthFailed,
    BudgetExceeded,
    Forbidden,
    InvalidRequest,
    Unresolvable,
)
from evq.worker.keys import ALLOWED, CLI_KEY_SOURCE, Identity, Permission, authenticate, authorize
from evq.worker.ports import COUNT_CAP, SUBJECT_SCAN_CAP, KeyLookup
from evq.worker.search import SEARCH_MAX, SUBJECT_MAX
from evq.worker.verdict import verdict

# The request's fields as every interface describes them: (field, repeatable, description).
REQUEST_FIELDS: tuple[tuple[str, bool, str], ...] = (
    ("run_id", False, "The agent run this send belongs to (required)."),
    ("step_id", False, "The step within the run; unique per run (required)."),
    ("to", True, "Recipient, 'addr' or 'Name <addr>'; repeat for more (at least one)."),
    ("cc", True, "Cc recipient; repeatable."),
    ("bcc", True, "Bcc recipient (envelope only); repeatable."),
    ("from", False, "Sender (default: EVQ_DEFAULT_FROM)."),
    ("reply_to", True, "Reply-To address; repeatable."),
    ("subject", False, "Subject line (one line)."),
    ("text", False, "Plain-text body."),
    ("html", False, "HTML body."),
    ("intent", False, "What the agent meant to achieve by this send."),
    ("notify", False, "Address told if the send ends rejected."),
    ("idempotency_key", False, "Key for this send (default: RUN_ID:STEP_ID)."),
    ("provider", False, "Adapter to send through (default: the first of EVQ_ADAPTER)."),
)
DECISION_FIELDS: tuple[tuple[str, str], ...] = (
    ("instruction_version", "Version of the instructions the agent followed."),
    ("prompt_version", "Version of the prompt."),
    ("model", "Model that made the decision."),
    ("tool", "Tool the agent chose."),
    ("rationale", "Why: short text, or a JSON object."),
    ("decided_at", "When the agent decided (ISO 8601 with zone)."),
)
HEADERS_HELP = "Allowed header (In-Reply-To, References, ...); repeatable."
MAX_ATTEMPTS_HELP = "Attempts for this step (default: 1000, a backstop: EVQ_RETRY_FOR decides first)."
REQUIRE_APPROVAL_HELP = (
    "Hold this send until a person approves it (status held; `evq steps approve`), whatever the policy."
)
SEND_AT_HELP = (
    "Send no earlier than this instant: ISO 8601 with an offset (2026-05-01T09:00:00+02:00), at most 365 "
    "days ahead; a past one is now."
)
PRIORITY_HELP = "high, normal (the default) or low: a higher priority is claimed first (a code before a newsletter)."

# The filters `steps list` and bulk `steps resolve` share: (name, metavar, description).
FILTERS: tuple[tuple[str, str | None, str], ...] = (
    ("run_id", None, "Only this run."),
    ("provider", None, "Only this provider."),
    ("older_than", "30m|2h|3d", "Only rows older than this (unknown rows: since they became unknown)."),
    ("recipient_domain", None, "Only rows with a recipient at this domain."),
    (
        "search",
        "TEXT",
        "Only rows this finds: a step id, a recipient (bob@example.com, or a domain: @example.com or "
        "example.com), a Message-ID (with or without <>), the provider's message id, an idempotency "
        f"key, a run id, or the name of the API key that enqueued it. At most {SEARCH_MAX} characters.",
    ),
    (
        "subject",
        "TEXT",
        "Only rows whose subject contains this, in any case. Reads the newest "
        f"{SUBJECT_SCAN_CAP:,} steps the other filters leave, newest first (meta.subject_scanned: how many "
        f"it read; {SUBJECT_SCAN_CAP:,}: older ones were not searched). At most {SUBJECT_MAX} characters.",
    ),
)
# The filters whose length the service bounds (search_text): the command table states it to
# every interface (the JSON schemas' maxLength, the HTTP query's bound, the CLI's help).
FILTER_MAX_LENGTH: dict[str, int] = {"search": SEARCH_MAX, "subject": SUBJECT_MAX}
# The filters' names: the keyword each interface passes them under (a command's dest).
FILTER_NAMES = tuple(name for name, _, _ in FILTERS)
LIST_LIMIT_MAX = 1000
MAX_ID = 2**63 - 1  # a step id is a bigint; so are LIMIT and OFFSET

_DURATION = re.compile(r"^(\d{1,9})\s*([smhd])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
# Older than a century is older than any row; longer ones would not fit a date (now - 3000 years).
MAX_DURATION = timedelta(days=36500)


@dataclass(frozen=True, slots=True)
class Reply:
    """One operation's answer: the contract's ``data``, ``meta`` (less the duration) and ``status``."""

    data: Any
    meta: dict[str, Any] = field(default_factory=dict)
    status: str = "success"
    created: bool | None = None  # enqueue: whether any step was created (HTTP 201 rather than 200)


class Caller:
    """Who is asking: the key they presented (maybe none) and where they present it.

    ``trusted_reader``: the command line reads without a key (whoever runs it can reach
    the database); the HTTP API and MCP server need one for every call. The verified
    identity is kept for the caller's lifetime (one request, one command), so a call
    that checks twice reads the key once.
    """

    def __init__(
        self,
        key: str | None,
        *,
        source: str = CLI_KEY_SOURCE,
        trusted_reader: bool = False,
        interface: str = "cli",
    ):
        self.key = key or None
        self.source = source
        self.trusted_reader = trusted_reader
        self.interface = interface  # recorded with what the caller enqueues (cli, http, mcp, ops-page)
        self._identity: Identity | None = None

    @classmethod
    def signed_in(cls, identity: Identity, *, source: str, interface: str = "ops-page") -> Caller:
        """A caller whose key was verified earlier (the ops page's session); roles still apply."""
        caller = cls(None, source=source, interface=interface)
        caller._identity = identity
        return caller

    async def verified(self, lookup: KeyLookup) -> Identity | None:
        """The identity behind the key if it is valid (whatever its role); None otherwise. Never raises
        for a bad key: used to name who asked, never to grant anything."""
        if self._identity is not None:
            return self._identity
        if not self.key:
            return None
        try:
            return await authenticate(lookup, self.key, Permission.READ, source=self.source)
        except AuthFailed:
            return None

    async def identify(self, lookup: KeyLookup, permission: Permission) -> Identity | None:
        """The identity allowed to do ``permission``; None for a trusted reader's read. AuthFailed otherwise."""
        if permission is Permission.READ and self.trusted_reader:
            return None
        if self._identity is None:
            self._identity = await authenticate(lookup, self.key, permission, source=self.source)
            return self._identity
        return authorize(self._identity, permission)

    async def content_refusal(self, lookup: KeyLookup) -> str | None:
        """None when this caller may see a message's text and html; otherwise why not.

        A key that is not valid is an error (the caller meant to use it); a valid key
        whose role may not see content, or no key, only withholds the content."""
        if self._identity is None and self.key is None:
            return f"no API key: message content is shown only to keys with role {_CONTENT_ROLES}"
        try:
            await self.identify(lookup, Permission.READ_CONTENT)
        except Forbidden as exc:
            role = (exc.context or {}).get("role", "another role")
            return f"the key's role ({role}) does not see message content; roles {_CONTENT_ROLES} do"
        return None

    async def key_holder(self, lookup: KeyLookup) -> Identity | None:
        """Whose key this is, checked even for a trusted reader (a feed is per key); None:
        a trusted reader without a key. AuthFailed for a wrong key or none where one is needed."""
        if self._identity is None and (self.key is not None or not self.trusted_reader):
            self._identity = await authenticate(lookup, self.key, Permission.READ, source=self.source)
        return self._identity


_CONTENT_ROLES = " or ".join(str(r) for r in ALLOWED[Permission.READ_CONTENT])


def total_meta(total: int) -> dict[str, Any]:
    """A list's total as the contract states it: counted up to COUNT_CAP (docs/design.md,
    "Search"); ``total_exact`` false: more match than ``total`` says."""
    return {"total": min(total, COUNT_CAP), "total_exact": total <= COUNT_CAP}


def page_meta(rows: Sequence[Any], total: int, *, limit: int | None, offset: int) -> dict[str, Any]:
    """What every list's meta says of its page (cli-schema's list_meta): the rows shown, all
    that match (counted up to COUNT_CAP), the page's size and how many were skipped before it."""
    return {"count": len(rows), **total_meta(total), "limit": limit, "offset": offset}


def verdict_view(
    status: str,
    reason: str | None,
    *,
    maybe_delivered: bool,
    provider: str | None,
    unresolvable: Collection[str] | None,
    unknown_since: datetime | None = None,
) -> dict[str, Any]:
    """The ambiguity contract's fields of one step (worker/verdict.py, docs/design.md "The
    ambiguity contract"): ``safe_to_retry``, ``next_action`` and its label. ``unresolvable``: the
    providers whose profile could never settle a lost answer (Policy.unresolvable, from the
    settings: no database round trip); an unknown step through one needs an operator. None: not
    known, so every provider counts as one (an unknown step says ask_operator, never wait)."""
    resolvable = unresolvable is not None and provider not in unresolvable
    unknown_for = None if unknown_since is None else (datetime.now(UTC) - unknown_since).total_seconds()
    v = verdict(str(status), reason, maybe_delivered=maybe_delivered, resolvable=resolvable, unknown_for=unknown_for)
    return {
        "safe_to_retry": v.safe_to_retry,
        "next_action": v.next_action,
        "next_action_label": label(NEXT_ACTION_LABELS, v.next_action),
    }


def json_field_names(exc: InvalidRequest) -> InvalidRequest:
    """The same error with fields named as JSON names them (``--older-than`` -> ``older_than``),
    for the interfaces that take JSON rather than flags."""
    fields = [{**f, "field": _json_name(f["field"])} for f in exc.errors]
    # E_UNRESOLVABLE and E_BUDGET keep their codes; every other field error is E_INVALID_ARG.
    kind = type(exc) if isinstance(exc, (Unresolvable, BudgetExceeded)) else InvalidRequest
    return kind(fields, hint=exc.hint)


def _json_name(name: str) -> str:
    if name.startswith("--"):
        return name[2:].replace("-", "_")
    # STEP_ID's property in every JSON input (ops/app/commands.py).
    return "step_id" if name == "STEP_ID" else name
