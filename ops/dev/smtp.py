"""A local SMTP sink for the tests and the demo, able to fail the ways evq must classify.

It runs aiosmtpd in its own thread on 127.0.0.1 (a free port by default) and keeps
every message it accepted. Faults are injected two ways:

* by recipient local part, so a demo request can ask for one with an address:
  ``lose-reply@…``, ``tempfail@…``, ``tempfail-data@…``, ``reject@…``,
  ``reject-data@…``, ``slow@…`` (``slow-2.5@…`` for 2.5 s), ``hold@…``;
  a ``+tag`` is ignored (``reject+alice@…``). RCPT faults (``tempfail``,
  ``reject``) hit only that recipient; DATA faults hit the whole message.
* programmatically: ``server.fault = "tempfail"`` (every connection until reset to
  None) or ``server.queue_fault("lose-reply")`` (the next connection only, FIFO).
  ``slow-ehlo`` exists only here: it stalls before DATA, where no address is known.

"lose-reply", "slow" and "hold" store the message *before* the final reply is
withheld, because that is the case evq exists for: the server took it, the client
never heard. "refuse" is simply :meth:`DevSmtpServer.stop`.

    python -m evq.ops.dev.smtp --host 127.0.0.1 --port 2525
"""

from __future__ import annotations

import argparse
import asyncio
import hmac
import re
import sys
import threading
import weakref
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from email.parser import BytesHeaderParser
from ssl import SSLContext
from typing import Any, ClassVar

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, AuthResult, Envelope, LoginPassword, Session

from evq.ops.dev import server as devserver

FAULTS: dict[str, str] = {
    "lose-reply": "store the message, then drop the connection instead of the final 250",
    "tempfail": "451 at RCPT",
    "tempfail-data": "451 after the final '.'",
    "reject": "550 at RCPT",
    "reject-data": "554 after the final '.'",
    "slow": "store the message, then wait N seconds before the final 250",
    "hold": "store the message, then wait for release() before the final 250",
    "slow-ehlo": "wait N seconds before answering EHLO (programmatic only)",
}
_RCPT = frozenset({"tempfail", "reject"})
_DATA = frozenset({"lose-reply", "tempfail-data", "reject-data", "slow", "hold"})
_SLOW_N = re.compile(r"^slow-(\d+(?:\.\d+)?)$")


@dataclass(frozen=True, slots=True)
class Fault(devserver.Fault):
    """A fault of this server; ``seconds`` is for "slow" and "slow-ehlo"."""

    KNOWN: ClassVar[Mapping[str, str]] = FAULTS


def fault_for_address(address: str) -> Fault | None:
    """The fault a recipient address asks for, if its local part names one."""
    local = address.rsplit("@", 1)[0].lower().split("+", 1)[0]
    if local in _RCPT or local in _DATA:
        return Fault(local)
    match = _SLOW_N.match(local)
    return Fault("slow", float(match.group(1))) if match else None


class _Controller(Controller):
    def __init__(self, sink: DevSmtpServer, **kwargs: Any):
        super().__init__(_Handler(sink), **kwargs)
        self._sink = sink

    def factory(self) -> SMTP:
        smtpd = super().factory()
        self._sink._connections.add(smtpd)
        return smtpd

    def _trigger_server(self) -> None:
        # Bound to port 0: learn the real port before the base class dials it.
        # (Asking the OS for a free port first and binding later would race.)
        assert self.server is not None
        self.port = self.server.sockets[0].getsockname()[1]
        super()._trigger_server()


