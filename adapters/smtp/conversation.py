"""SMTP provider adapter: one conversation per attempt, classified by the phase it stopped in.

Why phase by phase instead of ``smtplib.SMTP.send_message``: the classification in
docs/design.md, "Adapters" (RFC 1047), depends on *where* a failure happened. Anything
before the final "." has been written cannot have been delivered, so it is safe to
retry; a lost connection or a timeout *after* it may mean the server queued the
message, so it is ``Unknown`` and never retried automatically.

smtplib is blocking, so each conversation runs in a thread of its own (a daemon:
a wedged peer can never keep the process alive, and never starves other sends of a
pool slot). Every socket operation is bounded by ``timeout`` and by what is left of
the request's deadline; since a peer trickling its reply a byte at a time defeats
per-read timeouts, a watchdog on the event loop shuts the socket down when the
deadline passes, which frees the thread (worker/deadline.py, invariant 9). The final
"." is written only after checking, after everything that could block, that the
request's ``send_by`` has not passed. The SMTP password is never put in an outcome,
a log line or a reason: replies and error texts are scrubbed of it (and of its
base64 forms) before they leave the worker thread.

The client it talks through (whole reply lines only, the greeting name, dot-stuffing, TLS) is
adapters/smtp/client.py; what a reply means and what of it is scrubbed, adapters/smtp/replies.py.
"""

from __future__ import annotations

import select
import smtplib
import socket
import ssl
import threading
from collections.abc import Container
from typing import TYPE_CHECKING, Any

from evq.adapters.smtp.client import IncompleteReply, Smtp, SmtpSsl, address_literal, default_helo, dot_stuff
from evq.adapters.smtp.message import Envelope
from evq.adapters.smtp.replies import (
    CONFIG_CODES,
    JOURNAL_SHOWN,
    SESSION_FAULTS,
    TOO_MANY,
    config_fault,
    helo_refused,
    is_temporary,
    journal_forms,
    queue_id,
    root_class,
    short,
    transport_fault,
)
from evq.worker import deadline as limits
from evq.worker.outcomes import Accepted, Outcome, Rejected, Retryable, Unknown
from evq.worker.ports import SendRequest

if TYPE_CHECKING:
    from evq.adapters.smtp.provider import SmtpProvider

MAX_REPLY = 500
_2YZ = range(200, 300)


class _Stop(Exception):
    """Ends a conversation early with a decided outcome (raised inside the worker thread).

    ``polite=False`` hangs up without QUIT: in the middle of DATA a QUIT would be
    message text, while a connection closed before the final "." discards it."""

    def __init__(self, outcome: Outcome, *, polite: bool = True):
        self.outcome = outcome
        self.polite = polite


