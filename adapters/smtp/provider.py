"""The SMTP adapter: satisfies :class:`evq.worker.ports.Provider`.

It renders each request (adapters/smtp/message.py) and runs one conversation per
attempt in a thread of its own (adapters/smtp/conversation.py, whose docstring says
why), bounded by the request's deadline; the outcome is logged here, on the loop.

SMTP itself can answer nothing about a send whose reply was lost. With a journal
(``journal``: an extra envelope recipient, EVQ_SMTP_JOURNAL, tagged per step by
``witness_tags``: adapters/smtp/witness.py) and a witness that can search the mailbox it
lands in (``witness``: adapters/smtp/journal.py, over IMAP), the provider has a ``lookup``
by Message-ID and the reconciler settles its unknown rows.
"""

from __future__ import annotations

import asyncio
import ssl
import threading
import time
from typing import Any

from evq.adapters.smtp.config import RELAYS, SmtpConfig
from evq.adapters.smtp.config import profile as smtp_profile
from evq.adapters.smtp.conversation import _Conversation
from evq.adapters.smtp.message import BuildError, build_message
from evq.adapters.smtp.replies import Secrets
from evq.adapters.smtp.witness import WitnessTags
from evq.worker import deadline as limits
from evq.worker.logs import get_logger, register_secrets
from evq.worker.outcomes import Outcome, Rejected, Retryable, Unknown, log_fields
from evq.worker.ports import Lookup, LookupResult, ProviderProfile, SendRequest
from evq.worker.request import Policy, check_payload

log = get_logger("evq.adapters.smtp")

TLS_MODES = ("none", "starttls", "ssl")
# How long a cut-off conversation's thread gets to report how far it got, once its
# socket is shut down, before the adapter answers from the phase it last saw.
_CUT_GRACE = 0.5


