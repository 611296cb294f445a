"""A local Resend-style email API for the tests and the demo, able to fail the ways evq must classify.

A real HTTP server (stdlib ``ThreadingHTTPServer``, in its own thread, on 127.0.0.1
and a free port by default) with the wire format of adapters/http/provider.py:
``POST /emails`` (Bearer auth, ``Idempotency-Key``), ``GET /emails/{id}`` and
``GET /emails?tag=NAME:VALUE``. It keeps every message it accepted and really
deduplicates: within ``dedupe_window`` seconds of the first request with a key, the
same key and body get the first answer again without a second message; the same
key with another body gets 409 ``invalid_idempotent_request``.

Faults, for ``POST /emails``, are injected two ways:

* by recipient local part, so a demo request can ask for one with an address:
  ``lose-reply@…`` (reset), ``slow@…``, ``reject@…`` (422), ``tempfail@…`` (500);
* programmatically: ``server.fault = "reset"`` (every request until reset to None)
  or ``server.queue_fault("429", times=2)`` (the next requests, FIFO).

"reset", "slow" and "502" store the message (and its key) *before* the answer is
lost, because that is the case evq exists for: the provider took it, the client
never heard. ``server.lookup_fault`` changes how lookups answer ("500", "no-tags":
the list omits tags, "ignore-filter": the list ignores the tag filter, "no-headers": neither the
list nor a message shows its headers, as a provider may not).

Rate limiting, as a provider does it: with ``rate_limit=N`` (``--rate-limit N``) a
``POST /emails`` beyond N in the last ``rate_window`` seconds (default 1) gets 429
with ``Retry-After`` and is not stored. Every request's arrival (``at``, Unix time)
is kept, so a test can count requests per window.

    python -m evq.ops.dev.http --port 8025 --api-key devhttp-key
"""

from __future__ import annotations

import argparse
import hashlib
import json
import socket
import struct
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar
from urllib.parse import parse_qs, urlsplit

from evq.ops.dev import server as devserver

FAULTS: dict[str, str] = {
    "reset": "store the message, then reset the connection instead of answering",
    "slow": "store the message, then wait N seconds before answering",
    "502": "store the message, then answer 502 from a gateway (HTML, not the provider's JSON)",
    "429": "429 rate limited, with Retry-After (nothing stored)",
    "500": "500 with the provider's JSON error (nothing stored)",
    "409-in-progress": "409 concurrent_idempotent_requests (nothing stored)",
    "409-key-reused": "409 invalid_idempotent_request (nothing stored)",
    "400": "400 validation error",
    "422": "422 validation error",
}
LOOKUP_FAULTS = ("500", "no-tags", "ignore-filter", "no-headers")
_BY_ADDRESS = {"lose-reply": "reset", "slow": "slow", "reject": "422", "tempfail": "500"}
MAX_KEY = 256


@dataclass(frozen=True, slots=True)
class Fault(devserver.Fault):
    """A fault of this server; ``seconds`` is how long for "slow", the Retry-After for "429"."""

    KNOWN: ClassVar[Mapping[str, str]] = FAULTS


def fault_for_address(address: str) -> Fault | None:
    local = address.rsplit("<", 1)[-1].rsplit("@", 1)[0].lower().split("+", 1)[0]
    mode = _BY_ADDRESS.get(local)
    return Fault(mode) if mode else None


@dataclass
class _Key:
    digest: str  # of the request body
    status: int
    answer: dict[str, Any]
    first_seen: float


