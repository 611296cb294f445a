"""Signed callbacks: each event of a key's feed POSTed as JSON to the key's callback URL.

The delivery row is written with the event (the trigger evidence_key_events), so a POST is
owed durably before it is tried; :class:`CallbackSender`, a worker service, claims due
rows, POSTs them and records the answer: a 2xx is delivered, anything else is tried again
with backoff until ``max_attempts``. A worker that dies mid-POST leaves the row to be
claimed again once its hold passes: delivery is at least once, and the receiver dedupes
by ``webhook-id`` (the event's id, the same on every try). Sends never wait for it.

Signing follows Standard Webhooks (the Svix scheme): ``webhook-signature`` is
``v1,<base64 HMAC-SHA256 over "{webhook-id}.{webhook-timestamp}.{body}">`` under the
key's secret ``whsec_<base64>``. The secret is derived from the server's pepper, the
key's id and its ``callback_generation`` (:func:`signing_secret`): shown once when the
URL is set, never stored in a row, never logged.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

from evq.worker.errors import InvalidRequest
from evq.worker.logs import get_logger
from evq.worker.ports import CallbackStore, Poster

log = get_logger("evq.callbacks")

SECRET_PREFIX = "whsec_"
EVENT_TYPES = {"rejected": "evq.step.rejected", "unknown": "evq.step.unknown", "verdict": "evq.step.verdict"}


class CallbackRefused(Exception):
    """A URL evq will not call (a private address, a bad scheme): retried like any failure,
    in case the name resolves elsewhere later, and named in the row's last_error."""


MAX_URL = 2000


def check_url(raw: str, field_name: str = "--notify-url") -> str:
    """A callback URL as a key may hold it: http(s), a host, no user:password (it would sit
    in the row and every log of the URL). Where it resolves is checked at each POST."""
    parts = urlsplit(raw.strip())
    problem = None
    if len(raw) > MAX_URL:
        problem = f"at most {MAX_URL} characters"
    elif parts.scheme not in ("http", "https") or not parts.hostname:
        problem = "expected an http:// or https:// URL with a host"
    elif parts.username is not None or parts.password is not None:
        problem = "must not carry a user or password (put a token in the path, or check the signature)"
    elif any(c.isspace() or ord(c) < 32 for c in raw.strip()):
        problem = "must not contain spaces or control characters"
    if problem:
        raise InvalidRequest([{"field": field_name, "message": problem}])
    return raw.strip()


def signing_secret(pepper: bytes, key_id: str, generation: int) -> bytes:
    return hmac.new(pepper, f"evq-callback:{key_id}:{generation}".encode(), hashlib.sha256).digest()


def secret_text(secret: bytes) -> str:
    """The secret as the key's holder configures their receiver (Standard Webhooks' ``whsec_``)."""
    return SECRET_PREFIX + base64.b64encode(secret).decode()


def sign(secret: bytes, message_id: str, timestamp: int, body: bytes) -> str:
    signed = f"{message_id}.{timestamp}.".encode() + body
    return "v1," + base64.b64encode(hmac.new(secret, signed, hashlib.sha256).digest()).decode()


def event_body(row: Mapping[str, Any]) -> bytes:
    """The event as JSON: the same fields `evq events list` shows, under Standard Webhooks' envelope."""
    data = {
        "id": row["event_id"],
        "kind": row["kind"],
        "step": row["step"],
        "run_id": row["run_id"],
        "step_id": row["step_id"],
        "status": row["status"],
        "reason": row["reason"],
        "detail": row["detail"],
        "actor": row["actor"],
        "evidence_id": row["evidence_id"],
        "key_id": row["key_id"],
        "key_name": row["key_name"],
        "created_at": _iso(row["created_at"]),
    }
    envelope = {"type": EVENT_TYPES.get(row["kind"], "evq.step." + row["kind"]), "timestamp": data["created_at"]}
    return json.dumps({**envelope, "data": data}, ensure_ascii=False, separators=(",", ":")).encode()


def headers(row: Mapping[str, Any], body: bytes, *, now: float | None = None) -> dict[str, str]:
    message_id = f"evq_evt_{row['event_id']}"
    timestamp = int(now if now is not None else time.time())
    secret = signing_secret(bytes(row["pepper"]), row["key_id"], row["callback_generation"])
    return {
        "content-type": "application/json",
        "webhook-id": message_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": sign(secret, message_id, timestamp, body),
    }


def _iso(value: Any) -> Any:
    return value.isoformat() if isinstance(value, datetime) else value


@dataclass(frozen=True, slots=True)
class CallbackConfig:
    interval: float = 1.0  # seconds between passes
    batch: int = 20  # deliveries per pass, POSTed concurrently
    timeout: float = 5.0  # the poster's whole-request bound (its own setting)
    max_attempts: int = 12
    backoff_base: float = 5.0  # seconds before the 2nd try; doubling
    backoff_max: float = 3600.0

    @property
    def hold_seconds(self) -> float:
        # Longer than one POST can take, so a live worker never sees its row taken again.
        return self.timeout * 2 + 5

    def delay(self, attempts: int) -> float:
        return float(min(self.backoff_max, self.backoff_base * 2 ** max(0, attempts - 1)))


@dataclass(frozen=True, slots=True)
class CallbackCounts:
    delivered: int = 0
    failed: int = 0
    given_up: int = 0

    @property
    def total(self) -> int:
        return self.delivered + self.failed + self.given_up


class CallbackSender:
    """The worker service that POSTs due callbacks (see the module docstring)."""

    name = "callbacks"

    def __init__(self, store: CallbackStore, poster: Poster, config: CallbackConfig = CallbackConfig()):
        self.store = store
        self.poster = poster
        self.config = config
        self.interval = config.interval

    async def run_once(self) -> CallbackCounts:
        rows = await self.store.callback_claim(limit=self.config.batch, hold_seconds=self.config.hold_seconds)
        results = await asyncio.gather(*(self._deliver(row) for row in rows))
        return CallbackCounts(
            delivered=results.count("delivered"), failed=results.count("failed"), given_up=results.count("given_up")
        )

    async def _deliver(self, row: Mapping[str, Any]) -> str:
        body = event_body(row)
        status: int | None = None
        try:
            status = await self.poster.post(row["url"], body, headers(row, body))
            error = None if 200 <= status < 300 else f"HTTP {status}"
        except CallbackRefused as exc:
            error = f"refused: {exc}"
        except (OSError, TimeoutError) as exc:
            error = f"{type(exc).__name__}: {str(exc)[:200]}"
        except Exception as exc:  # a poster bug must not lose the row: it stays owed
            log.exception("callback_post_failed", delivery=row["id"])
            error = f"{type(exc).__name__}"
        if error is None:
            assert status is not None
            await self.store.callback_delivered(row["id"], status_code=status)
            log.info("callback_delivered", delivery=row["id"], event_id=row["event_id"], key_name=row["key_name"])
            return "delivered"
        give_up = row["attempts"] >= self.config.max_attempts
        await self.store.callback_failed(
            row["id"], error=error, status_code=status, delay=self.config.delay(row["attempts"]), give_up=give_up
        )
        # The URL is the key holder's (it may carry a token): logs name the delivery, not it.
        log.warning(
            "callback_not_delivered",
            delivery=row["id"],
            event_id=row["event_id"],
            key_name=row["key_name"],
            attempts=row["attempts"],
            error=error,
            given_up=give_up,
        )
        return "given_up" if give_up else "failed"
