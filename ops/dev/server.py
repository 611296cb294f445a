"""What the dev servers (ops/dev/smtp.py, ops/dev/http.py) share: a fault, the
programmatic way to inject one — a standing fault for every request until reset,
or queued faults for the next requests in order of arrival — and running one from
the command line."""

from __future__ import annotations

import argparse
import errno
import secrets
import socket
import sys
import threading
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import ClassVar, Self

# The prefix of every id the dev servers hand out (the SMTP server's queue id in its final
# 250, the HTTP server's message id): visibly a test id, never the shape of a real
# provider's (Postfix's upper-case hex queue id, Resend's UUID), so evidence written
# against a dev server can never pass for a send a real provider accepted.
TEST_ID_PREFIX = "test_"


def dev_id() -> str:
    """A new id as the dev servers give them: ``test_`` and 24 lower-case hex digits (96 random bits)."""
    return TEST_ID_PREFIX + secrets.token_hex(12)


@dataclass(frozen=True, slots=True)
class Fault:
    mode: str
    # How long, for the modes that wait; None means the server's default.
    seconds: float | None = None

    KNOWN: ClassVar[Mapping[str, str]] = {}  # mode -> what it does, per server

    def __post_init__(self) -> None:
        if self.mode not in self.KNOWN:
            raise ValueError(f"unknown fault {self.mode!r}; known: {', '.join(self.KNOWN)}")


class FaultInjection:
    """Mixin for a dev server that is started and stopped, as a context manager too."""

    fault_type: ClassVar[type[Fault]] = Fault
    _lock: threading.Condition

    def _init_faults(self) -> None:
        self._fault: Fault | None = None
        self._queue: deque[Fault] = deque()

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def fault(self) -> Fault | None:
        with self._lock:
            return self._fault

    @fault.setter
    def fault(self, value: Fault | str | None) -> None:
        with self._lock:
            self._fault = self.fault_type(value) if isinstance(value, str) else value

    def queue_fault(self, mode: Fault | str, *, times: int = 1, seconds: float | None = None) -> None:
        """Fail the next ``times`` requests (connections, for SMTP), in order of arrival, with ``mode``."""
        fault = self.fault_type(mode) if isinstance(mode, str) else mode
        if seconds is not None:
            fault = self.fault_type(fault.mode, seconds)
        with self._lock:
            self._queue.extend([fault] * times)

    def _pop_queued(self) -> Fault | None:
        """The next queued fault, if any (the caller holds the lock)."""
        return self._queue.popleft() if self._queue else None


# The exit code of a dev server that cannot listen (EX_UNAVAILABLE, sysexits.h).
EXIT_CANNOT_LISTEN = 69


def port_number(text: str) -> int:
    """``--port`` of a dev server: an integer 0..65535 (0: a free port, as the tests use).

    An argparse type, so a bad port is argparse's usage error and exit 2, the code the
    ``evq`` command line gives a bad argument (E_INVALID_ARG), instead of the traceback
    ``socket.bind`` raises for 99999 ("port must be 0-65535") before anything could listen."""
    try:
        port = int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (an integer 1 to 65535)") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is out of range: a port is 1 to 65535 (0: a free one)")
    return port


def cannot_listen(host: str, port: int) -> str | None:
    """Why nothing could listen on ``host:port``, in one line, or None when it can.

    Tried before the server starts: a server thread that fails to bind surfaces only after
    its start-up timeout (5 s for aiosmtpd), as a traceback."""
    if port == 0:
        return None
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return f"{host}:{port} is in use (another sink already running?): stop it or pick another --port"
            return f"cannot listen on {host}:{port}: {exc.strerror or exc}"
    return None


def serve_until_interrupted(server: FaultInjection, fault: str | None, where: Callable[[], str]) -> int:
    """``python -m evq.ops.dev.smtp`` and ``evq.ops.dev.http``: run with a standing fault until Ctrl-C."""
    server.fault = fault
    with server:
        # The banner inside the try: a Ctrl-C sent the moment it appears (as a script or a test
        # does once it has read it) must still be a clean stop, not a traceback and exit -2.
        try:
            print(f"{type(server).__name__} listening on {where()} (Ctrl-C to stop)", file=sys.stderr, flush=True)
            threading.Event().wait()
        except KeyboardInterrupt:
            pass
    return 0