class DevHttpServer(devserver.FaultInjection):
    """A threaded Resend-style API on loopback with real deduplication and fault injection."""

    fault_type = Fault

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        api_key: str = "devhttp-key",
        dedupe_window: float | None = 86400.0,
        slow_seconds: float = 5.0,
        retry_after: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        on_message: Callable[[dict[str, Any]], None] | None = None,
        rate_limit: int | None = None,
        rate_window: float = 1.0,
    ):
        self.host = host
        self._port = port
        self.api_key = api_key
        self.dedupe_window = dedupe_window
        self.slow_seconds = slow_seconds
        self.retry_after = retry_after
        self.clock = clock
        self.on_message = on_message
        self.rate_limit = rate_limit
        self.rate_window = rate_window
        self._posts_at: list[float] = []  # arrivals of POSTs inside the rate window (monotonic)
        self.lookup_fault: str | None = None
        self._lock = threading.Condition()
        self._messages: list[dict[str, Any]] = []
        self._keys: dict[str, _Key] = {}
        self._requests: list[dict[str, Any]] = []
        self._init_faults()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._stopped = threading.Event()

    # -- lifecycle -----------------------------------------------------------

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self._port}"

    def start(self) -> DevHttpServer:
        if self._server is not None:
            raise RuntimeError("DevHttpServer is already running")
        self._stopped.clear()
        server = _Server((self.host, self._port), _Handler, self)
        self._port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        self._stopped.set()  # wakes "slow" answers
        server.shutdown()
        server.drop_connections()
        server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    # -- faults ----------------------------------------------------------------

    def _next_fault(self, body: dict[str, Any]) -> Fault | None:
        with self._lock:
            fault = self._pop_queued() or self._fault
        if fault is not None:
            return fault
        recipients = [r for field in ("to", "cc", "bcc") for r in body.get(field) or () if isinstance(r, str)]
        return next((f for f in map(fault_for_address, recipients) if f is not None), None)

    # -- what arrived -------------------------------------------------------------

    @property
    def messages(self) -> list[dict[str, Any]]:
        """Messages accepted (one per send the provider would deliver), oldest first."""
        with self._lock:
            return list(self._messages)

    @property
    def requests(self) -> list[dict[str, Any]]:
        """Every request received: method, path, idempotency_key, status answered (None: no answer)."""
        with self._lock:
            return list(self._requests)

    def posts(self, idempotency_key: str | None = None) -> list[dict[str, Any]]:
        return [
            r
            for r in self.requests
            if r["method"] == "POST" and (idempotency_key is None or r["idempotency_key"] == idempotency_key)
        ]

    def by_message_id(self) -> dict[str, int]:
        """How many times each (evq) Message-ID was accepted: a duplicate send shows as 2."""
        with self._lock:
            return dict(Counter(m["headers"].get("X-Evq-Message-Id") for m in self._messages))

    def wait_for(self, count: int, timeout: float = 5.0) -> list[dict[str, Any]]:
        with self._lock:
            if not self._lock.wait_for(lambda: len(self._messages) >= count, timeout):
                raise TimeoutError(f"{len(self._messages)} of {count} messages after {timeout:g}s")
            return list(self._messages)

    def forget_keys(self) -> None:
        """As if every dedupe window had passed."""
        with self._lock:
            self._keys.clear()

    # -- the API ---------------------------------------------------------------------

    def _log_request(self, method: str, path: str, key: str | None) -> dict[str, Any]:
        entry = {"method": method, "path": path, "idempotency_key": key, "status": None, "at": time.time()}
        with self._lock:
            self._requests.append(entry)
        return entry

    def _post(self, raw: bytes, key: str | None) -> tuple[int, dict[str, Any], Fault | None]:
        """(status, JSON answer, fault to apply to the answer) for one POST /emails."""
        try:
            body = json.loads(raw)
            if not isinstance(body, dict):
                raise ValueError("not an object")
        except ValueError:
            return 400, _error(400, "invalid_json", "the body is not a JSON object"), None
        if key is not None and not 1 <= len(key) <= MAX_KEY:
            return 400, _error(400, "invalid_idempotency_key", f"keys are 1 to {MAX_KEY} characters"), None
        fault = self._next_fault(body) or self._over_rate()
        mode = fault.mode if fault else None
        if mode in ("400", "422"):
            return int(mode), _error(int(mode), "validation_error", "the request was refused (fault)"), None
        if mode == "429":
            return 429, _error(429, "rate_limit_exceeded", "too many requests (fault)"), fault
        if mode == "500":
            return 500, _error(500, "internal_server_error", "something failed (fault)"), None
        if mode == "409-in-progress":
            return 409, _error(409, "concurrent_idempotent_requests", "the original request is in progress"), None
        if mode == "409-key-reused":
            return 409, _error(409, "invalid_idempotent_request", "same key, different payload (fault)"), None
        problem = _invalid(body)
        if problem:
            return 422, _error(422, "validation_error", problem), None
        digest = hashlib.sha256(raw).hexdigest()
        now = self.clock()
        with self._lock:
            known = self._keys.get(key) if key is not None else None
            if known is not None and self.dedupe_window is not None and now - known.first_seen < self.dedupe_window:
                if known.digest != digest:
                    return 409, _error(409, "invalid_idempotent_request", "same key, different payload"), None
                return known.status, known.answer, None  # a replay: nothing sent again
            message = self._store(body, key)
            answer = {"id": message["id"]}
            if key is not None and self.dedupe_window is not None:
                self._keys[key] = _Key(digest=digest, status=200, answer=answer, first_seen=now)
        if self.on_message is not None:
            self.on_message(message)
        return 200, answer, fault  # "reset", "slow", "502": stored, the answer may still be lost

    def _over_rate(self) -> Fault | None:
        """A 429 when this POST is beyond ``rate_limit`` in the last ``rate_window`` seconds."""
        if self.rate_limit is None:
            return None
        now = time.monotonic()
        with self._lock:
            # Refused requests count too, as at a real provider: a storm keeps itself refused.
            self._posts_at = [t for t in self._posts_at if now - t < self.rate_window]
            self._posts_at.append(now)
            if len(self._posts_at) <= self.rate_limit:
                return None
            wait = self.rate_window - (now - self._posts_at[-self.rate_limit - 1])
        return Fault("429", max(1.0, round(wait)))

    def _store(self, body: dict[str, Any], key: str | None) -> dict[str, Any]:
        message = {
            "object": "email",
            "id": devserver.dev_id(),
            "idempotency_key": key,
            "from": body.get("from"),
            "to": body.get("to"),
            "cc": body.get("cc") or [],
            "bcc": body.get("bcc") or [],
            "subject": body.get("subject"),
            "text": body.get("text"),
            "html": body.get("html"),
            "headers": body.get("headers") or {},
            "tags": body.get("tags") or [],
            "created_at": datetime.now(UTC).isoformat(),
            "last_event": "delivered",
        }
        self._messages.append(message)
        self._lock.notify_all()
        return message

    def _get_one(self, email_id: str) -> tuple[int, dict[str, Any]]:
        with self._lock:
            found = next((m for m in self._messages if m["id"] == email_id), None)
        if found is None:
            return 404, _error(404, "not_found", "email not found")
        return 200, self._shown(_public(found))

    def _shown(self, item: dict[str, Any]) -> dict[str, Any]:
        if self.lookup_fault == "no-headers":
            return {k: v for k, v in item.items() if k != "headers"}
        return item

    def _list(self, tag: str | None) -> tuple[int, dict[str, Any]]:
        if self.lookup_fault == "500":
            return 500, _error(500, "internal_server_error", "lookup failed (fault)")
        name, _, value = (tag or "").partition(":")
        with self._lock:
            messages = list(self._messages)
        if self.lookup_fault != "ignore-filter":
            messages = [
                m for m in messages if any(t.get("name") == name and t.get("value") == value for t in m["tags"])
            ]
        items = [self._shown(_public(m)) for m in messages]
        if self.lookup_fault == "no-tags":
            items = [{k: v for k, v in item.items() if k != "tags"} for item in items]
        return 200, {"object": "list", "data": items}