class DevSmtpServer(devserver.FaultInjection):
    """A threaded SMTP sink on loopback with fault injection; a context manager."""

    fault_type = Fault

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        auth: tuple[str, str] | None = None,
        tls_context: SSLContext | None = None,
        ssl_context: SSLContext | None = None,
        smtputf8: bool = True,
        slow_seconds: float = 5.0,
        hostname: str = "devsmtp.evq.test",
        on_message: Callable[[dict[str, Any]], None] | None = None,
        max_recipients: int | None = None,
    ):
        """``tls_context`` offers STARTTLS; ``ssl_context`` makes the port implicit TLS.

        With ``auth`` the server offers AUTH PLAIN/LOGIN and refuses MAIL with 530 until
        the client authenticated (over STARTTLS when ``tls_context`` is given).
        With ``max_recipients`` a transaction takes that many RCPTs and answers the next
        ``452 4.5.3`` (as Postfix's smtpd_recipient_limit does).
        """
        self.host = host
        self._port = port
        self.slow_seconds = slow_seconds
        self.on_message = on_message
        self.max_recipients = max_recipients
        self._auth = auth
        self._lock = threading.Condition()
        self._messages: list[dict[str, Any]] = []
        self._init_faults()
        self._session_faults: weakref.WeakKeyDictionary[Session, Fault | None] = weakref.WeakKeyDictionary()
        self._connections: weakref.WeakSet[SMTP] = weakref.WeakSet()
        self._held = 0
        self._release_generation = 0
        self._kwargs: dict[str, Any] = dict(
            hostname=host,
            server_hostname=hostname,
            enable_SMTPUTF8=smtputf8,
            ssl_context=ssl_context,
            tls_context=tls_context,
            # AUTH is enforced in handle_MAIL rather than with auth_required=True,
            # which warns when TLS is not required too (and warnings fail the tests).
            auth_require_tls=tls_context is not None,
            authenticator=self._authenticate if auth else None,
        )
        self._controller: _Controller | None = None

    # -- lifecycle -----------------------------------------------------------

    @property
    def port(self) -> int:
        """The bound port; after stop() still the last one, so a client then meets a refusal."""
        return self._port

    def start(self) -> DevSmtpServer:
        """Listen; after a stop(), on the same port again (a server coming back)."""
        if self._controller is not None:
            raise RuntimeError("DevSmtpServer is already running")
        # A controller's loop is closed when it stops, so each start gets a new one.
        controller = _Controller(self, port=self._port, **self._kwargs)
        controller.start()
        self._controller = controller
        self._port = controller.port
        return self

    def stop(self) -> None:
        controller, self._controller = self._controller, None
        if controller is None:
            return
        # Close live connections first so no transport outlives its loop (which
        # would surface as a ResourceWarning, an error under the test settings).
        # Held and slow conversations end without their final reply, like a crash.
        asyncio.run_coroutine_threadsafe(self._drop_connections(), controller.loop).result(timeout=5)
        controller.stop()

    async def _drop_connections(self) -> None:
        for smtpd in list(self._connections):
            if smtpd.transport is not None:
                smtpd.transport.abort()
        for _ in range(3):
            await asyncio.sleep(0)

    # -- faults --------------------------------------------------------------

    def release(self) -> None:
        """Let every conversation stopped by "hold" send its final reply."""
        with self._lock:
            self._release_generation += 1
            self._lock.notify_all()

    @property
    def held(self) -> int:
        with self._lock:
            return self._held

    def wait_held(self, count: int = 1, timeout: float = 5.0) -> None:
        """Block until ``count`` conversations are held before their final reply."""
        with self._lock:
            if not self._lock.wait_for(lambda: self._held >= count, timeout):
                raise TimeoutError(f"{self._held} of {count} conversations held after {timeout:g}s")

    def _session_fault(self, session: Session) -> Fault | None:
        with self._lock:
            if session not in self._session_faults:
                self._session_faults[session] = self._pop_queued()
            return self._session_faults[session] or self._fault

    def _seconds(self, fault: Fault) -> float:
        return self.slow_seconds if fault.seconds is None else fault.seconds

    # -- messages ------------------------------------------------------------

    @property
    def messages(self) -> list[dict[str, Any]]:
        """A snapshot of what was received, oldest first."""
        with self._lock:
            return list(self._messages)

    def wait_for(self, count: int, timeout: float = 5.0) -> list[dict[str, Any]]:
        with self._lock:
            if not self._lock.wait_for(lambda: len(self._messages) >= count, timeout):
                raise TimeoutError(f"{len(self._messages)} of {count} messages after {timeout:g}s")
            return list(self._messages)

    def by_message_id(self) -> dict[str, int]:
        """How many times each Message-ID arrived: a duplicate send shows as 2."""
        with self._lock:
            return dict(Counter(m["message_id"] for m in self._messages))

    def clear(self) -> None:
        with self._lock:
            self._messages.clear()

    def _store(self, envelope: Envelope) -> dict[str, Any]:
        data = envelope.original_content or b""
        message_id = BytesHeaderParser().parsebytes(data).get("Message-ID")
        record = {
            "message_id": " ".join(str(message_id).split()) if message_id else None,
            "mail_from": envelope.mail_from,
            "rcpt_tos": list(envelope.rcpt_tos),
            "data": bytes(data),
            "received_at": datetime.now(UTC),
            "queue_id": devserver.dev_id(),
        }
        with self._lock:
            self._messages.append(record)
            self._lock.notify_all()
        if self.on_message is not None:
            self.on_message(record)
        return record

    async def _hold(self) -> None:
        with self._lock:
            generation = self._release_generation
            self._held += 1
            self._lock.notify_all()
        try:
            # Polled because release() comes from another thread and this loop's
            # primitives are not thread-safe; 10 ms is plenty for tests.
            while True:
                with self._lock:
                    if self._release_generation != generation:
                        return
                await asyncio.sleep(0.01)
        finally:
            with self._lock:
                self._held -= 1
                self._lock.notify_all()

    def _authenticate(
        self, server: SMTP, session: Session, envelope: Envelope, mechanism: str, data: Any
    ) -> AuthResult:
        assert self._auth is not None
        user, password = (s.encode() for s in self._auth)
        ok = (
            isinstance(data, LoginPassword)
            and hmac.compare_digest(data.login, user)
            and hmac.compare_digest(data.password, password)
        )
        return AuthResult(success=ok, handled=False)


