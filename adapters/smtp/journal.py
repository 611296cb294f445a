"""The SMTP adapter's witness: an IMAP mailbox searched by Message-ID.

Plain SMTP can answer nothing about a send whose reply was lost after the final ".".
With EVQ_SMTP_JOURNAL set, every send also goes to a journal address (one more RCPT,
in the same transaction as the real recipients), and the copy lands in a mailbox evq
can read. :class:`ImapJournal` is the lookup (worker/ports/providers.py, ``Lookup``)
that searches that mailbox by the step's Message-ID. A copy proves the relay took the
message (the journal recipient was in the transaction whose "." it answered) only if it
was delivered to the step's tagged journal address, as its delivery agent's trace says
(adapters/smtp/witness.py): anyone can mail the journal a message with that Message-ID.
Such a copy closes the row ``accepted``. No copy, or only copies without the tag, is no
proof of anything (the relay may not have delivered it yet, or the journal recipient was
refused; a copy without the tag is counted in the evidence, for an operator to look at):
``found=False``, and the row stays ``unknown``. A lookup that cannot ask (no connection,
TLS or login refused, a protocol error, the time up) raises :class:`LookupFailed`:
nothing is assumed.

One connection per lookup, in a thread (imaplib blocks), bounded by ``timeout`` for
the whole exchange: a watchdog shuts the socket down when it passes, since a server
trickling its answer defeats per-read timeouts. TLS always (implicit, or STARTTLS that
must succeed), the certificate and name always verified. The password is registered
as a secret (scrubbed from every log line) and never put in an answer or an error.
The Message-ID is treated as hostile: only the ``<left@right>`` form evq makes is
searched for, sent as an IMAP quoted string, and each hit's header is compared
exactly before it counts.
"""

from __future__ import annotations

import asyncio
import email
import imaplib
import re
import socket
import ssl
import threading
from datetime import datetime
from typing import Any

from evq.adapters.smtp.config import JournalImap
from evq.adapters.smtp.witness import WitnessTags
from evq.worker.logs import register_secrets
from evq.worker.ports import LookupFailed, LookupResult
from evq.worker.secret_scrub import scrub_text

# The Message-ID evq makes (adapters/smtp/message.py): printable ASCII, no space, no <>.
_MESSAGE_ID = re.compile(r"^<[!-;=?-~]+@[!-;=?-~]+>$")
# Hits whose header is read and compared; more than this many copies of one Message-ID
# in a journal is itself worth an operator's look (the count is in the evidence).
MAX_HITS = 20
# How much of a hit's header is read for its delivery trace: the delivery agent's lines and
# the receiving MTA's Received: line come first, in a few hundred bytes. A copy whose first
# Received: line is not within this is no proof.
TRACE_BYTES = 8192
_FETCHED_UID = re.compile(rb"\bUID (\d+)")
_INTERNALDATE = re.compile(rb'INTERNALDATE "([^"]+)"')


def quoted(text: str) -> str:
    """``text`` as an IMAP quoted string (RFC 3501 §4.3): backslash and quote escaped.
    CR, LF, NUL and anything outside ASCII cannot be quoted: refused."""
    if not text.isascii() or any(c in text for c in "\r\n\0"):
        raise ValueError("not quotable in IMAP")
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def imap_tls_context(ca_file: str | None = None) -> ssl.SSLContext:
    """The client TLS context: the system's trust store, or only ``ca_file``. Always verifies."""
    return ssl.create_default_context(cafile=ca_file) if ca_file else ssl.create_default_context()