class _Conversation:
    """One attempt: connect, EHLO, STARTTLS, AUTH, MAIL, RCPT, DATA, body, final reply."""

    def __init__(self, provider: SmtpProvider, envelope: Envelope, request: SendRequest):
        self.p = provider
        self.envelope = envelope
        self.deadline = request.deadline
        self.send_by = request.send_by
        self.phase = "connect"
        self.refused: dict[str, dict[str, Any]] = {}
        self.transactions: list[dict[str, Any]] = []  # accepted MAIL..DATA exchanges, in order
        self.deferred_by: dict[str, Any] | None = None  # the 452 that ended the current transaction's RCPTs
        # The journal recipient's answer (EVQ_SMTP_JOURNAL), once asked: evidence, never the outcome.
        self.journal: dict[str, Any] | None = None
        # This step's journal recipient, tagged (adapters/smtp/witness.py). The tag would let
        # its holder forge this step's proof: it, and the journal address, are scrubbed from
        # every reply kept (_text), and the address is never written in evidence.
        self.journal_rcpt = provider.journal_address(request.message_id)
        self._journal_forms = journal_forms(provider.journal, self.journal_rcpt)
        self.helo = ""
        self.conn: smtplib.SMTP | None = None
        self.cut = False  # the watchdog shut the socket down at the deadline
        self._lock = threading.Lock()

    def run(self) -> Outcome:
        polite = True
        try:
            outcome = self._talk()
        except _Stop as stop:
            outcome, polite = stop.outcome, stop.polite
        except Exception as exc:  # every failure must become one outcome
            outcome = self._failed(exc)
        self._hang_up(polite=polite and not self.cut and not isinstance(outcome, Unknown))
        return outcome

    def cut_off(self) -> None:
        """Called from the event loop when the deadline passes: end the conversation now.

        A shutdown (not a close: the thread still owns the descriptor) wakes a recv or
        send blocked in the thread, which then fails in the phase it had reached. The
        raw socket's shutdown is used even under TLS, so the SSL object the thread is
        using is not torn from under it."""
        with self._lock:
            self.cut = True
            sock = self.conn.sock if self.conn is not None else None
            if sock is not None:
                _quietly(lambda: socket.socket.shutdown(sock, socket.SHUT_RDWR))

    def _arm(self) -> None:
        # Before each command: no single operation may reach past the deadline.
        conn = self.conn
        if self.cut:
            raise TimeoutError("the send's deadline passed")
        if conn is not None and conn.sock is not None:
            conn.sock.settimeout(limits.bounded(self.p.timeout, self.deadline))

    def _commit_or_abort(self, sock: socket.socket) -> None:
        """The last moment before the final ".": wait (bounded by ``send_by``) until
        the dot can be written at once, then check the lease's time on the monotonic
        clock. Nothing after this check can block for long: the three bytes fit."""
        remaining = limits.left(self.send_by)
        writable = False
        if remaining is None or remaining > 0:
            # poll, not select: a busy worker's descriptors may be numbered past FD_SETSIZE.
            poller = select.poll()
            poller.register(sock, select.POLLOUT)
            events = poller.poll(None if remaining is None else max(1, int(remaining * 1000)))
            mask = events[0][1] if events else 0
            if mask & (select.POLLERR | select.POLLHUP | select.POLLNVAL):
                # The connection broke before the final ".": nothing can have been queued.
                raise ConnectionResetError("the connection broke before the final '.'")
            writable = bool(mask & select.POLLOUT)
        if not writable or not limits.may_send(self.send_by):
            left = limits.left(self.send_by)
            raise _Stop(
                Retryable(
                    "stopped before the final '.': the lease no longer leaves time to send and record "
                    f"({'-' if left is None else f'{left:.1f}'}s to its send-by limit); nothing was sent",
                    response=self._evidence(None, "", error_class="LeaseTooShort", sent=False),
                ),
                polite=False,
            )

    def _talk(self) -> Outcome:
        p, env = self.p, self.envelope
        helo = p.helo_name or default_helo()
        self.helo = helo or ""
        if self.cut:
            raise TimeoutError("the send's deadline passed before it began")
        if not limits.may_send(self.send_by):
            # Woken past the limit before even connecting (a paused process, a late task).
            raise _Stop(
                Retryable(
                    "not connecting: the lease no longer leaves time to send and record; nothing was sent",
                    response=self._evidence(None, "", error_class="LeaseTooShort", sent=False),
                )
            )
        # Connecting through the constructor (not .connect()) is what makes smtplib
        # remember the host for certificate checks on STARTTLS and implicit TLS.
        # ("localhost" only until the socket is up: without a name we greet with its
        # address literal, which smtplib cannot know before connecting.)
        timeout = limits.bounded(p.timeout, self.deadline)
        try:
            if p.tls == "ssl":
                conn = SmtpSsl(
                    p.host, p.port, local_hostname=helo or "localhost", timeout=timeout, context=p.ssl_context
                )
            else:
                conn = Smtp(p.host, p.port, local_hostname=helo or "localhost", timeout=timeout)
        except smtplib.SMTPConnectError as exc:  # a greeting other than 220
            # The server refuses every session, not this message: a provider-level fault.
            raise _Stop(
                self._retry(
                    f"smtp {exc.smtp_code} at connect: {short(self._text(exc.smtp_error))}",
                    code=exc.smtp_code,
                    reply=exc.smtp_error,
                    misconfigured=500 <= exc.smtp_code < 600,
                    fault="greeting_refused",
                    error_class="GreetingRefused",
                )
            ) from None
        with self._lock:
            self.conn = conn
            if self.cut:  # the deadline passed while connecting
                raise TimeoutError("the send's deadline passed")
        if helo is None and conn.sock is not None:
            self.helo = conn.local_hostname = address_literal(conn.sock.getsockname())

        self.phase = "ehlo"
        self._ehlo()
        if p.tls == "starttls":
            self.phase = "starttls"
            if not conn.has_extn("starttls"):
                # Never fall back to plain text when TLS was asked for.
                raise _Stop(
                    self._retry(
                        "the server does not offer STARTTLS",
                        code=None,
                        reply="",
                        misconfigured=True,
                        fault="tls_failed",
                    )
                )
            try:
                self._arm()
                conn.starttls(context=p.ssl_context)
            except smtplib.SMTPResponseException as exc:
                self._expect((exc.smtp_code, exc.smtp_error), (220,))
            self.phase = "ehlo"
            self._ehlo()
        if p.username is not None:
            self.phase = "auth"
            if not isinstance(conn.sock, ssl.SSLSocket) and not p.allow_plain_auth:
                # The password would cross the network in clear (base64 is no cipher).
                raise _Stop(
                    self._retry(
                        "refusing SMTP AUTH over a connection without TLS: set EVQ_SMTP_TLS=starttls or ssl "
                        "(or EVQ_SMTP_ALLOW_PLAIN_AUTH=true for a trusted network); nothing was sent",
                        code=None,
                        reply="",
                        misconfigured=True,
                        fault="auth_failed",
                        error_class="PlainAuthRefused",
                    )
                )
            if not conn.has_extn("auth"):
                raise _Stop(
                    self._retry(
                        "the server does not offer AUTH", code=None, reply="", misconfigured=True, fault="auth_failed"
                    )
                )
            try:
                self._arm()
                conn.login(p.username, p._password or "")
            except smtplib.SMTPAuthenticationError as exc:
                reason = f"smtp authentication failed ({exc.smtp_code}); check the SMTP username and password"
                raise _Stop(
                    self._retry(
                        reason, code=exc.smtp_code, reply=exc.smtp_error, misconfigured=True, fault="auth_failed"
                    )
                ) from None

        if env.smtputf8 and not conn.has_extn("smtputf8"):
            self.phase = "mail"
            return Rejected(
                "an address needs SMTPUTF8 (non-ASCII local part), which the server does not offer",
                response=self._evidence(None, ""),
                before_send=True,
            )
        # The first transaction decides the outcome as one message; a server out of RCPTs
        # for it (452 4.5.3) gets the rest in further transactions on this connection, with
        # the same bytes and so the same Message-ID (RFC 5321 §4.5.3.1.10). Once one of them
        # has been accepted, nothing may be retried: a later transaction that fails leaves
        # an accepted message whose unserved recipients are recorded as refused.
        code, reply, accepted, rest = self._transaction(list(env.recipients), first=True)
        self._served(code, reply, accepted)
        while rest:
            try:
                code, reply, accepted, rest = self._transaction(rest, first=False)
            except _Stop as stop:
                self._not_served(rest, stop.outcome)
                raise _Stop(self._partial_outcome(stop.outcome), polite=stop.polite) from None
            except Exception as exc:  # classified by phase, as any failure
                failed = self._failed(exc)
                self._not_served(rest, failed)
                raise _Stop(self._partial_outcome(failed), polite=not self.cut and self.phase != "final") from None
            self._served(code, reply, accepted)
        first = self.transactions[0]
        extra: dict[str, Any] = {"accepted": sum(len(t["recipients"]) for t in self.transactions)}
        if len(self.transactions) > 1:
            extra["transactions"] = [{**t, "recipients": len(t["recipients"])} for t in self.transactions]
        return Accepted(
            provider_message_id=first["queue_id"], response=self._evidence(first["code"], first["reply"], **extra)
        )

    def _transaction(self, recipients: list[str], *, first: bool) -> tuple[int, str, list[str], list[str]]:
        """One MAIL, RCPT..., DATA, body, "." exchange: (code, reply, accepted, deferred).

        Returns only for a 2yz reply to the final "."; every other end raises _Stop (a
        decided outcome) or the exception that ended it (classified by phase)."""
        conn, env = self.conn, self.envelope
        assert conn is not None
        self.phase = "mail"
        self.deferred_by = None
        options = []
        if env.smtputf8:
            options.append("SMTPUTF8")
            if conn.has_extn("8bitmime"):
                options.append("BODY=8BITMIME")
        if conn.has_extn("size"):
            options.append(f"SIZE={len(env.data)}")
        self._arm()
        self._expect(conn.mail(env.sender, options), _2YZ)

        self.phase = "rcpt"
        accepted, rest = self._recipients(recipients, first=first)
        if not rest:
            # In the last transaction only: it happens after every earlier one was accepted,
            # so a journal copy proves the first "." was.
            self._journal_rcpt()

        self.phase = "data"
        self._arm()
        self._expect(conn.docmd("DATA"), (354,))

        self.phase = "body"
        sock = conn.sock
        assert sock is not None
        self._arm()
        sock.sendall(dot_stuff(env.data))
        self._commit_or_abort(sock)
        # Once the final "." is (even partly) written the server may queue the message
        # at any moment, so from here a missing answer is Unknown, not Retryable.
        self.phase = "final"
        self._arm()
        sock.sendall(b".\r\n")
        code, raw = conn.getreply()
        reply = self._text(raw)
        if 200 <= code < 300:
            return code, reply, accepted, rest
        if 400 <= code < 500:
            raise _Stop(
                Retryable(f"smtp {code} after the message: {short(reply)}", response=self._evidence(code, reply))
            )
        if 500 <= code < 600:
            raise _Stop(
                Rejected(f"smtp {code} after the message: {short(reply)}", response=self._evidence(code, reply))
            )
        raise _Stop(
            Unknown(f"unreadable reply after the message: {short(reply)!r}", response=self._evidence(code, reply)),
            polite=False,
        )

    def _served(self, code: int, reply: str, accepted: list[str]) -> None:
        self.transactions.append(
            {
                "recipients": accepted,
                "code": code,
                "reply": reply[:200],
                "queue_id": queue_id(reply),
                "deferred_by": self.deferred_by,
            }
        )
        self.deferred_by = None

    def _not_served(self, recipients: list[str], outcome: Outcome) -> None:
        """A later transaction ended without delivering: its recipients are refused, with why."""
        code = outcome.response.get("code")
        why = getattr(outcome, "reason", "")
        if isinstance(outcome, Unknown):
            return  # they may have it: the outcome says so, they are not "refused"
        for rcpt in recipients:
            self.refused.setdefault(rcpt, {"code": code, "reply": short(why)})

    def _partial_outcome(self, outcome: Outcome) -> Outcome:
        """The outcome of a send whose first transaction(s) were accepted and a later one was not."""
        first = self.transactions[0]
        served = sum(len(t["recipients"]) for t in self.transactions)
        # The answer that decides is the first transaction's (after its final "."); the
        # phase the later one stopped in is kept beside it.
        extra = {
            "accepted": served,
            "transactions": [{**t, "recipients": len(t["recipients"])} for t in self.transactions],
            "later_phase": self.phase,
            "phase": "final",
        }
        if isinstance(outcome, Unknown):
            # Past a later "." with no answer: those recipients may have it as well.
            return Unknown(
                f"the server accepted the message for {served} recipient(s) (queue id {first['queue_id']}), then gave "
                f"no answer after the final '.' of a further transaction: {outcome.reason}",
                response=self._evidence(first["code"], first["reply"], **extra),
            )
        return Accepted(
            provider_message_id=first["queue_id"], response=self._evidence(first["code"], first["reply"], **extra)
        )

    def _ehlo(self) -> None:
        conn = self.conn
        assert conn is not None
        self._arm()
        code, raw = conn.ehlo()
        if not 200 <= code < 300:
            self._arm()
            code, raw = conn.helo()
        self._expect((code, raw), _2YZ)

    def _recipients(self, recipients: list[str], *, first: bool) -> tuple[list[str], list[str]]:
        """RCPT for each: (accepted, deferred to a further transaction)."""
        conn = self.conn
        assert conn is not None
        accepted: list[str] = []
        temporary = False
        for i, rcpt in enumerate(recipients):
            self._arm()
            code, raw = conn.rcpt(rcpt)
            if 200 <= code < 300:
                accepted.append(rcpt)
                continue
            reply = self._text(raw)
            if first and rcpt.lower() not in reply.lower() and helo_refused(code, reply, self.helo):
                _quietly(conn.rset)
                raise _Stop(
                    self._retry(
                        f"smtp {code} at rcpt: the server refuses our HELO name {self.helo!r} "
                        f"({short(reply)}); set EVQ_SMTP_HELO_NAME to this host's fully-qualified name",
                        code=code,
                        reply=reply,
                        misconfigured=True,
                        fault="greeting_refused",
                        error_class="HeloRefused",
                    )
                )
            if code == 452 and accepted and not temporary and TOO_MANY.search(reply):
                # Out of RCPTs for this transaction: the rest go in the next one.
                self.deferred_by = {"code": code, "reply": reply[:200], "deferred": len(recipients) - i}
                return accepted, recipients[i:]
            self.refused[rcpt] = {"code": code, "reply": reply[:200]}
            temporary = temporary or is_temporary(code)
        if temporary and first:
            # RSET so the recipients already accepted in this transaction get nothing;
            # the retry sends to every recipient once.
            _quietly(conn.rset)
            bad_rcpt = next(a for a, r in self.refused.items() if is_temporary(r["code"]))
            bad = self.refused[bad_rcpt]
            raise _Stop(self._retry(f"smtp {bad['code']} at rcpt for {bad_rcpt}", code=bad["code"], reply=bad["reply"]))
        if not accepted:
            _quietly(conn.rset)
            if not first:
                # Everyone left was refused; those of the earlier transactions have the message.
                raise _Stop(Rejected("every remaining recipient refused", response=self._evidence(None, "")))
            bad_rcpt, bad = next(iter(self.refused.items()))
            raise _Stop(
                Rejected(
                    f"every recipient refused, e.g. {bad_rcpt}: smtp {bad['code']} {short(bad['reply'])}",
                    response=self._evidence(bad["code"], bad["reply"]),
                )
            )
        return accepted, []

    def _journal_rcpt(self) -> None:
        """RCPT TO this step's tagged journal address (envelope only: the message's bytes do not
        change; a subaddress no real recipient can be, so it always has a RCPT of its own).

        Asked after the real recipients, once they were accepted, so it never makes a send
        that refuses all of them look accepted; its refusal is recorded, never the outcome."""
        address = self.journal_rcpt
        if address is None or self.journal is not None:
            return
        conn = self.conn
        assert conn is not None
        self._arm()
        code, raw = conn.rcpt(address)
        self.journal = {"accepted": 200 <= code < 300, "code": code, "reply": self._text(raw)[:200]}

    def _expect(self, answer: tuple[int, bytes | str], ok: Container[int]) -> None:
        code, raw = answer
        if code in ok:
            return
        reply = self._text(raw)
        permanent = 500 <= code < 600
        message_phase = self.phase in ("mail", "data")
        if permanent and self.phase == "mail" and not self.transactions and helo_refused(code, reply, self.helo):
            raise _Stop(
                self._retry(
                    f"smtp {code} at mail: the server refuses our HELO name {self.helo!r} ({short(reply)}); "
                    "set EVQ_SMTP_HELO_NAME to this host's fully-qualified name",
                    code=code,
                    reply=reply,
                    misconfigured=True,
                    fault="greeting_refused",
                    error_class="HeloRefused",
                )
            )
        if permanent and message_phase and code not in CONFIG_CODES:
            raise _Stop(Rejected(f"smtp {code} at {self.phase}: {short(reply)}", response=self._evidence(code, reply)))
        # 4yz anywhere, or 5yz while setting up the session (greeting, EHLO, STARTTLS,
        # AUTH): a fault of the server or of our settings, not of this message. The 5yz
        # ones (and "authentication required" anywhere) last until someone changes them,
        # and open the provider's circuit (worker/circuit.py).
        misconfigured = permanent and (not message_phase or code in CONFIG_CODES)
        error_class = (
            ("GreetingRefused" if self.phase in ("connect", "ehlo") else "SessionRefused") if misconfigured else None
        )
        fault = config_fault(code, reply) or (SESSION_FAULTS.get(self.phase) if misconfigured else None)
        raise _Stop(
            self._retry(
                f"smtp {code} at {self.phase}: {short(reply)}",
                code=code,
                reply=reply,
                misconfigured=misconfigured,
                fault=fault,
                error_class=error_class,
            )
        )

    def _retry(
        self,
        reason: str,
        *,
        code: int | None,
        reply: bytes | str,
        misconfigured: bool = False,
        fault: str | None = None,
        error_class: str | None = None,
    ) -> Retryable:
        return Retryable(
            self.p.secrets.scrub(reason),
            misconfigured=misconfigured,
            fault=fault,
            response=self._evidence(code, self._text(reply), error_class=error_class),
        )

    def _failed(self, exc: BaseException) -> Outcome:
        error_class = "DeadlineExceeded" if self.cut else root_class(exc)
        detail = self._text(str(exc))
        if self.cut:
            detail = f"cut off at the send's deadline in phase {self.phase} ({root_class(exc)})"
        extra: dict[str, Any] = {}
        if isinstance(exc, IncompleteReply):
            # What came of the reply before it stopped: no answer, but worth an operator's look.
            extra["partial_reply"] = short(self._text(exc.partial))
        if self.phase == "final":
            reason = (
                "no whole answer after the final '.' by the send's deadline (evq cut the exchange)"
                if self.cut
                else f"no answer after the final '.' ({error_class})"
            )
            return Unknown(
                f"{reason}; the server may have accepted the message",
                response=self._evidence(None, detail, error_class=error_class, **extra),
            )
        if self.cut:
            reason = f"cut off at {self.phase}: the send's deadline passed; nothing was sent"
        elif isinstance(exc, TimeoutError) or error_class == "TimeoutError":
            reason = f"timed out at {self.phase} after {self.p.timeout:g}s"
        elif isinstance(exc, ssl.SSLError) or error_class.startswith("SSL"):
            reason = f"tls failed at {self.phase}: {error_class}"
            if error_class == "SSLCertVerificationError":
                reason += " (a private CA? set EVQ_SMTP_CA_FILE)"
        else:
            reason = f"{error_class} at {self.phase}: {short(detail)}"
        # A TLS handshake that fails (an untrusted certificate, no common protocol or
        # cipher, a client certificate the server wants) fails every message alike.
        tls_setup = (isinstance(exc, ssl.SSLError) or error_class.startswith("SSL")) and self.phase in (
            "connect",
            "starttls",
        )
        return Retryable(
            self.p.secrets.scrub(reason),
            misconfigured=tls_setup and not self.cut,
            response=self._evidence(None, detail, error_class=error_class, **extra),
            fault=None if self.cut else transport_fault(exc, self.phase),
        )

    def _evidence(
        self, code: int | None, reply: str, *, error_class: str | None = None, **extra: Any
    ) -> dict[str, Any]:
        evidence = {
            "phase": self.phase,
            "code": code,
            "reply": reply[:MAX_REPLY],
            "error_class": error_class,
            "refused": dict(self.refused),
            **extra,
        }
        if self.p.journal is not None:
            # None: the journal was never asked (the send ended before its RCPT).
            evidence["journal"] = dict(self.journal) if self.journal is not None else None
        return evidence

    def _text(self, raw: bytes | str) -> str:
        text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
        text = self.p.secrets.scrub(text)
        for form in self._journal_forms:
            text = form.sub(JOURNAL_SHOWN, text)
        return text

    def _hang_up(self, *, polite: bool) -> None:
        conn = self.conn
        if conn is None:
            return
        if polite and conn.sock is not None:
            # The outcome is decided; a server slow to say goodbye must not delay it long
            # (nor past the deadline: the watchdog would cut the goodbye anyway).
            _quietly(lambda: conn.sock.settimeout(limits.bounded(min(self.p.timeout, 2.0), self.deadline)))
            _quietly(conn.quit)
        with self._lock:
            _quietly(conn.close)


def _quietly(call: Any) -> None:
    try:
        call()
    except Exception:  # the outcome is already decided
        pass
