"""``POST /v1/webhooks/{provider}``: the providers' delivery webhooks (issue 16).

Not an API-key route: a provider cannot send evq's key, so the request's own signature
(or, for Postmark, the credentials in its URL) is its authentication. The receiver the
composition root built for the provider (adapters/webhooks/, through the port in
worker/ports/webhooks.py) verifies the bytes and reads the events; the application layer
(``service.receive_deliveries``) stores them. Nothing is stored before the request verifies.

Answers: 200 with a short summary once stored (providers retry anything else); the
refusal's 4xx, in the contract's error shape with ``context.reason``, counted in
``evq_webhook_refused_total{provider,reason}`` and logged by reason only (never the peer's
bytes or a secret); 404 ``not_configured`` for a provider with no settings; 413 for a body
over EVQ_WEBHOOK_MAX_BODY, refused from Content-Length before it is read, or as soon as
more arrived; 503 when the database is unavailable (the provider retries; nothing lost).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import anyio.to_thread
from fastapi import APIRouter, Path, Request
from fastapi.responses import JSONResponse

from evq.ops.app import service
from evq.ops.app.contract import Timer, failure, plain, success
from evq.ops.web.openapi import ref
from evq.ops.web.state import AppState
from evq.worker import metrics
from evq.worker.errors import EvqError
from evq.worker.logs import get_logger
from evq.worker.ports.webhooks import WebhookRefused

log = get_logger("evq.webhooks")

# The providers a webhook route exists for (adapters/webhooks/config.py's PROVIDERS; the
# interfaces may not import an adapter, so the list is repeated here and a test compares them).
PROVIDERS = ("resend", "sendgrid", "postmark", "mailgun", "ses")
_CODE = {
    401: "E_AUTH_FAILED",
    403: "E_AUTH_FAILED",
    404: "E_NOT_FOUND",
    400: "E_INVALID_ARG",
    413: "E_INVALID_ARG",
    429: "E_AUTH_FAILED",
}
# Refusals that mean wrong credentials (a guess at Postmark's password, a forged signature):
# counted per client address by a failed-key throttle of their own (ops/web/throttle.py, the
# API's limits EVQ_SERVE_AUTH_FAILURES / EVQ_SERVE_AUTH_WINDOW, not its counts).
_GUESSES = frozenset({"unsigned", "bad_signature"})

router = APIRouter(tags=["webhooks"])


class WebhookError(EvqError):
    """A refusal in the contract's error shape: its code follows the HTTP status."""

    def __init__(self, refusal: WebhookRefused, provider: str):
        self.code = _CODE.get(refusal.status, "E_INVALID_ARG" if refusal.status < 500 else "E_INTERNAL")
        context: dict[str, Any] = {"provider": provider, "reason": refusal.reason}
        if self.code == "E_INVALID_ARG":
            context["fields"] = [{"field": "$body", "message": refusal.message}]
        super().__init__(
            f"webhook refused: {refusal.message}",
            hint=_HINTS.get(
                refusal.reason,
                "check the provider's webhook settings against docs/guides/webhooks-and-reconciliation.md",
            ),
            context=context,
        )


_HINTS = {
    "not_configured": "set this provider's EVQ_WEBHOOK_* settings (docs/guides/webhooks-and-reconciliation.md, 'Delivery webhooks')",
    "unknown_provider": "the providers are " + ", ".join(PROVIDERS),
    "too_large": "EVQ_WEBHOOK_MAX_BODY bounds a webhook's body",
    "replayed": "a webhook is believed only near the time it was signed (EVQ_WEBHOOK_TOLERANCE)",
    "throttled": "this address sent too many badly signed requests lately; Retry-After says when to try again",
}


def refused(refusal: WebhookRefused, provider: str, timer: Timer, retry_after: int | None = None) -> JSONResponse:
    label = provider if provider in PROVIDERS else "other"
    metrics.labelled(metrics.WEBHOOK_REFUSED, label, refusal.reason).inc()
    log.warning("webhook_refused", provider=label, reason=refusal.reason, status=refusal.status)
    body = failure(WebhookError(refusal, label), timer.meta())
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
    return JSONResponse(body, status_code=refusal.status, headers=headers)