class ImapJournal:
    """A :class:`evq.worker.ports.Lookup` over the journal mailbox."""

    def __init__(
        self,
        where: JournalImap,
        *,
        password: str,
        tags: WitnessTags,
        timeout: float = 10.0,
        ssl_context: ssl.SSLContext | None = None,
    ):
        if where.tls not in ("ssl", "starttls"):
            raise ValueError("the journal is read over TLS only: ssl or starttls")
        if timeout <= 0:
            raise ValueError("timeout must be positive")
        self.where = where
        self._password = password
        self._tags = tags
        register_secrets([password])
        self.timeout = timeout
        self.ssl_context = ssl_context or imap_tls_context()

    def __repr__(self) -> str:
        w = self.where
        return f"ImapJournal({'imaps' if w.tls == 'ssl' else 'imap'}://{w.user}@{w.host}:{w.port}/{w.mailbox})"

    async def lookup(self, idempotency_key: str, message_id: str) -> LookupResult:
        if not isinstance(message_id, str) or not _MESSAGE_ID.match(message_id):
            raise LookupFailed("the step's Message-ID is not of the form <left@right>; the journal was not asked")
        session = _Session(self, message_id)
        thread = threading.Thread(target=session.run, name="evq-journal-imap", daemon=True)
        thread.start()
        try:
            await asyncio.wait_for(asyncio.shield(session.done), timeout=self.timeout)
        except TimeoutError:
            session.cut_off()
            raise LookupFailed(
                f"the journal at {self.where.host}:{self.where.port} gave no whole answer in {self.timeout:g}s"
            ) from None
        except asyncio.CancelledError:
            session.cut_off()
            raise
        return session.done.result()

    def _scrub(self, text: str) -> str:
        return scrub_text(text.replace(self._password, "***"))[:300]


class _IMAP4(imaplib.IMAP4):
    """imaplib's client, its socket handed to the session's watchdog as soon as it connects:
    imaplib's constructor reads the greeting, which a trickling server can stretch forever."""

    def __init__(self, session: _Session, host: str, port: int, *, timeout: float):
        self._session = session
        super().__init__(host, port, timeout=timeout)

    def _create_socket(self, timeout: float | None) -> socket.socket:
        sock: socket.socket = super()._create_socket(timeout)  # type: ignore[misc]
        self._session.watch(sock)
        return sock


class _IMAP4_SSL(imaplib.IMAP4_SSL):
    """As :class:`_IMAP4`, watched from before the TLS handshake."""

    def __init__(self, session: _Session, host: str, port: int, *, ssl_context: ssl.SSLContext, timeout: float):
        self._session = session
        super().__init__(host, port, ssl_context=ssl_context, timeout=timeout)

    def _create_socket(self, timeout: float | None) -> socket.socket:
        sock: socket.socket = imaplib.IMAP4._create_socket(self, timeout)  # type: ignore[attr-defined]
        self._session.watch(sock)
        wrapped: socket.socket = self.ssl_context.wrap_socket(sock, server_hostname=self.host)
        return wrapped


