"""How far one SES send's HTTP exchange got (adapters/ses/provider.py sends it through httpx
with its trace events): whether a byte of the request was written, and the deadline's cut.

The hook refuses to begin a request once the send's ``send_by`` has passed (invariant 9) or
its deadline has cut it; a forward proxy's ``CONNECT``, whose events come through the same
hook, is not our request. The exceptions here are raised inside botocore's call and caught
by the provider, which turns each into an outcome."""

from __future__ import annotations

import socket
import threading
from collections.abc import Mapping
from typing import Any

from evq.adapters import answers
from evq.worker import deadline as limits

# httpcore's trace events: the last moment before the first byte, and the whole request written.
_REQUEST_STARTS = ("http11.send_request_headers.started", "http2.send_request_headers.started")
_REQUEST_WRITTEN = ("http11.send_request_body.complete", "http2.send_request_body.complete")
_CONNECTED = "connection.connect_tcp.complete"


class LeaseTooShort(Exception):
    """Raised from the trace hook before a byte of the request is written (invariant 9)."""


class Cut(Exception):
    """The send's deadline passed before the request began: it must never begin."""


class TransportFailed(Exception):
    """The HTTP exchange failed; ``written`` says whether the whole request had gone out."""

    def __init__(self, error: BaseException, written: bool):
        super().__init__(f"{type(error).__name__}: {error}")
        self.error = error
        self.written = written


class Attempt:
    """How far one send's HTTP exchange got, shared by its thread and the event loop."""

    def __init__(self, send_by: float | None, deadline: float | None):
        self.send_by = send_by
        self.deadline = deadline
        self.phase = "request"  # request -> writing -> written
        self.cut = False
        self._tunnel = False  # the request being written is a proxy's CONNECT
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()

    def trace(self, event: str, info: Mapping[str, Any]) -> None:
        if event == _CONNECTED:
            stream = info.get("return_value")
            sock = stream.get_extra_info("socket") if stream is not None else None
            with self._lock:
                self._sock = sock
                cut = self.cut
            if cut:
                self._shutdown()
        elif event in _REQUEST_STARTS:
            with self._lock:
                if self.cut:
                    raise Cut
                if not limits.may_send(self.send_by):
                    # Connecting may have taken the lease's time, or the process was paused.
                    raise LeaseTooShort
                # A proxy's CONNECT (its events come through the same hook) sends nothing to SES.
                self._tunnel = answers.is_tunnel(info)
                if not self._tunnel:
                    self.phase = "writing"
        elif event in _REQUEST_WRITTEN:
            with self._lock:
                if not self._tunnel:
                    self.phase = "written"

    @property
    def written(self) -> bool:
        with self._lock:
            return self.phase == "written"

    def cut_off(self) -> str:
        """From the loop, at the deadline: no request may begin any more; a live one is
        ended by shutting its socket down (a trickling peer defeats per-read timeouts).
        Returns the phase the exchange had reached."""
        with self._lock:
            self.cut = True
            phase = self.phase
        self._shutdown()
        return phase

    def _shutdown(self) -> None:
        with self._lock:
            sock = self._sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class Body:
    """The raw answer as botocore reads it (``stream()``)."""

    def __init__(self, content: bytes):
        self._content = content

    def stream(self, **_kwargs: Any) -> Any:
        yield self._content