async def read_capped(request: Request, limit: int) -> bytes:
    """The whole body, refused (``too_large``) by Content-Length before a byte is read, or as
    soon as more than ``limit`` bytes arrived."""
    length = request.headers.get("content-length")
    if length is not None and length.strip().isdigit() and int(length) > limit:
        raise WebhookRefused(413, "too_large", f"the body is larger than {limit} bytes")
    chunks, seen = [], 0
    async for chunk in request.stream():
        seen += len(chunk)
        if seen > limit:
            raise WebhookRefused(413, "too_large", f"the body is larger than {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


# The 200 body: the contract's wrapper around receive_deliveries' data (ops/app/service.py).
RECEIVED: dict[str, Any] = {
    "allOf": [ref("success_response")],
    "properties": {
        "data": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["event_id", "type", "matched", "step", "duplicate", "closed"],
                "properties": {
                    "event_id": {"type": "string", "description": "the provider's id of the event (or one derived)"},
                    "type": {
                        "enum": [
                            "delivered",
                            "deferred",
                            "bounced_hard",
                            "bounced_soft",
                            "complained",
                            "opened",
                            "clicked",
                        ]
                    },
                    "matched": {
                        "type": "boolean",
                        "description": "whether a step carries the event's key or Message-ID",
                    },
                    "step": {"type": ["integer", "null"], "description": "that step's id"},
                    "duplicate": {
                        "type": "boolean",
                        "description": "stored before (a retry or replay): nothing changed",
                    },
                    "closed": {"type": "boolean", "description": "the event closed an unknown step accepted (webhook)"},
                },
            },
        }
    },
}


def _error(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": ref("error_response")}}}


@router.post(
    "/v1/webhooks/{provider}",
    summary="Receive a provider's delivery webhook (delivered, deferred, bounced, complained, opened, clicked)",
    description="Configure this URL at the provider (docs/guides/webhooks-and-reconciliation.md, 'Delivery webhooks'). No API key: the request's "
    "signature is its authentication (Resend: Svix; SendGrid: the Signed Event Webhook; Mailgun: the HMAC in the "
    "body; SES: the SNS message signature; Postmark: basic auth or ?token= in the URL). Verified events are stored "
    "once each (by the provider's event id), matched to their step by the evq_key tag and the Message-ID; an "
    "unknown step they match is closed accepted (reason webhook).",
    operation_id="webhooks.receive",
    responses={
        200: {
            "description": "verified and stored: one entry per event read (none for an SNS subscription or "
            "events that say nothing of delivery); meta counts them",
            "content": {"application/json": {"schema": RECEIVED}},
        },
        400: _error("signed, but not the provider's documented shape (reason malformed; E_INVALID_ARG)"),
        401: _error("unsigned, badly signed, or replayed (reason unsigned, bad_signature, replayed; E_AUTH_FAILED)"),
        403: _error("SNS: a topic not allowed, or a certificate URL not on an SNS host (E_AUTH_FAILED)"),
        404: _error("no such provider, or one with no settings (reason not_configured; E_NOT_FOUND)"),
        413: _error("the body is larger than EVQ_WEBHOOK_MAX_BODY (reason too_large; E_INVALID_ARG)"),
        429: _error(
            "this address sent too many unsigned or badly signed requests lately (reason throttled; E_AUTH_FAILED; "
            "Retry-After); the limits of EVQ_SERVE_AUTH_FAILURES and EVQ_SERVE_AUTH_WINDOW, counted apart from API keys"
        ),
        503: _error("the database is unavailable, or the SNS certificate could not be fetched: the provider retries"),
    },
    openapi_extra={"security": [], "requestBody": {"required": True, "content": {"*/*": {"schema": {}}}}},
)
async def receive(
    request: Request, provider: str = Path(description="resend, sendgrid, postmark, mailgun or ses")
) -> JSONResponse:
    state: AppState = request.app.state.evq
    timer: Timer = request.state.timer
    receiver = (state.webhooks or {}).get(provider)
    address = request.client.host if request.client else None
    throttle = state.webhook_throttle
    wait = throttle.retry_after(address) if throttle is not None else None
    if wait is not None:
        refusal = WebhookRefused(429, "throttled", "too many badly signed requests from this address")
        return refused(refusal, provider, timer, retry_after=wait)
    try:
        if provider not in PROVIDERS:
            raise WebhookRefused(404, "unknown_provider", "no such provider")
        if receiver is None:
            raise WebhookRefused(404, "not_configured", "this provider's webhook is not configured")
        body = await read_capped(request, state.settings.webhook_max_body)
        headers = {name.lower(): value for name, value in request.headers.items()}
        query = dict(request.query_params)
        now = datetime.now(UTC)
        events = await anyio.to_thread.run_sync(receiver, headers, body, query, now)
    except WebhookRefused as refusal:
        if refusal.reason in _GUESSES and throttle is not None:
            throttle.failed(address)
        return refused(refusal, provider, timer)
    allowed = state.settings.webhook_step_providers()[provider]
    reply = await service.receive_deliveries(state.store, provider, events, allowed)
    log.info("webhook_received", provider=provider, events=len(events))
    return JSONResponse(plain(success(reply.data, timer.meta(reply.meta), reply.status)), status_code=200)
