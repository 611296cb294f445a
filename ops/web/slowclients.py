"""Slow clients cannot hold `evq serve`: read deadlines and a connection cap, in the
HTTP protocol itself (uvicorn's h11 protocol, which has neither).

- **Headers**: a request's line and headers must be in within ``header_timeout``
  seconds, counted from the connection (or from the first byte of a later request on
  a kept-alive connection; an idle one is uvicorn's keep-alive timeout's). A client
  trickling a header a byte at a time (slowloris) gets 408 and is closed.
- **Body**: once the headers are in, the whole body must arrive within
  ``body_timeout`` seconds; otherwise 408 and closed (the app, waiting to read it,
  sees the client gone).
- **Answers**: an answer the client does not take in (it stopped reading, with requests
  pipelined behind it, or a tiny receive window) may wait ``body_timeout`` seconds for
  the socket to take more; then the connection is closed. Otherwise such a connection
  counts as "being answered" for ever, which the cap below never closes.
- **Connections**: at most ``max_connections`` are held. One more makes room by
  closing the connection that has waited longest on its client (reading headers or
  a body, or idle between requests), never one whose request is in and being
  answered; when every connection is being answered, the newcomer gets 503. A
  legitimate request sends its headers at once, so it is never the one waiting
  longest: it gets through however many sockets a slow client holds. Keep the cap
  under the process's open-file limit (``ulimit -n``): past that limit the server
  could accept nobody, and nothing here could help.

Deadlines are for the whole phase, not per read: a byte every second keeps no
connection alive.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from evq.ops.app.contract import to_json
from evq.ops.web.protocol import BadRequest, error_body
from evq.worker import metrics
from evq.worker.errors import DatabaseUnavailable


class GuardedH11(H11Protocol):
    """uvicorn's h11 protocol with the deadlines and the cap; :func:`protocol` sets the numbers."""

    header_timeout: float = 10.0
    body_timeout: float = 30.0
    max_connections: int = 512

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._deadline: asyncio.TimerHandle | None = None
        self._phase: str | None = None
        self._partial = False  # bytes of a request whose headers are not complete yet
        self._unread: asyncio.TimerHandle | None = None  # armed while the client takes in no answer
        self.waiting_since: float | None = time.monotonic()
        super().connection_made(transport)
        self._arm("headers", self.header_timeout)
        if len(self.connections) > self.max_connections:
            self._make_room()

    def data_received(self, data: bytes) -> None:
        if self.conn.their_state is h11.IDLE:
            self._partial = True
            if self._phase != "headers":
                self._arm("headers", self.header_timeout)
        super().data_received(data)
        self._follow()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._follow()

    def pause_writing(self) -> None:
        """The socket takes no more of the answer: the client has ``body_timeout`` to read."""
        super().pause_writing()
        if self._unread is None:
            self._unread = self.loop.call_later(self.body_timeout, self._not_read)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._unread is not None:
            self._unread.cancel()
            self._unread = None

    def _not_read(self) -> None:
        self._unread = None
        if not self.transport.is_closing():
            metrics.labelled(metrics.SERVE_REFUSED, "unread").inc()
            # abort, not close: close would wait to flush the buffer the client never reads.
            self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._unread is not None:
            self._unread.cancel()
            self._unread = None
        self.waiting_since = None
        super().connection_lost(exc)

    def _follow(self) -> None:
        """Where the request is now: waiting for headers, for the body, or in the app's hands."""
        state = self.conn.their_state
        if state is h11.SEND_BODY:
            self._partial = False
            if self._phase != "body":
                self._arm("body", self.body_timeout)
        elif state is h11.IDLE:
            if self.waiting_since is None:  # a response is done: waiting on the client again
                self.waiting_since = time.monotonic()
                self._partial = False
                self._disarm()  # idle now: uvicorn's keep-alive timeout until a byte comes
        else:  # the request is in (or the connection is ending): the app's time, not the client's
            self._partial = False
            self._disarm()
            self.waiting_since = None

    def _arm(self, phase: str, seconds: float) -> None:
        self._disarm()
        self._phase = phase
        self.waiting_since = self.waiting_since or time.monotonic()
        self._deadline = self.loop.call_later(seconds, self._expired, phase)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline, self._phase = None, None

    def _expired(self, phase: str) -> None:
        self._deadline, self._phase = None, None
        if self.transport.is_closing():
            return
        seconds = self.header_timeout if phase == "headers" else self.body_timeout
        metrics.labelled(metrics.SERVE_REFUSED, {"headers": "header_timeout", "body": "body_timeout"}[phase]).inc()
        if phase == "body" or self._partial:
            setting = "EVQ_SERVE_HEADER_TIMEOUT" if phase == "headers" else "EVQ_SERVE_BODY_TIMEOUT"
            self._refuse(
                BadRequest(408, "$request", f"the request's {phase} did not arrive within {seconds:g} s ({setting})")
            )
        self.transport.close()

    def _refuse(self, error: Any) -> None:
        """An answer written straight to the socket, before the connection is closed: only
        when no response of the app has begun (it would be a second answer)."""
        if self.cycle is not None and self.cycle.response_started and not self.cycle.response_complete:
            return
        status, body, headers = error_body(error, None)
        payload = to_json(body).encode()
        head = [
            f"HTTP/1.1 {status} {'Request Timeout' if status == 408 else 'Service Unavailable'}",
            "Content-Type: application/json",
            f"Content-Length: {len(payload)}",
            "Connection: close",
        ]
        head += [f"{name}: {value}" for name, value in headers.items()]
        self.transport.write(("\r\n".join(head) + "\r\n\r\n").encode() + payload)

    def _make_room(self) -> None:
        waiting = [
            c
            for c in self.connections
            if c is not self
            and isinstance(c, GuardedH11)
            and c.waiting_since is not None
            and not c.transport.is_closing()
        ]
        if waiting:
            oldest = min(waiting, key=lambda c: c.waiting_since or 0.0)
            if oldest._partial or oldest._phase == "body":
                oldest._refuse(_full())
            oldest.transport.close()
            metrics.labelled(metrics.SERVE_REFUSED, "evicted").inc()
            return
        metrics.labelled(metrics.SERVE_REFUSED, "full").inc()
        self._refuse(_full())  # every connection is being answered: this one waits its turn elsewhere
        self.transport.close()