class _Session:
    """One lookup's IMAP exchange, run in its own thread; its answer is set on ``done``."""

    def __init__(self, journal: ImapJournal, message_id: str):
        self.j = journal
        self.message_id = message_id
        self.loop = asyncio.get_running_loop()
        self.done: asyncio.Future[LookupResult] = self.loop.create_future()
        # An answer that comes after the time was up is nobody's: retrieved here, so it is not reported.
        self.done.add_done_callback(lambda f: f.cancelled() or f.exception())
        self.step = "connect"
        self.imap: imaplib.IMAP4 | None = None
        self.cut = False
        # A duplicate of the connection's descriptor, taken the moment it connects: shutting it
        # down ends the connection whatever wraps it (the TLS handshake, the greeting, STARTTLS).
        self._cutter: socket.socket | None = None
        self._lock = threading.Lock()

    def run(self) -> None:
        try:
            answer: LookupResult | BaseException = self._talk()
        except LookupFailed as exc:
            answer = exc
        except Exception as exc:  # every failure to ask is LookupFailed, never an answer
            answer = LookupFailed(self._failure(exc))
        finally:
            self._logout()
            with self._lock:
                cutter, self._cutter = self._cutter, None
            if cutter is not None:
                cutter.close()
        try:
            self.loop.call_soon_threadsafe(self._deliver, answer)
        except RuntimeError:  # the loop is gone: nobody waits for this answer
            pass

    def _deliver(self, answer: LookupResult | BaseException) -> None:
        if self.done.done():
            return
        if isinstance(answer, BaseException):
            self.done.set_exception(answer)
        else:
            self.done.set_result(answer)

    def cut_off(self) -> None:
        """From the loop, when the time is up: wake the thread's blocked read or write."""
        with self._lock:
            self.cut = True
            self._shutdown()

    def watch(self, sock: socket.socket) -> None:
        """From imaplib's ``_create_socket`` (:class:`_IMAP4`): the connection is up, before a
        byte of the TLS handshake or the greeting is read."""
        with self._lock:
            self._cutter = sock.dup()
            if self.cut:
                self._shutdown()

    def _shutdown(self) -> None:
        if self._cutter is not None:
            try:
                self._cutter.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _talk(self) -> LookupResult:
        w, timeout = self.j.where, self.j.timeout
        if w.tls == "ssl":
            imap: imaplib.IMAP4 = _IMAP4_SSL(self, w.host, w.port, ssl_context=self.j.ssl_context, timeout=timeout)
        else:
            imap = _IMAP4(self, w.host, w.port, timeout=timeout)
        with self._lock:
            self.imap = imap
            if self.cut:
                raise TimeoutError("the time was up")
        if w.tls == "starttls":
            self.step = "starttls"
            # imaplib refuses a server that does not offer STARTTLS: never a plain LOGIN.
            imap.starttls(ssl_context=self.j.ssl_context)
        self.step = "login"
        try:
            imap.login(w.user, self.j._password)
        except imaplib.IMAP4.error as exc:
            raise LookupFailed(
                f"the journal refused the login of {w.user!r} ({self.j._scrub(_text(exc))}); "
                "check EVQ_JOURNAL_IMAP_URL's user and EVQ_JOURNAL_IMAP_PASSWORD"
            ) from None
        self.step = "select"
        typ, data = imap.select(quoted(w.mailbox), readonly=True)
        if typ != "OK":
            raise LookupFailed(f"the journal cannot open mailbox {w.mailbox!r}: {self.j._scrub(_text(data))}")
        exists = _int(data[0] if data else None)
        uidvalidity = _int((imap.response("UIDVALIDITY")[1] or [None])[-1])
        self.step = "search"
        uids = self._search(imap, "HEADER", "Message-ID", quoted(self.message_id))
        # The hits whose delivery trace may carry this step's tag, asked of the server by the tag
        # itself: anyone can mail the journal any number of copies with the step's Message-ID,
        # and read in arrival order the first MAX_HITS of them would hide the relay's copy. Only
        # the relay's delivery can write the tag (nobody else knows it), so these hits are the
        # relay's copies, or a sender's that the trace check below still refuses.
        tag = quoted(f"+{self.j._tags.tag(self.message_id)}@")
        candidates = self._search(
            imap, "HEADER", "Message-ID", quoted(self.message_id), "OR", "HEADER", "Delivered-To", tag,
            "HEADER", "X-Original-To", tag,
        )  # fmt: skip
        self.step = "fetch"
        copies: list[dict[str, Any]] = []
        for uid in candidates[:MAX_HITS]:
            copy = self._copy(imap, uid)
            if copy is not None and self._tagged(imap, uid):
                copies.append(copy)
        # Every other hit lacks the tag (a hit whose Message-ID merely contains ours, as a search
        # matches substrings, counts here too: it is no copy of this step either way).
        untagged = len(uids) - len(copies)
        self.step = "logout"
        base: dict[str, Any] = {
            "witness": "imap_journal",
            "host": w.host,
            "mailbox": w.mailbox,
            "uidvalidity": uidvalidity,
            "message_id": self.message_id,
            "messages": exists,
            "search_hits": len(uids),
        }
        if untagged:
            base["untagged_copies"] = untagged
            base["note"] = (
                f"{untagged} cop{'y' if untagged == 1 else 'ies'} with this Message-ID "
                f"{'lacks' if untagged == 1 else 'lack'} the witness tag the "
                "delivery to this step's journal recipient writes (Delivered-To/X-Original-To above the first "
                "Received:): anyone can mail the journal such a copy, so it proves nothing"
            )
        if not copies:
            # Hits whose Message-ID is not exactly ours (a search matches substrings) do not count.
            return LookupResult(found=False, raw=base)
        first = copies[0]
        return LookupResult(
            found=True,
            provider_message_id=None,
            raw={**base, "uid": first["uid"], "internaldate": first["internaldate"], "copies": len(copies)},
        )

    def _search(self, imap: imaplib.IMAP4, *criteria: str) -> list[bytes]:
        typ, data = imap.uid("SEARCH", *criteria)
        if typ != "OK":
            # A server may echo the criteria: the step's tag (which forges its proof) never
            # leaves in an error.
            said = _text(data).replace(self.j._tags.tag(self.message_id), "***")
            raise LookupFailed(f"the journal's search failed: {self.j._scrub(said)}")
        return [u for u in (data[0] or b"").split() if u.isdigit()] if data else []

    def _tagged(self, imap: imaplib.IMAP4, uid: bytes) -> bool:
        """Whether the hit was delivered to this step's tagged journal address (adapters/smtp/witness.py)."""
        typ, data = imap.uid("FETCH", uid.decode(), f"(BODY.PEEK[HEADER]<0.{TRACE_BYTES}>)")
        if typ != "OK":
            raise LookupFailed(f"the journal's fetch failed: {self.j._scrub(_text(data))}")
        header = b"".join(part[1] for part in data if isinstance(part, tuple) and len(part) >= 2)
        return self.j._tags.delivered_with_tag(header, self.message_id)

    def _copy(self, imap: imaplib.IMAP4, uid: bytes) -> dict[str, Any] | None:
        """The hit's UID and arrival time if its Message-ID header is exactly ours."""
        typ, data = imap.uid("FETCH", uid.decode(), "(UID INTERNALDATE BODY.PEEK[HEADER.FIELDS (MESSAGE-ID)])")
        if typ != "OK":
            raise LookupFailed(f"the journal's fetch failed: {self.j._scrub(_text(data))}")
        for part in data:
            if not isinstance(part, tuple) or len(part) < 2:
                continue
            meta, header = part[0], part[1]
            parsed = email.message_from_bytes(header)
            if (parsed.get("Message-ID") or "").strip() != self.message_id:
                continue
            internal = _first(_INTERNALDATE, [meta])
            return {"uid": _first(_FETCHED_UID, [meta], whole=True) or int(uid), "internaldate": _iso(internal)}
        return None

    def _logout(self) -> None:
        imap = self.imap
        if imap is None:
            return
        if not self.cut and self.step in ("logout", "fetch", "search", "select"):
            try:
                imap.logout()
                return
            except Exception:  # the answer is decided
                pass
        try:
            imap.shutdown()
        except Exception:
            pass

    def _failure(self, exc: Exception) -> str:
        w = self.j.where
        at = f"{w.host}:{w.port}"
        name = type(exc).__name__
        if self.cut:
            return f"the journal lookup at {at} was cut off at {self.step}: its time ({self.j.timeout:g}s) was up"
        if isinstance(exc, ssl.SSLCertVerificationError):
            return f"tls failed at {self.step} with the journal at {at}: {exc.verify_message} (a private CA? set EVQ_SMTP_CA_FILE, which the journal trusts too)"
        if isinstance(exc, ssl.SSLError):
            return f"tls failed at {self.step} with the journal at {at}: {name}"
        if isinstance(exc, ConnectionRefusedError):
            return f"nothing listens for the journal at {at} (connection refused)"
        if isinstance(exc, (TimeoutError, socket.timeout)):
            return f"the journal at {at} did not answer at {self.step} within {self.j.timeout:g}s"
        if isinstance(exc, imaplib.IMAP4.abort):
            return f"the journal at {at} broke off at {self.step}: {self.j._scrub(_text(exc))}"
        if isinstance(exc, imaplib.IMAP4.error):
            return f"the journal at {at} refused {self.step}: {self.j._scrub(_text(exc))}"
        return f"{name} at {self.step} with the journal at {at}: {self.j._scrub(_text(exc))}"


def _text(value: Any) -> str:
    if isinstance(value, BaseException) and value.args:
        value = value.args[0] if len(value.args) == 1 else list(value.args)
    if isinstance(value, (list, tuple)):
        return " ".join(_text(v) for v in value if v is not None)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return " ".join(str(value).split())


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _first(pattern: re.Pattern[bytes], items: Any, *, whole: bool = False) -> Any:
    for item in items or ():
        if isinstance(item, bytes):
            match = pattern.search(item)
            if match:
                value = match.group(1)
                return int(value) if whole else value.decode("ascii", "replace")
    return None


def _iso(internaldate: str | None) -> str | None:
    """IMAP's INTERNALDATE ("01-Dec-2026 20:30:00 +0000") as ISO 8601, when it reads."""
    if not internaldate:
        return None
    try:
        return datetime.strptime(internaldate, "%d-%b-%Y %H:%M:%S %z").isoformat()
    except ValueError:
        return internaldate
