"""Approve, deny and cancel (issue 17): what every interface (CLI, HTTP, MCP, the ops page)
does with a held send, or with a send not yet sent.

Each takes a store and a :class:`~ops.app.service.Caller` and answers with a
:class:`~ops.app.service.Reply`; who may do what is decided here, once for every interface:

- approve and deny need an operator or admin key (``Permission.APPROVE``): an agent key is
  refused (E_AUTH_FAILED, exit 4), so an agent can never approve its own send; and the key that
  enqueued a send never approves it, whatever its role (a second person decides; the store's
  statement refuses it too);
- cancel: the key that enqueued the step (its decision's ``actor_key_id``), or an operator
  or admin;
- a note (why) is required to approve or deny, and kept in the evidence;
- a dry run reads and says what would change, and writes nothing.

:func:`refusal` is the rule about who, once: the interfaces enforce it through these functions,
and the ops page draws its forms by it (:func:`may_decide`).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from evq.ops.app.service import Caller, Reply
from evq.worker.approval_actions import DROP_HTML, EDITABLE, edited, not_cancellable, not_held, self_approval
from evq.worker.errors import Forbidden, InvalidRequest
from evq.worker.keys import Identity, Permission, Role, authorize
from evq.worker.ports import AppStore, Edit
from evq.worker.records import StepDetail
from evq.worker.request import Policy
from evq.worker.states import Status

MAX_NOTE = 2000
CANCELLABLE = (Status.HELD, Status.PENDING, Status.RETRYABLE)


def _note(note: str | None, *, required: bool) -> str | None:
    if note is not None and not note.strip():
        note = None
    if note is None and required:
        raise InvalidRequest([{"field": "note", "message": "say why (kept in the evidence)"}])
    if note is not None and "\x00" in note:
        raise InvalidRequest([{"field": "note", "message": "holds a NUL character (not text PostgreSQL keeps)"}])
    if note is not None and len(note) > MAX_NOTE:
        raise InvalidRequest([{"field": "note", "message": f"at most {MAX_NOTE} characters"}])
    return note


def corrections(args: Mapping[str, Any]) -> dict[str, Any] | None:
    """An approval's corrections as every interface takes them (the command table's
    ``steps.approve``: subject, text, html, drop_html), for :func:`approve`; None: none given.
    What they may be, and the rule that a corrected text says what becomes of the HTML part,
    is worker/approval_actions.py's ``edited``, for all of them alike."""
    edits = {k: args[k] for k in EDITABLE if args.get(k) is not None}
    if args.get(DROP_HTML):
        edits[DROP_HTML] = True
    return edits or None


def _current(step: Mapping[str, Any]) -> dict[str, Any]:
    return {"current_status": step["status"], "current_reason": step["reason"]}


def _plan(detail: StepDetail, to: Status, reason: str, edit: Edit | None = None) -> dict[str, Any]:
    """What a dry run says would change (the answer's shape, with nothing written)."""
    s = detail.step
    return {
        "dry_run": True,
        "id": s["id"],
        "run_id": s["run_id"],
        "from_status": s["status"],
        "to_status": str(to),
        "reason": reason,
        "evidence_id": None,
        "decided_at": None,
        "payload_sha256": edit.payload_sha256 if edit else s["payload_sha256"],
        "requested_sha256": (s.get("requested_sha256") or s["payload_sha256"]) if edit else s.get("requested_sha256"),
        "edited": edit is not None,
        "fields": list(edit.fields) if edit else [],
    }


DECISIONS = ("approve", "deny", "cancel")


def refusal(action: str, identity: Identity, decision: Mapping[str, Any] | None, step_id: int) -> Forbidden | None:
    """Why ``identity`` may not ``action`` (approve, deny, cancel) the step ``step_id`` whose
    decision is ``decision``, whatever the step's state; None when it may. The one rule every
    interface enforces (below) and the ops page draws its forms by (:func:`may_decide`):

    - approve and deny: an operator or admin key; and a held send waits for a *second* person:
      the key that enqueued it may deny or cancel it, never approve it, whatever its role (an
      operator or admin key handed to an agent must not wave its own sends through);
    - cancel: the key that enqueued the step, or an operator or admin key."""
    try:
        authorize(identity, Permission.CANCEL if action == "cancel" else Permission.APPROVE)
    except Forbidden as exc:
        return exc
    own = identity.enqueued(decision)
    if action == "approve" and own:
        return self_approval(step_id, identity.name)
    if action == "cancel" and identity.role is Role.AGENT and not own:
        return Forbidden(
            f"the API key {identity.name!r} has role agent: it cancels only the steps it enqueued, "
            f"and step {step_id} is not one",
            hint="an operator or admin key cancels any step",
            context={"name": identity.name, "role": str(identity.role), "roles": ["operator", "admin"]},
        )
    return None


