"""HTTP provider adapter for a Resend-style JSON email API, with idempotency and lookup.

Wire format (the Resend-compatible subset):
- ``POST {base}/emails`` with ``Authorization: Bearer KEY``, ``Idempotency-Key`` and a
  JSON body ``{from, to[], cc[], bcc[], reply_to[], subject, text, html, headers{}, tags[]}``,
  answered by ``{"id": ...}``;
- ``GET {base}/emails/{id}``; ``GET {base}/emails?tag=NAME:VALUE`` answered by ``{"data": [...]}``.

The provider honours our key for ``dedupe_window`` seconds, which is what lets the
core retry an ambiguous attempt (worker/transitions.py): the same key, the same
body byte for byte, and the provider sends once. Classification (docs/design.md, "Adapters"):

| answer | outcome |
|---|---|
| 2xx | accepted, with the provider's id |
| 400, 413, 422, any other 4xx not below | rejected |
| 409 "same key, different payload" | rejected: a bug (our body for a key never changes); logged as an error |
| 409 "still in progress", 408, 429 (Retry-After honoured) | retryable; a 429 is `throttled`: it pauses the whole provider |
| 401, 403, 404, 405, 3xx | retryable, logged as an error: our configuration is wrong, not the message (401 and 403 open the provider's circuit, worker/circuit.py) |
| 5xx with the provider's JSON error | retryable (the provider says it failed) |
| 5xx without it (a gateway answered) | ambiguous: the provider behind it may have acted |
| no connection, or failed before the whole request was written | retryable |
| timeout or reset after the whole request was written | ambiguous |

"Ambiguous" is :class:`~worker.outcomes.Unknown`: the core retries it with the same
key while the window (counted from the first attempt) still covers a lease, and
otherwise leaves the step ``unknown`` for the reconciler, which calls :meth:`lookup`.
Whether the request was written is known exactly, from httpcore's trace events (a forward
proxy's ``CONNECT``, HTTPS_PROXY, comes through the same hook and is not our request).

Keys and tags: the ``Idempotency-Key`` is ``evq1-`` and the HMAC-SHA256 (hex) of the step's
key under a secret derived from this installation's pepper (:class:`WireKeys`): 69 printable
characters, within Resend's 256, the same on every attempt of a step. Keys are the callers' to
choose, so sending one as it is let an agent take another step's key at the provider first (a
literal ``sha256:<digest of the victim's key>``: the victim's send met "same key, different
body" and was lost), and two installations sharing a provider account collided on every key
both used; no caller can choose this one, and each installation's differs. Steps evq 0.2.0
enqueued keep the form they may already have been sent under
(:func:`legacy_wire_key`: the key itself when it is printable ASCII of at most 256 characters,
else ``sha256:`` and its digest): a new key inside the provider's window would be a second send.

The tag ``evq_key`` carries :func:`worker.delivery.key_tag` (the key's SHA-256 hex digest and
part of the Message-ID's: tag values may only hold letters, digits, ``_`` and ``-``), which
webhooks match the step by (worker/delivery.py): another installation's message with the same
key carries another. A step evq 0.2.0 made keeps the bare digest it may have been sent with
(the body must be the same bytes on every attempt); its lookup, as every lookup after the tag's
own finds nothing, asks for that form too, and a listed message whose headers name another
Message-ID is not ours (:meth:`HttpProvider.lookup`).
The API key is never logged, never in evidence.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import hmac
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

import httpx

from evq.adapters import answers
from evq.adapters.http.config import HttpConfig, shown_url, url_secrets
from evq.adapters.http.config import profile as http_profile
from evq.worker import deadline as limits
from evq.worker.delivery import key_tag
from evq.worker.header_text import header_text_refusal
from evq.worker.logs import get_logger, register_secrets
from evq.worker.outcomes import Accepted, Outcome, Rejected, Retryable, Unknown, log_fields
from evq.worker.ports import LookupFailed, LookupResult, ProviderProfile, SendRequest
from evq.worker.request import ALLOWED_HEADERS, Policy, check_payload
from evq.worker.secret_scrub import scrub_text

log = get_logger("evq.adapters.http")

TAG_NAME = "evq_key"
MESSAGE_ID_HEADER = "X-Evq-Message-Id"
MAX_KEY = 256
LOOKUP_LIMIT = 10  # listed matches examined per lookup
_PRINTABLE_ASCII = re.compile(r"^[\x21-\x7e]+$")
_CONFIG_STATUSES = frozenset({401, 403, 404, 405})
_RETRY_STATUSES = frozenset({408, 429})
_IN_PROGRESS = "concurrent_idempotent_requests"
_KEY_REUSED = "invalid_idempotent_request"
# httpcore's trace event once the whole request (headers and body) is written.
_REQUEST_WRITTEN = ("http11.send_request_body.complete", "http2.send_request_body.complete")
# ... and the one just before its first byte is written: the last moment to not send.
_REQUEST_STARTS = ("http11.send_request_headers.started", "http2.send_request_headers.started")


class _LeaseTooShort(Exception):
    """Raised from the trace hook before a byte of the request is written (invariant 9)."""


def tag_value(idempotency_key: str) -> str:
    """The bare digest evq 0.2.0 sent as the tag (worker/delivery.py, key_digest)."""
    return hashlib.sha256(idempotency_key.encode()).hexdigest()


def legacy_wire_key(idempotency_key: str) -> str:
    """The ``Idempotency-Key`` of a step evq 0.2.0 enqueued: the key itself, or its
    digest. A caller can choose it, so it is only ever sent for those steps."""
    if len(idempotency_key) <= MAX_KEY and _PRINTABLE_ASCII.match(idempotency_key):
        return idempotency_key
    return "sha256:" + tag_value(idempotency_key)


WIRE_KEY_PREFIX = "evq1-"
# What the pepper is keyed with to give this secret: a label of its own, so the secret is no
# other use's (API key hashes, callback secrets: worker/keys.py, worker/callbacks.py).
_WIRE_LABEL = b"evq-provider-idempotency-key:v1"


@dataclass(frozen=True, slots=True)
class WireKeys:
    """How a step's idempotency key becomes the provider's ``Idempotency-Key``: keyed by a
    secret no caller knows and each installation has its own of, the same for every attempt
    of a step (invariant 1). ``keyed_from``: the first step id sent that way
    (``api_key_pepper.wire_keys_from``); a step below it keeps :func:`legacy_wire_key`."""

    secret: bytes = dataclasses.field(repr=False)
    keyed_from: int

    @classmethod
    def from_pepper(cls, pepper: bytes, keyed_from: int) -> WireKeys:
        """From this installation's pepper (table ``api_key_pepper``: random, made once by the
        migration, never rewritten, readable by the runtime role only)."""
        if len(pepper) < 32 or keyed_from < 1:
            raise ValueError("the wire keys need the installation's 32-byte pepper and a first step id")
        return cls(secret=hmac.new(pepper, _WIRE_LABEL, hashlib.sha256).digest(), keyed_from=keyed_from)

    def key(self, step_id: int, idempotency_key: str) -> str:
        if step_id < self.keyed_from:
            return legacy_wire_key(idempotency_key)
        return WIRE_KEY_PREFIX + hmac.new(self.secret, idempotency_key.encode(), hashlib.sha256).hexdigest()


def wire_body(request: SendRequest, *, legacy_tag: bool = False) -> bytes:
    """The JSON body for a step: the same bytes on every attempt, as the provider's
    idempotency check compares bodies (nothing per attempt, no Date)."""
    return _encode(wire_message(request, legacy_tag=legacy_tag))


def _encode(body: Mapping[str, Any]) -> bytes:
    return json.dumps(body, sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode()


def wire_refusal(body: Mapping[str, Any]) -> str | None:
    """Why this body must not be sent, or None. The provider writes every one of these
    strings into a header of the message as it is, and recipients' software decodes an
    encoded word in it (CR/LF that becomes a header): so what is about to be sent is
    checked itself, whatever validated the stored payload."""
    texts: list[tuple[str, str]] = [("subject", body.get("subject") or "")]
    for field in ("from", "to", "cc", "bcc", "reply_to"):
        entries = body.get(field) or []
        for i, entry in enumerate([entries] if isinstance(entries, str) else entries):
            texts.append((f"{field}[{i}]", entry))
    texts += [(f"headers.{name}", value) for name, value in (body.get("headers") or {}).items()]
    for where, text in texts:
        if (why := header_text_refusal(str(text))) is not None:
            return f"not sent: {where} {why}"
    return None


def wire_message(request: SendRequest, *, legacy_tag: bool = False) -> dict[str, Any]:
    """The body as a mapping, before it is encoded. ``legacy_tag``: a step evq 0.2.0 made,
    whose body carried the key's bare digest as its tag."""
    p = request.payload
    headers = {
        ALLOWED_HEADERS[k.lower()]: v for k, v in (p.get("headers") or {}).items() if k.lower() in ALLOWED_HEADERS
    }
    # The key travels as the Idempotency-Key request header and, hashed, as a tag; never in
    # the message, whose recipients would read the caller's run and step ids in it.
    headers[MESSAGE_ID_HEADER] = request.message_id
    body: dict[str, Any] = {
        "from": _address(p["from"]),
        "to": [_address(a) for a in p["to"]],
        "cc": [_address(a) for a in p.get("cc") or ()],
        "bcc": [_address(a) for a in p.get("bcc") or ()],
        "subject": p["subject"],
        "headers": headers,
        "tags": [
            {
                "name": TAG_NAME,
                "value": tag_value(request.idempotency_key)
                if legacy_tag
                else key_tag(request.idempotency_key, request.message_id),
            }
        ],
    }
    if p.get("reply_to"):
        body["reply_to"] = [_address(a) for a in p["reply_to"]]
    for part in ("text", "html"):
        if p.get(part) is not None:
            body[part] = p[part]
    return body