class SmtpProvider:
    """The SMTP adapter: satisfies :class:`worker.ports.Provider`."""

    name = "smtp"
    # SMTP has no idempotency key a server honours, so an ambiguous send is Unknown.
    dedupe_window: float | None = None

    def __init__(
        self,
        *,
        host: str,
        port: int,
        username: str | None = None,
        password: str | None = None,
        tls: str = "none",
        timeout: float = 30.0,
        policy: Policy = Policy(),
        max_workers: int = 16,
        helo_name: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
        allow_plain_auth: bool = False,
        journal: str | None = None,
        witness_tags: WitnessTags | None = None,
        witness: Lookup | None = None,
        relay: str = "none",
        profile: ProviderProfile | None = None,
    ):
        if tls not in TLS_MODES:
            raise ValueError(f"tls must be one of {', '.join(TLS_MODES)}, got {tls!r}")
        if username is not None and password is None:
            raise ValueError("an SMTP username needs a password")
        if timeout <= 0 or max_workers < 1:
            raise ValueError("timeout must be positive and max_workers at least 1")
        if journal is not None and witness_tags is None:
            raise ValueError("a journal address needs the installation's witness tags (adapters/smtp/witness.py)")
        if relay not in RELAYS:
            raise ValueError(f"relay must be one of {', '.join(RELAYS)}, got {relay!r}")
        # The relay whose metadata header each message carries (adapters/smtp/message.py).
        self.relay = relay
        # What settles a lost answer (docs/design.md, "Provider profiles"); the composition root
        # passes the one the settings give (which webhooks are configured), else: none known.
        self.profile = (
            profile if profile is not None else smtp_profile(SmtpConfig(relay=relay), witness=witness is not None)
        )
        self.host, self.port, self.tls, self.timeout = host, port, tls, timeout
        self.username = username
        self._password = password  # kept off repr() and out of every outcome
        self.helo_name = helo_name
        self.allow_plain_auth = allow_plain_auth
        self.policy = policy
        # The journal address (RCPT only, each step's tagged) and the lookup that searches where
        # its copies land.
        self.journal = journal
        self._witness_tags = witness_tags
        self.witness = witness
        if witness is not None:
            # An instance attribute, not a method: the worker gives the reconciler the
            # providers that have a lookup, and without a witness this one has none.
            self.lookup = self._lookup
        self.ssl_context = ssl_context or ssl.create_default_context()
        self.secrets = Secrets(username, password)
        register_secrets([password])
        # At most max_workers conversations at once. A slot is held by a send, not by its
        # thread: a conversation cut off at its deadline gives its slot back at once.
        self._slots = asyncio.Semaphore(max_workers)
        # Changed from conversation threads, read by close(): guarded by _track.
        self._live: set[_Conversation] = set()
        self._threads: set[threading.Thread] = set()
        self._track = threading.Lock()
        self._closed = False

    def journal_address(self, message_id: str) -> str | None:
        """The journal recipient of the step with this Message-ID (None: no journal)."""
        if self.journal is None or self._witness_tags is None:
            return None
        return self._witness_tags.address(self.journal, message_id)

    async def _lookup(self, idempotency_key: str, message_id: str) -> LookupResult:
        """The reconciler's question, asked of the witness (it raises LookupFailed when it cannot answer)."""
        assert self.witness is not None
        return await self.witness.lookup(idempotency_key, message_id)

    def fix_hint(self, cause: str) -> str | None:
        """The setting to change when every send fails with ``cause`` (worker/streaks.py)."""
        if cause == "connection_refused":
            return (
                f"nothing listens on {self.host}:{self.port}: set EVQ_SMTP_HOST/EVQ_SMTP_PORT "
                "(the dev sink `python -m evq.ops.dev.smtp` listens on 127.0.0.1:2525)"
            )
        if cause == "auth_failed":
            return "the server refused our login: check EVQ_SMTP_USERNAME/EVQ_SMTP_PASSWORD"
        if cause in ("tls_failed", "starttls_required"):
            return "TLS does not work with this server: check EVQ_SMTP_TLS and EVQ_SMTP_CA_FILE"
        if cause == "greeting_refused":
            return f"{self.host}:{self.port} refused the session: check EVQ_SMTP_HOST and EVQ_SMTP_HELO_NAME"
        return None

    def __repr__(self) -> str:
        return f"SmtpProvider(host={self.host!r}, port={self.port}, tls={self.tls!r}, user={self.username!r})"

    async def send(self, request: SendRequest) -> Outcome:
        # Policy may have changed since enqueue: nothing leaves unless today's rules pass.
        refusal = check_payload(request.payload, self.policy)
        if refusal is not None:
            outcome: Outcome = Rejected(refusal, response=_bare("policy"), before_send=True)
        elif self._closed:
            outcome = Retryable("the smtp adapter is closed", response=_bare("closed"))
        else:
            async with self._slots:
                outcome = await self._converse(request)
        self._log(request, outcome)
        return outcome

    async def close(self, grace: float = 1.0) -> None:
        """Stop taking sends, give those in flight ``grace`` seconds, then cut them off.

        Never waits longer than that (plus the cut's own grace): a worker's shutdown
        must not hang on a peer. The worker's own shutdown has already waited its grace
        for the sends it cares about; what is cut here is classified by its phase."""
        self._closed = True
        threads = self._alive()
        if threads:
            await asyncio.to_thread(_join_all, threads, grace)
        with self._track:
            live = list(self._live)
        for conversation in live:
            conversation.cut_off()
        threads = self._alive()
        if threads:
            await asyncio.to_thread(_join_all, threads, _CUT_GRACE)

    def _alive(self) -> list[threading.Thread]:
        with self._track:
            return [t for t in self._threads if t.is_alive()]

    async def _converse(self, request: SendRequest) -> Outcome:
        # Rendering a large message is CPU work too, so it happens off the loop.
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Outcome] = loop.create_future()
        holder: list[_Conversation] = []

        def deliver(outcome: Outcome) -> None:
            if not done.done():
                done.set_result(outcome)

        def run() -> None:
            try:
                outcome = self._attempt(request, holder)
            except BaseException as exc:  # a bug here must still become an outcome
                outcome = Unknown(
                    f"the smtp conversation raised {type(exc).__name__}",
                    response={**_bare(holder[0].phase if holder else "build"), "error_class": type(exc).__name__},
                )
            finally:
                with self._track:
                    self._threads.discard(threading.current_thread())
            try:
                loop.call_soon_threadsafe(deliver, outcome)
            except RuntimeError:  # the loop is closed: nobody waits for this answer any more
                pass

        # A daemon thread per conversation: a peer that wedges one can neither starve
        # the others nor keep the process alive at exit (a pool's threads are joined).
        thread = threading.Thread(target=run, name=f"evq-smtp-{request.step_id}", daemon=True)
        with self._track:
            self._threads.add(thread)
        thread.start()
        timeout = limits.left(request.deadline)
        try:
            return await asyncio.wait_for(asyncio.shield(done), timeout=None if timeout is None else max(0.0, timeout))
        except TimeoutError:
            pass
        except asyncio.CancelledError:
            # The worker gave up on this send (its shutdown grace ran out): free the
            # thread; the row is the rescuer's, whatever the thread finds.
            for conversation in holder:
                conversation.cut_off()
            raise
        # The deadline passed: cut the conversation off and let the thread say how far it got.
        for conversation in holder:
            conversation.cut_off()
        try:
            return await asyncio.wait_for(asyncio.shield(done), timeout=_CUT_GRACE)
        except TimeoutError:
            pass
        # The thread did not come back (e.g. still resolving the host): answer from the
        # phase it was last seen in. Past the final "." that is Unknown.
        phase = holder[0].phase if holder else "build"
        response = {**_bare(phase), "error_class": "DeadlineExceeded", "abandoned": True}
        if phase == "final":
            return Unknown(
                "no answer after the final '.' by the send's deadline; the server may have accepted the message",
                response=response,
            )
        return Retryable(f"cut off at {phase}: the send's deadline passed; nothing was sent", response=response)

    def _attempt(self, request: SendRequest, holder: list[_Conversation]) -> Outcome:
        try:
            envelope = build_message(request, internal_domains=self.policy.internal_domains, relay=self.relay)
        except BuildError as exc:
            return Rejected(str(exc), response=_bare("build"), before_send=True)
        conversation = _Conversation(self, envelope, request)
        holder.append(conversation)
        with self._track:
            self._live.add(conversation)
        try:
            remaining = limits.left(request.deadline)
            if remaining is not None and remaining <= 0:
                conversation.cut = True
            return conversation.run()
        finally:
            with self._track:
                self._live.discard(conversation)

    def _log(self, request: SendRequest, outcome: Outcome) -> None:
        # Logged here on the loop, not in the worker thread, so the caller's bound
        # context (run_id, step_id) is present.
        r = outcome.response
        fields = log_fields(
            request.step_id, request.attempt, outcome, phase=r.get("phase"), host=self.host, port=self.port
        )
        journal = r.get("journal")
        if isinstance(journal, dict) and not journal.get("accepted"):
            # The send's outcome stands; only its witness copy is missing.
            log.warning("smtp_journal_refused", journal=journal, **fields)
        if isinstance(outcome, Retryable) and outcome.misconfigured:
            # Retried, but no retry succeeds until someone fixes the settings.
            log.error("smtp_config_failure", reason=outcome.reason, reply=r.get("reply"), **fields)
        else:
            log.debug("smtp_send_finished", **fields)


def _join_all(threads: list[threading.Thread], seconds: float) -> None:
    until = time.monotonic() + seconds
    for thread in threads:
        thread.join(max(0.0, until - time.monotonic()))


def _bare(phase: str) -> dict[str, Any]:
    return {"phase": phase, "code": None, "reply": "", "error_class": None, "refused": {}}