def may_decide(identity: Identity, decision: Mapping[str, Any] | None, step_id: int) -> dict[str, bool]:
    """Which of approve, deny and cancel :func:`refusal` lets ``identity`` do on this step."""
    return {action: refusal(action, identity, decision, step_id) is None for action in DECISIONS}


def _check(action: str, identity: Identity, detail: StepDetail) -> None:
    refused = refusal(action, identity, detail.decision, detail.step["id"])
    if refused is not None:
        raise refused


async def approve(
    store: AppStore,
    caller: Caller,
    step_id: int,
    *,
    note: str,
    edits: Mapping[str, Any] | None = None,
    dry_run: bool = False,
    now: datetime | None = None,
    policy: Policy | None = None,
) -> Reply:
    """A held send becomes pending (the same key and Message-ID) and the worker sends it.
    ``edits`` (:func:`corrections`: subject, text, html, drop_html) correct the message: a new
    payload, validated as at enqueue (``policy``: the installation's), a new hash; the evidence
    shows both. A corrected text must say what becomes of an HTML part (worker/approval_actions.py)."""
    text = _note(note, required=True)
    assert text is not None
    identity = await caller.identify(store, Permission.READ if dry_run else Permission.APPROVE)
    detail = await store.get_step(step_id)
    s = detail.step
    if s["status"] != Status.HELD:
        raise not_held(step_id, _current(s), "approved")
    edit = edited(s["payload"], s["provider"], edits, policy, from_sha256=s["payload_sha256"]) if edits else None
    if dry_run:
        return Reply(_plan(detail, Status.PENDING, "approved", edit))
    assert identity is not None  # APPROVE is never granted without a key
    _check("approve", identity, detail)
    # The key's id goes to the statement too, which refuses the enqueuing key on its own.
    done = await store.approve(
        step_id, actor=identity.name, actor_key_id=identity.key_id, note=text, edit=edit, now=now
    )
    return Reply(
        {"dry_run": False, **done.to_dict(), "edited": edit is not None, "fields": list(edit.fields) if edit else []}
    )


async def deny(
    store: AppStore, caller: Caller, step_id: int, *, note: str, dry_run: bool = False, now: datetime | None = None
) -> Reply:
    """A held send is closed rejected (reason denied); its ``notify`` is told if its sender may mail it."""
    text = _note(note, required=True)
    assert text is not None
    identity = await caller.identify(store, Permission.READ if dry_run else Permission.APPROVE)
    detail = await store.get_step(step_id)
    if detail.step["status"] != Status.HELD:
        raise not_held(step_id, _current(detail.step), "denied")
    if dry_run:
        return Reply(_plan(detail, Status.REJECTED, "denied"))
    assert identity is not None
    _check("deny", identity, detail)
    done = await store.deny(step_id, actor=identity.name, note=text, now=now)
    return Reply({"dry_run": False, **done.to_dict(), "edited": False, "fields": []})


async def cancel(
    store: AppStore,
    caller: Caller,
    step_id: int,
    *,
    note: str | None = None,
    dry_run: bool = False,
    now: datetime | None = None,
) -> Reply:
    """A held, pending or retryable send that cannot have gone out is closed rejected (reason
    cancelled) and is never sent. In flight: refused (a worker is sending it)."""
    text = _note(note, required=False)
    identity = await caller.identify(store, Permission.READ if dry_run else Permission.CANCEL)
    detail = await store.get_step(step_id)
    if identity is not None:
        _check("cancel", identity, detail)
    s = detail.step
    if Status(s["status"]) not in CANCELLABLE or s["maybe_delivered"]:
        raise not_cancellable(step_id, _current(s))
    if dry_run:
        return Reply(_plan(detail, Status.REJECTED, "cancelled"))
    assert identity is not None  # CANCEL is never granted without a key
    done = await store.cancel(step_id, actor=identity.name, note=text, now=now)
    return Reply({"dry_run": False, **done.to_dict(), "edited": False, "fields": []})
