"""The expiry of held sends (issue 17): a background pass every worker runs.

A held send nobody approved before ``hold_expires_at`` is closed ``rejected`` (reason
``approval_expired``) with ``hold_expired`` evidence, and its ``notify`` is told (if its sender
is known to mail it: notice_candidates in adapters/postgres/queries.sql), so an
agent waiting on it learns it will not go out. The statement takes a batch at a time
with SKIP LOCKED: several workers never close a row twice, and a row an approver holds
is left to them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from evq.worker.errors import ConfigError, Forbidden, InvalidRequest, StateConflict
from evq.worker.ports import Edit, ExpireStore
from evq.worker.request import REQUEST_FIELDS, Policy, parse
from evq.worker.states import Status


@dataclass(frozen=True, slots=True)
class ExpirerConfig:
    interval: float = 15.0
    batch: int = 500

    def validate(self) -> ExpirerConfig:
        if self.interval <= 0 or self.batch < 1:
            raise ConfigError(f"invalid expirer config: {self}")
        return self


class HoldExpirer:
    name = "hold-expirer"

    def __init__(self, store: ExpireStore, config: ExpirerConfig = ExpirerConfig(), *, actor: str = "expirer"):
        self.store = store
        self.config = config.validate()
        self.interval = config.interval
        self.actor = actor

    async def run_once(self, now: datetime | None = None) -> int:
        """Every held send due to expire now, a batch at a time; how many were closed."""
        total = 0
        while True:
            n = await self.store.expire_held(limit=self.config.batch, actor=self.actor, now=now)
            total += n
            if n < self.config.batch:
                return total


def not_held(step_id: int, row: Mapping[str, Any], what: str) -> StateConflict:
    """The answer when the step is not held any more (someone decided first) or never was."""
    return StateConflict(
        f"step {step_id} is {row['current_status']}, not held: only a held send can be {what}",
        hint=f"`evq steps show {step_id}` shows who changed it and when",
        context={"id": step_id, "status": row["current_status"], "reason": row["current_reason"]},
    )


def self_approval(step_id: int, name: str) -> Forbidden:
    """The answer when the key that enqueued a held send asks to approve it (a second person
    decides): ops/app/approvals.py's rule, and the store's ``step_approve`` again."""
    return Forbidden(
        f"the API key {name!r} enqueued step {step_id}: a send is approved by someone other than who asked for it",
        hint="ask another operator to approve it (the ops page's held queue, `evq steps approve`)",
        context={"name": name, "step_id": step_id},
    )


def not_cancellable(step_id: int, row: Mapping[str, Any]) -> StateConflict:
    status = row["current_status"]
    context = {"id": step_id, "status": status, "reason": row["current_reason"]}
    if status == str(Status.IN_FLIGHT):
        return StateConflict(
            f"step {step_id} is in flight: a worker is sending it; it cannot be cancelled",
            hint=f"`evq steps show {step_id}` shows how the attempt ends",
            context=context,
        )
    if status in (str(Status.UNKNOWN), str(Status.RETRYABLE)):
        # retryable here: an earlier attempt may have been delivered (maybe_delivered).
        return StateConflict(
            f"step {step_id} is {status} and may already have been delivered: it cannot be cancelled",
            hint=f"an operator checks and closes it: `evq steps resolve {step_id} --as rejected --note ...`",
            context=context,
        )
    return StateConflict(
        f"step {step_id} is {status}: only a held, pending or retryable send can be cancelled",
        hint=f"`evq steps show {step_id}` shows who changed it and when",
        context=context,
    )


# What an approver may correct: the message's words, never who it goes to or from (a
# different recipient is a different send, and would pass no first-contact rule).
EDITABLE = ("subject", "text", "html")
# ...and the one instruction that is not a word: drop the HTML part (an empty html does too).
DROP_HTML = "drop_html"


def edited(
    payload: Mapping[str, Any],
    provider: str,
    edits: Mapping[str, Any],
    policy: Policy | None = None,
    *,
    from_sha256: str,
) -> Edit | None:
    """The approver's correction of a held step's ``payload`` as a new payload, validated by
    worker/request.py's ``parse`` with the rules of an enqueue (``policy``: the installation's;
    its providers and provenance rules were checked at enqueue and are not asked again). None:
    the edits change nothing. ``from_sha256``: the stored hash the correction replaces.
    InvalidRequest names every bad field, as an enqueue would.

    ``edits`` holds ``subject``, ``text``, ``html`` (an empty one removes that part) and
    ``drop_html`` (true: remove the HTML part). A correction that changes the text of a send
    with an HTML part must say what becomes of the HTML, by giving ``html`` (corrected, or the
    same to keep it) or ``drop_html``: most mail clients show the HTML part, so a corrected text
    beside the agent's HTML is a correction nobody sees (issue 29)."""
    unknown = [k for k in edits if k not in (*EDITABLE, DROP_HTML)]
    if unknown:
        raise InvalidRequest(
            [
                {"field": k[:100], "message": f"only {', '.join(EDITABLE)} can be corrected (or {DROP_HTML})"}
                for k in unknown
            ]
        )
    drop = edits.get(DROP_HTML, False)
    if not isinstance(drop, bool):
        raise InvalidRequest([{"field": DROP_HTML, "message": "true or false"}])
    words = {k: v for k, v in edits.items() if k in EDITABLE}
    if drop:
        if words.get("html"):
            raise InvalidRequest(
                [{"field": "html", "message": f"a corrected html and {DROP_HTML} say opposite things: give one"}]
            )
        words["html"] = ""
    request = {k: v for k, v in payload.items() if k in REQUEST_FIELDS and v is not None}
    request.update({k: (v if v != "" else None) for k, v in words.items()})
    request = {k: v for k, v in request.items() if v is not None}
    request.update(run_id="approval", step_id="approval", provider=provider)
    base = policy or Policy()
    # The addresses were validated at enqueue (special-use domains included); the correction
    # does not touch them, so they are not refused for a domain the policy knew then.
    domains = tuple(
        a["email"].rsplit("@", 1)[1] for key in ("to", "cc", "bcc", "reply_to") for a in payload.get(key) or ()
    ) + ((payload["from"]["email"].rsplit("@", 1)[1],) if payload.get("from") else ())
    rules = replace(
        base,
        providers=(provider,),
        default_provider=provider,
        reserved_senders=(),
        require_provenance=(),
        internal_domains=(*base.internal_domains, *domains),
    )
    valid = parse(request, rules)
    fields = tuple(k for k in EDITABLE if valid.payload.get(k) != payload.get(k))
    if "text" in fields and payload.get("html") and "html" not in words:
        raise InvalidRequest(
            [
                {
                    "field": "html",
                    "message": "the text is corrected but the HTML part, which most mail clients show, "
                    f"would go out as the agent wrote it: give the corrected html too, or {DROP_HTML}",
                }
            ]
        )
    if not fields:
        return None
    return Edit(
        payload=valid.payload,
        payload_json=valid.payload_json,
        payload_sha256=valid.payload_sha256,
        from_sha256=from_sha256,
        fields=fields,
    )