def _address(entry: Mapping[str, Any]) -> str:
    # Always a quoted display name: commas and angle brackets in it stay text.
    name = entry.get("name")
    if not name:
        return entry["email"]
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + f'" <{entry["email"]}>'


def retry_after(value: str | None, *, now: datetime | None = None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or an HTTP date)."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())


class HttpProvider:
    """The HTTP adapter: satisfies :class:`worker.ports.Provider` and :class:`worker.ports.Lookup`."""

    name = "http"

    def __init__(
        self,
        *,
        base_url: str,
        api_key: str,
        timeout: float = 10.0,
        dedupe_window: float | None = 86400.0,
        policy: Policy = Policy(),
        max_connections: int = 16,
        profile: ProviderProfile | None = None,
        wire_keys: WireKeys,
    ):
        if not api_key:
            raise ValueError("the HTTP adapter needs an API key")
        if timeout <= 0 or max_connections < 1:
            raise ValueError("timeout must be positive and max_connections at least 1")
        self.base_url = base_url.rstrip("/")
        # 0 means the provider does not deduplicate: ambiguous sends are then never retried.
        self.dedupe_window = dedupe_window or None
        # What settles a lost answer (docs/design.md, "Provider profiles"); the composition root
        # passes the one the settings give (whether the webhook is configured), else: key and tag.
        self.profile = (
            profile if profile is not None else http_profile(HttpConfig(dedupe_window=self.dedupe_window or 0.0))
        )
        self.timeout = timeout
        self.policy = policy
        self.wire_keys = wire_keys
        self._api_key = api_key  # kept off repr() and out of every outcome
        register_secrets([api_key, *url_secrets(base_url)])
        self.shown_url = shown_url(self.base_url)  # every message and log line names this one
        self._client = httpx.AsyncClient(
            base_url=self.base_url,
            headers={"Authorization": f"Bearer {api_key}", "User-Agent": "evq", "Accept": "application/json"},
            timeout=httpx.Timeout(timeout),
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
            follow_redirects=False,
        )

    def fix_hint(self, cause: str) -> str | None:
        """The setting to change when every send fails with ``cause`` (worker/streaks.py)."""
        if cause in ("connection_refused", "tls_failed"):
            return f"{self.shown_url} does not answer: check EVQ_HTTP_BASE_URL"
        if cause in ("auth_failed", "forbidden"):
            return "the provider refused our key: check EVQ_HTTP_API_KEY"
        return None

    def __repr__(self) -> str:
        return f"HttpProvider(base_url={self.shown_url!r}, dedupe_window={self.dedupe_window})"

    async def close(self) -> None:
        await self._client.aclose()

    # -- send -------------------------------------------------------------------

    async def send(self, request: SendRequest) -> Outcome:
        # Policy may have changed since enqueue: nothing leaves unless today's rules pass.
        refusal = check_payload(request.payload, self.policy) or wire_refusal(wire_message(request))
        if refusal is not None:
            outcome: Outcome = Rejected(refusal, response=answers.evidence("policy"), before_send=True)
        elif self._client.is_closed:
            outcome = Retryable("the http adapter is closed", response=answers.evidence("closed"))
        else:
            outcome = await self._post(request)
        self._log(request, outcome)
        return outcome

    async def _post(self, request: SendRequest) -> Outcome:
        written = False
        tunnel = False  # the request being written is a proxy's CONNECT, which sends nothing

        async def trace(event: str, info: Mapping[str, Any]) -> None:
            nonlocal written, tunnel
            if event in _REQUEST_WRITTEN:
                written = written or not tunnel
            elif event in _REQUEST_STARTS:
                tunnel = answers.is_tunnel(info)
                if not limits.may_send(request.send_by):
                    # Connecting (or waiting for a pooled connection) may have taken the
                    # lease's time, or the process was paused: checked after all of that.
                    raise _LeaseTooShort

        # Each network operation is bounded by the timeout; this bounds them together,
        # and never past the request's deadline (a trickled answer defeats per-read
        # timeouts). Cancelling the request frees its connection.
        whole = self.timeout * 3
        remaining = limits.left(request.deadline)
        if remaining is not None:
            whole = max(0.0, min(whole, remaining))
        try:
            response = await asyncio.wait_for(
                self._client.post(
                    "/emails",
                    content=wire_body(request, legacy_tag=request.step_id < self.wire_keys.keyed_from),
                    headers={
                        "Idempotency-Key": self.wire_keys.key(request.step_id, request.idempotency_key),
                        "Content-Type": "application/json",
                    },
                    extensions={"trace": trace},
                ),
                timeout=whole,
            )
        except _LeaseTooShort:
            return Retryable(
                "not sent: the lease no longer leaves time to send and record",
                response=answers.evidence("request", error_class="LeaseTooShort", sent=False),
            )
        except (httpx.HTTPError, TimeoutError) as exc:
            return self._failed(exc, written)
        return self._classify(response)

    def _failed(self, exc: BaseException, written: bool) -> Outcome:
        return answers.transport_failure(exc, written=written, detail=self._scrub(str(exc)), who="the provider")

    def _classify(self, response: httpx.Response) -> Outcome:
        code = response.status_code
        text = self._scrub(response.text)
        error = _provider_error(response)
        evidence = answers.evidence("answer", code=code, reply=text, sent=True, error_name=error.get("name"))
        # The provider's own error text is parsed from its JSON, so it can hold the key
        # unescaped where the raw body held it escaped: scrubbed again here.
        what = self._scrub(
            f"http {code}"
            + (f" {error['name']}" if error.get("name") else "")
            + (f": {answers.short(str(error['message']))}" if error.get("message") else "")
        )
        if 200 <= code < 300:
            provider_id = _json(response).get("id")
            return Accepted(
                provider_message_id=provider_id if isinstance(provider_id, str) else None, response=evidence
            )
        if code == 409:
            if error.get("name") == _KEY_REUSED:
                # Our body for a key never changes, so this is a bug (or a key shared with
                # something else): refuse loudly rather than retry into the same wall.
                return Rejected(f"{what} (the same key was sent with a different body: a bug)", response=evidence)
            return Retryable(what, retry_after=retry_after(response.headers.get("Retry-After")), response=evidence)
        if code in _RETRY_STATUSES:
            return Retryable(
                what,
                retry_after=retry_after(response.headers.get("Retry-After")),
                response=evidence,
                throttled=code == 429,
            )
        if code in _CONFIG_STATUSES or 300 <= code < 400:
            # Our key or URL is wrong for every message alike: the provider's circuit opens
            # on 401 and 403 (worker/circuit.py) instead of every message spending attempts.
            return Retryable(
                f"{what} (check EVQ_HTTP_BASE_URL and EVQ_HTTP_API_KEY)",
                response=evidence,
                fault=_STATUS_FAULTS.get(code),
            )
        if 400 <= code < 500:
            return Rejected(what, response=evidence)
        if 500 <= code < 600 and error:
            return Retryable(what, retry_after=retry_after(response.headers.get("Retry-After")), response=evidence)
        return Unknown(f"{what} without the provider's own error; it may have accepted the request", response=evidence)

    def _log(self, request: SendRequest, outcome: Outcome) -> None:
        r = outcome.response
        fields = log_fields(request.step_id, request.attempt, outcome, sent=r.get("sent"), base_url=self.shown_url)
        if r.get("error_name") == _KEY_REUSED:
            log.error("http_idempotency_key_reused", reason=getattr(outcome, "reason", None), **fields)
        elif isinstance(outcome, Retryable) and (
            r.get("code") in _CONFIG_STATUSES or 300 <= (r.get("code") or 0) < 400
        ):
            # Retried, but no retry succeeds until someone fixes the settings.
            log.error("http_config_failure", reason=outcome.reason, **fields)
        else:
            log.debug("http_send_finished", **fields)

    # -- lookup -------------------------------------------------------------------

    async def lookup(self, idempotency_key: str, message_id: str) -> LookupResult:
        """Find the message by the tag carrying our key. A listed message counts only if
        it carries that tag itself (read from ``GET /emails/{id}`` when the list omits
        tags): a provider that ignored the filter must not settle a row. One whose headers
        name another Message-ID is another installation's send of the same key (the tag is
        the key's plain digest, the same in both), and does not settle ours either."""
        listed = 0
        # The step's own tag; then the bare digest a step evq 0.2.0 made was sent with (the
        # lookup is not told the step's id), which other installations' messages of the same
        # key carry too: such a message counts only if its headers show our Message-ID.
        for value in (key_tag(idempotency_key, message_id), tag_value(idempotency_key)):
            bare = value == tag_value(idempotency_key)
            query = f"{TAG_NAME}:{value}"
            answer = await self._get("/emails", params={"tag": query})
            data = answer.get("data")
            if not isinstance(data, list):
                raise LookupFailed("the provider's list answer has no data array")
            listed += len(data)
            for item in data[:LOOKUP_LIMIT]:
                if not isinstance(item, dict) or not isinstance(item.get("id"), str):
                    continue
                record = item if "tags" in item else await self._get(f"/emails/{item['id']}")
                if (
                    _carries_tag(record, value)
                    and not _names_another_message(record, message_id)
                    and (not bare or _shown_message_id(record) == message_id)
                ):
                    return LookupResult(
                        found=True,
                        provider_message_id=item["id"],
                        raw={"query": query, "listed": listed, "email": _summary(record)},
                    )
        return LookupResult(found=False, raw={"query": query, "listed": listed})

    async def _get(self, path: str, params: Mapping[str, str] | None = None) -> dict[str, Any]:
        try:
            response = await self._client.get(path, params=params)
        except httpx.HTTPError as exc:
            raise LookupFailed(f"{type(exc).__name__} asking {path}") from None
        if response.status_code != 200:
            raise LookupFailed(
                f"http {response.status_code} asking {path}: {answers.short(self._scrub(response.text))}"
            )
        body = _json(response)
        if not body:
            raise LookupFailed(f"unreadable answer asking {path}")
        return body

    def _scrub(self, text: str) -> str:
        return scrub_text(text.replace(self._api_key, "***"))[: answers.MAX_BODY * 4]