class ServerFull(DatabaseUnavailable):
    """503, "not now, try again": the contract's code for a server that cannot take the
    request at the moment (E_DB_UNAVAILABLE), here because its connections are all taken."""


def _full() -> ServerFull:
    return ServerFull(
        "the server holds as many connections as it may (EVQ_SERVE_MAX_CONNECTIONS)", hint="try again in a moment"
    )


def protocol(*, header_timeout: float, body_timeout: float, max_connections: int) -> type[GuardedH11]:
    """The protocol class to give uvicorn (``uvicorn.Config(http=...)``)."""
    return type(
        "EvqH11",
        (GuardedH11,),
        {
            "header_timeout": header_timeout,
            "body_timeout": body_timeout,
            "max_connections": max_connections,
        },
    )


def uvicorn_config(app: Any, settings: Any, **options: Any) -> Any:
    """uvicorn's config for `evq serve` (and the tests that serve its app): the guarded protocol."""
    import uvicorn

    return uvicorn.Config(
        app,
        http=protocol(
            header_timeout=settings.serve_header_timeout,
            body_timeout=settings.serve_body_timeout,
            max_connections=settings.serve_max_connections,
        ),
        # uvicorn would take X-Forwarded-For from any loopback peer as the client's address, so a
        # local client, or anyone behind a TLS terminator or proxy that passes the header through,
        # would pick its own address for every guess and never be throttled (ops/web/throttle.py).
        proxy_headers=False,
        **options,
    )
