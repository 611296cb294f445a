"""A person's decision on a held send: approve (with corrections), deny, or cancel a send before a worker claims it."""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from evq.ops.app import approvals
from evq.ops.web.page.common import app_state, caller_of, form_digest, form_text, posted, refusal, router
from evq.ops.web.page.step import step_page
from evq.ops.web.session import Session
from evq.worker.errors import AuthFailed, Forbidden, InvalidRequest, StateConflict
from evq.worker.keys import Permission


def _edits(values: dict[str, str]) -> dict[str, Any] | None:
    """The corrections an approver typed: a blank subject or text is not a correction (the send
    goes out as the agent asked it); anything else replaces that part, and makes a new request
    hash. The HTML part's field comes filled with the HTML as asked: it is a correction only if
    it differs from what the page showed (``html_shown``, its digest), and emptied it removes
    the part; "drop the HTML part" removes it whatever the field holds. ops/app/approvals.py
    (worker/approval_actions.py's ``edited``) then refuses a corrected text beside an unchanged HTML
    part, as it does for every interface."""
    edits: dict[str, Any] = {k: values[k] for k in ("subject", "text") if (values.get(k) or "").strip()}
    if values.get("drop_html"):
        edits["drop_html"] = True
    elif "html" in values and form_digest(values["html"]) != values.get("html_shown"):
        edits["html"] = form_text(values["html"])
    return edits or None


def _deciding(session: Session) -> None:
    """Approving and denying are an operator's or admin's: an agent's session is refused here,
    before ops/app/approvals.py refuses it again, so a forged form never reaches the store. Whose
    send it is (the key that enqueued it never approves it) is approvals.py's rule alone, on the
    session's identity as every interface builds it (worker/keys.py's identity_of)."""
    identity = session.identity
    if identity is None or not identity.may(Permission.APPROVE):
        raise Forbidden(
            f"the key's role ({identity.role if identity else 'none'}) may not approve or deny a held send",
            hint="an operator or admin key decides on held sends",
        )


async def _decided(request: Request, step_id: int, action: str, decide: Any) -> Response:
    """Run one decision on a step; on success show the step in its new state, otherwise the
    step page with the refusal in place (and what was typed, so nothing is lost)."""
    session, values = await posted(request)
    try:
        await decide(session, values)
    except (InvalidRequest, StateConflict, AuthFailed) as exc:
        status, shown = refusal(exc)
        return await step_page(request, session, step_id, {}, status=status, error=shown, posted=values)
    if action == "approved" and values.get("back") == "held":
        # Approved from the held inbox (its "Correct and approve" form): back to the inbox, whose
        # notice is shown only if this step's latest decision is that approval (queues.py).
        return RedirectResponse(f"/ops/held?approved={step_id}", status_code=303)
    return RedirectResponse(f"/ops/steps/{step_id}?done={action}", status_code=303)


def _note(values: dict[str, str], *, required: bool = False) -> str:
    note = (values.get("note") or "").strip()
    if required and not note:
        # The page asks for it before anything is sent (ops/app/approvals.py refuses it too).
        raise InvalidRequest([{"field": "note", "message": "required: say why you decide so"}])
    return note


@router.post("/steps/{step_id}/approve", response_class=HTMLResponse)
async def approve(request: Request, step_id: int) -> Response:
    async def decide(session: Session, values: dict[str, str]) -> None:
        _deciding(session)
        await approvals.approve(
            app_state(request).store,
            caller_of(session),
            step_id,
            note=_note(values, required=True),
            edits=_edits(values),
            policy=app_state(request).policy,
        )

    return await _decided(request, step_id, "approved", decide)


@router.post("/steps/{step_id}/deny", response_class=HTMLResponse)
async def deny(request: Request, step_id: int) -> Response:
    async def decide(session: Session, values: dict[str, str]) -> None:
        _deciding(session)
        await approvals.deny(app_state(request).store, caller_of(session), step_id, note=_note(values, required=True))

    return await _decided(request, step_id, "denied", decide)


@router.post("/steps/{step_id}/cancel", response_class=HTMLResponse)
async def cancel(request: Request, step_id: int) -> Response:
    async def decide(session: Session, values: dict[str, str]) -> None:
        # Who may cancel (the key that enqueued it, or an operator) is ops/app/approvals.py's rule.
        await approvals.cancel(app_state(request).store, caller_of(session), step_id, note=_note(values) or None)

    return await _decided(request, step_id, "cancelled", decide)