class _Handler:
    """aiosmtpd hooks; all state lives on the DevSmtpServer."""

    def __init__(self, sink: DevSmtpServer):
        self.sink = sink

    async def handle_EHLO(
        self, server: SMTP, session: Session, envelope: Envelope, hostname: str, responses: list[str]
    ) -> list[str]:
        fault = self.sink._session_fault(session)
        if fault is not None and fault.mode == "slow-ehlo":
            await asyncio.sleep(self.sink._seconds(fault))
        session.host_name = hostname  # the hook replaces the default, which sets it
        return responses

    async def handle_MAIL(
        self, server: SMTP, session: Session, envelope: Envelope, address: str, options: list[str]
    ) -> str:
        self.sink._session_fault(session)
        if self.sink._auth is not None and not session.authenticated:
            return "530 5.7.0 Authentication required"
        envelope.mail_from = address
        envelope.mail_options.extend(options)
        return "250 2.1.0 Ok"

    async def handle_RCPT(
        self, server: SMTP, session: Session, envelope: Envelope, address: str, options: list[str]
    ) -> str:
        limit = self.sink.max_recipients
        if limit is not None and len(envelope.rcpt_tos) >= limit:
            return "452 4.5.3 Error: too many recipients"
        fault = fault_for_address(address) or self.sink._session_fault(session)
        if fault is not None and fault.mode == "tempfail":
            return f"451 4.3.0 <{address}>: try again later (fault: tempfail)"
        if fault is not None and fault.mode == "reject":
            return f"550 5.1.1 <{address}>: recipient rejected (fault: reject)"
        envelope.rcpt_tos.append(address)
        envelope.rcpt_options.extend(options)
        return "250 2.1.5 Ok"

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        faults = [f for f in map(fault_for_address, envelope.rcpt_tos) if f is not None and f.mode in _DATA]
        session_fault = self.sink._session_fault(session)
        if session_fault is not None and session_fault.mode in _DATA:
            faults.append(session_fault)
        fault = faults[0] if faults else None
        mode = fault.mode if fault else None
        if mode == "tempfail-data":
            return "451 4.3.0 Try again later (fault: tempfail-data)"
        if mode == "reject-data":
            return "554 5.6.0 Message rejected (fault: reject-data)"
        record = self.sink._store(envelope)
        if mode == "lose-reply":
            assert server.transport is not None
            server.transport.abort()
            # connection_lost cancels this coroutine; the 250 is never written.
            await asyncio.Event().wait()
        elif mode == "slow":
            assert fault is not None
            await asyncio.sleep(self.sink._seconds(fault))
        elif mode == "hold":
            await self.sink._hold()
        return f"250 2.0.0 Ok: queued as {record['queue_id']}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m evq.ops.dev.smtp",
        description=(
            "A local SMTP sink that keeps what it receives and prints one line per message. "
            "It listens on 127.0.0.1:2525 unless told otherwise; point a worker at it with "
            "EVQ_SMTP_HOST=127.0.0.1 EVQ_SMTP_PORT=2525 (the worker's defaults are localhost:25, "
            "where nothing listens on most machines). It never delivers anything anywhere."
        ),
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    parser.add_argument(
        "--port",
        type=devserver.port_number,
        default=2525,
        help="port to listen on, 1 to 65535 or 0 for a free one (default: 2525; the worker's EVQ_SMTP_PORT)",
    )
    parser.add_argument("--fault", choices=sorted(FAULTS), help="fail every connection this way")
    parser.add_argument("--slow-seconds", type=float, default=5.0, help="delay for the slow faults")
    args = parser.parse_args(argv)

    def show(record: dict[str, Any]) -> None:
        print(
            f"received {record['message_id']} from {record['mail_from']} to {', '.join(record['rcpt_tos'])}",
            file=sys.stderr,
            flush=True,
        )

    problem = devserver.cannot_listen(args.host, args.port)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return devserver.EXIT_CANNOT_LISTEN
    server = DevSmtpServer(args.host, args.port, slow_seconds=args.slow_seconds, on_message=show)
    return devserver.serve_until_interrupted(server, args.fault, lambda: f"{server.host}:{server.port}")


if __name__ == "__main__":
    raise SystemExit(main())