_STATUS_FAULTS = {401: "auth_failed", 403: "forbidden"}


def _json(response: httpx.Response) -> dict[str, Any]:
    try:
        value = response.json()
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _provider_error(response: httpx.Response) -> dict[str, Any]:
    """The provider's own JSON error ({statusCode?, name, message}), or {} for anything else."""
    if response.is_success or "json" not in response.headers.get("content-type", ""):
        return {}
    body = _json(response)
    return body if "name" in body or "message" in body else {}


def _carries_tag(record: Mapping[str, Any], value: str) -> bool:
    tags = record.get("tags")
    return isinstance(tags, list) and any(
        isinstance(t, dict) and t.get("name") == TAG_NAME and t.get("value") == value for t in tags
    )


def _shown_message_id(record: Mapping[str, Any]) -> Any:
    """Our Message-ID header as the record's headers show it, or None (not shown)."""
    headers = record.get("headers")
    if not isinstance(headers, Mapping):
        return None
    return next((v for k, v in headers.items() if str(k).lower() == MESSAGE_ID_HEADER.lower()), None)


def _names_another_message(record: Mapping[str, Any], message_id: str) -> bool:
    """Whether the record's headers (when the provider shows them) carry our Message-ID header
    with another value."""
    shown = _shown_message_id(record)
    return shown is not None and shown != message_id


def _summary(record: Mapping[str, Any]) -> dict[str, Any]:
    keep = ("id", "created_at", "last_event", "subject", "to")
    return {k: record[k] for k in keep if k in record}
