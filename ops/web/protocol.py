"""HTTP around the contract: statuses for error codes, safe JSON bodies, and the guard
every request passes (size limit, timing, security headers).

Every bad request gets a 4xx with the contract's error (E_INVALID_ARG naming what is
wrong), never a 500: malformed JSON 400, too deep 400, wrong content type 415, too
large 413, unknown or mistyped fields 422, a bad path parameter 422; a GET's unknown or unreadable
query parameter 400 (:class:`BadQuery`), as the ops page answers a bad list address.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from evq.ops.app.contract import Timer, failure, to_json
from evq.ops.app.service import json_field_names
from evq.worker import jsontext
from evq.worker.errors import AuthFailed, EvqError, Forbidden, InvalidRequest
from evq.worker.logs import get_logger

log = get_logger("evq.http")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# Error code -> HTTP status. E_AUTH_FAILED is 401, or 403 when the key is good but its role is not.
STATUS: dict[str, int] = {
    "E_INVALID_ARG": 422,
    "E_UNRESOLVABLE": 422,
    "E_BUDGET": 422,
    "E_NOT_FOUND": 404,
    "E_CONFLICT": 409,
    "E_AUTH_FAILED": 401,
    "E_SCHEMA_MISMATCH": 503,
    "E_DB_UNAVAILABLE": 503,
    "E_MAX_FAILURES": 409,
    "E_ABORTED": 503,
    "E_PARTIAL_FAILURE": 200,
    "E_INTERNAL": 500,
}
MAX_JSON_DEPTH = 32
KEY_SOURCE = "the Authorization header (Authorization: Bearer <key>)"


class BadRequest(InvalidRequest):
    """E_INVALID_ARG with an HTTP status of its own (400, 405, 413, 415)."""

    def __init__(self, status: int, field: str, message: str):
        super().__init__([{"field": field, "message": message}])
        self.http_status = status


class BadQuery(InvalidRequest):
    """E_INVALID_ARG about a GET's query string (a parameter the route does not take, or a value
    it cannot read): HTTP 400, never a list read as if the filter were not there. Its fields
    already carry their JSON names."""

    http_status = 400


class TooManyFailures(AuthFailed):
    """E_AUTH_FAILED as HTTP 429: this client address presented too many wrong keys lately
    (ops/web/throttle.py); nothing was looked up. ``retry_after``: whole seconds."""

    def __init__(self, retry_after: int):
        super().__init__(
            "too many wrong API keys from this address: try again later",
            hint=f"wait {retry_after} s (Retry-After), then check the key you send",
            context={"retry_after": retry_after},
        )
        self.retry_after = retry_after


def about_the_query(method: str, path: str, query_names: set[str], exc: EvqError) -> EvqError:
    """``exc`` as a :class:`BadQuery` when it is a GET's field error about its query string
    only (each field one of the request's or the route's query parameters); else as it is. A
    path parameter's error (``/v1/steps/abc``) stays a 422, a refused value's code its own."""
    if method != "GET" or not path.startswith("/v1/") or type(exc) is not InvalidRequest:
        return exc
    named = json_field_names(exc)
    if all(f["field"].split(".")[0] in query_names for f in named.errors):
        return BadQuery(named.errors, hint=named.hint)
    return exc


def http_status(exc: EvqError) -> int:
    if isinstance(exc, (BadRequest, BadQuery)):
        return exc.http_status
    if isinstance(exc, TooManyFailures):
        return 429
    if isinstance(exc, Forbidden):
        return 403
    return STATUS.get(exc.code, 500)


def error_body(exc: EvqError, timer: Timer | None) -> tuple[int, dict[str, Any], dict[str, str]]:
    """(status, the contract's error body, headers) for an error."""
    if isinstance(exc, InvalidRequest) and not isinstance(exc, (BadRequest, BadQuery)):
        exc = json_field_names(exc)
    if isinstance(exc, TooManyFailures):
        headers = {"Retry-After": str(exc.retry_after)}
    elif isinstance(exc, AuthFailed) and not isinstance(exc, Forbidden):
        headers = {"WWW-Authenticate": 'Bearer realm="evq"'}
    else:
        headers = {}
    return http_status(exc), failure(exc, (timer or Timer()).meta()), headers


def bearer_key(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


async def read_json(receive_body: Callable[[], Awaitable[bytes]], content_type: str | None) -> Any:
    media = (content_type or "").split(";")[0].strip().lower()
    if media != "application/json" and not (media.startswith("application/") and media.endswith("+json")):
        raise BadRequest(
            415, "Content-Type", f"send a JSON body with Content-Type: application/json (got {media[:60] or 'none'})"
        )
    body = await receive_body()
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise BadRequest(400, "$body", "the body is not UTF-8") from None
    try:
        value = jsontext.loads(text)
    except jsontext.BadNumbers as exc:
        raise InvalidRequest([{"field": path, "message": message} for path, message in exc.fields]) from None
    except RecursionError:
        raise BadRequest(400, "$body", f"JSON nested deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError as exc:
        raise BadRequest(400, "$body", f"malformed JSON: {str(exc)[:200]}") from None
    if _depth(value) > MAX_JSON_DEPTH:
        raise BadRequest(400, "$body", f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
    return value


def _depth(value: Any) -> int:
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = list(item.values())
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, depth)
        if deepest > MAX_JSON_DEPTH:
            return deepest
        stack.extend((child, depth + 1) for child in children)
    return deepest


class Guard:
    """Pure ASGI middleware: a timer for the contract's meta, the body size limit (413
    before the app reads a byte when Content-Length says so, and while reading when it
    does not), NUL refused in paths and queries, and headers every answer carries (and every
    /ops answer its Server-Timing)."""

    def __init__(self, app: ASGIApp, *, max_body: int):
        self.app = app
        self.max_body = max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        timer = Timer()
        scope.setdefault("state", {})["timer"] = timer
        refusal = self._refusal(scope)
        if refusal is not None:
            status, body, headers = error_body(refusal, timer)
            await _send_json(send, status, body, headers)
            return
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_body:
                    raise _too_large(self.max_body)
            return message

        page = scope["path"].startswith("/ops")

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers += [(b"x-content-type-options", b"nosniff"), (b"referrer-policy", b"no-referrer")]
                if page:
                    headers += [(b"content-security-policy", PAGE_CSP.encode()), (b"x-frame-options", b"DENY")]
                    # The server's time until the answer starts (the body is rendered by then):
                    # what `evq bench --mode ops-pages` reads, and a browser's devtools show.
                    headers.append((b"server-timing", server_timing(timer).encode()))
                    if not any(name == b"cache-control" for name, _ in headers):
                        headers.append((b"cache-control", b"no-store"))
                message["headers"] = headers
            await send(message)

        await self.app(scope, limited, with_headers)

    def _refusal(self, scope: Scope) -> EvqError | None:
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    length = int(value)
                except ValueError:
                    return BadRequest(400, "Content-Length", "not a number")
                if length > self.max_body:
                    return _too_large(self.max_body)
        raw_path = scope.get("raw_path") or scope["path"].encode()
        if b"%00" in raw_path or "\x00" in scope["path"] or b"%00" in scope.get("query_string", b""):
            return BadRequest(400, "$path", "NUL is not allowed in a path or query")
        return None


def server_timing(timer: Timer) -> str:
    """``app;dur=<ms>``: the request's time so far (the contract's timer, started as it arrived),
    in milliseconds with fractions, as the Server-Timing header spells a duration; then each
    part the page timed (``Timer.part``: the overview's ``read`` and ``draw``), so an operator's
    devtools show whether the database or the drawing took the time. ``app`` stays first: it
    is what `evq bench --mode ops-pages` reads."""
    entries = [f"app;dur={(time.perf_counter() - timer.started) * 1000:.2f}"]
    entries += [f"{name};dur={ms:.2f}" for name, ms in timer.parts.items()]
    return ", ".join(entries)


# Scripts only from evq serve's own files (ops/web/static/*.js, optional helpers): no inline
# script, so a value that slipped through as markup still cannot run. connect-src 'self': the
# lists' live refresh reads the page's own address.
PAGE_CSP = (
    "default-src 'none'; style-src 'self'; img-src 'self'; script-src 'self'; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)


def _too_large(limit: int) -> BadRequest:
    return BadRequest(413, "$body", f"the body is larger than {limit} bytes (EVQ_SERVE_MAX_BODY)")


async def _send_json(send: Send, status: int, body: dict[str, Any], headers: dict[str, str]) -> None:
    payload = to_json(body).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    raw += [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": payload})