def _public(message: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in message.items() if k not in ("idempotency_key", "text", "html")}


def _error(status: int, name: str, message: str) -> dict[str, Any]:
    return {"statusCode": status, "name": name, "message": message}


def _invalid(body: dict[str, Any]) -> str | None:
    if not isinstance(body.get("from"), str) or not body["from"]:
        return "from is required"
    if not isinstance(body.get("to"), list) or not body["to"]:
        return "to must be a non-empty list"
    if not isinstance(body.get("subject"), str):
        return "subject is required"
    if body.get("text") is None and body.get("html") is None:
        return "text or html is required"
    return None


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self, address: tuple[str, int], handler: type, sink: DevHttpServer):
        super().__init__(address, handler)
        self.sink = sink
        self._open: set[socket.socket] = set()
        self._resets: set[socket.socket] = set()
        self._guard = threading.Lock()

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        with self._guard:
            self._open.add(request)
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._guard:
                self._open.discard(request)

    def reset_on_close(self, request: socket.socket) -> None:
        # Linger 0 makes close() send RST; skipping the polite shutdown keeps a FIN from going first.
        request.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        with self._guard:
            self._resets.add(request)

    def shutdown_request(self, request: Any) -> None:
        with self._guard:
            reset = request in self._resets
            self._resets.discard(request)
        if reset:
            self.close_request(request)
        else:
            super().shutdown_request(request)

    def drop_connections(self) -> None:
        with self._guard:
            live = list(self._open)
        for sock in live:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Clients that time out and hang up are part of the job; anything else is a bug to show.
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server
    timeout = 30  # an idle keep-alive connection ends on its own

    def log_message(self, format: str, *args: Any) -> None:
        return None

    @property
    def sink(self) -> DevHttpServer:
        return self.server.sink

    def _authorized(self) -> bool:
        return self.headers.get("Authorization") == f"Bearer {self.sink.api_key}"

    def do_POST(self) -> None:
        key = self.headers.get("Idempotency-Key")
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        entry = self.sink._log_request("POST", self.path, key)
        if not self._authorized():
            return self._answer(entry, 401, _error(401, "invalid_api_key", "API key is invalid"))
        if urlsplit(self.path).path != "/emails":
            return self._answer(entry, 404, _error(404, "not_found", "no such endpoint"))
        status, answer, fault = self.sink._post(raw, key)
        mode = fault.mode if fault else None
        if mode == "reset":
            self.close_connection = True
            self.server.reset_on_close(self.connection)
            return None
        if mode == "slow":
            seconds = fault.seconds if fault and fault.seconds is not None else self.sink.slow_seconds
            if self.sink._stopped.wait(seconds):
                self.close_connection = True
                return None
        if mode == "502":
            return self._answer(entry, 502, None, html="<html><body>502 Bad Gateway</body></html>")
        headers = {}
        if mode == "429":
            seconds = fault.seconds if fault and fault.seconds is not None else self.sink.retry_after
            headers["Retry-After"] = f"{seconds:g}"
        return self._answer(entry, status, answer, headers=headers)

    def do_GET(self) -> None:
        parts = urlsplit(self.path)
        entry = self.sink._log_request("GET", self.path, None)
        if not self._authorized():
            return self._answer(entry, 401, _error(401, "invalid_api_key", "API key is invalid"))
        if parts.path == "/emails":
            tag = (parse_qs(parts.query).get("tag") or [None])[0]
            status, answer = self.sink._list(tag)
        elif parts.path.startswith("/emails/"):
            status, answer = self.sink._get_one(parts.path.removeprefix("/emails/"))
        else:
            status, answer = 404, _error(404, "not_found", "no such endpoint")
        return self._answer(entry, status, answer)

    def _answer(
        self,
        entry: dict[str, Any],
        status: int,
        answer: dict[str, Any] | None,
        *,
        headers: dict[str, str] | None = None,
        html: str | None = None,
    ) -> None:
        data = (html or json.dumps(answer)).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "text/html" if html is not None else "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)
            entry["status"] = status
        except OSError:
            self.close_connection = True  # the client hung up (it timed out): nothing to tell it


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m evq.ops.dev.http", description="A local Resend-style email API that keeps what it receives."
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument(
        "--port", type=devserver.port_number, default=8025, help="port to listen on, 1 to 65535 or 0 for a free one"
    )
    parser.add_argument("--api-key", default="devhttp-key")
    parser.add_argument("--dedupe-window", type=float, default=86400.0, help="seconds a key is honoured (0: never)")
    parser.add_argument("--fault", choices=sorted(FAULTS), help="fail every send this way")
    parser.add_argument("--rate-limit", type=int, help="answer 429 to POSTs beyond this many per second")
    args = parser.parse_args(argv)

    def show(message: dict[str, Any]) -> None:
        print(
            f"received {message['id']} from {message['from']} to {', '.join(message['to'])}",
            file=sys.stderr,
            flush=True,
        )

    problem = devserver.cannot_listen(args.host, args.port)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return devserver.EXIT_CANNOT_LISTEN
    server = DevHttpServer(
        args.host,
        args.port,
        api_key=args.api_key,
        dedupe_window=args.dedupe_window or None,
        on_message=show,
        rate_limit=args.rate_limit,
    )
    return devserver.serve_until_interrupted(server, args.fault, lambda: server.url)


if __name__ == "__main__":
    raise SystemExit(main())
