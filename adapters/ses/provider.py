"""Amazon SES adapter: SES API v2 ``SendEmail`` through boto3, with the step's evq_key tag.

What is sent: ``Content.Raw``, the RFC 5322 bytes adapters/smtp/message.py renders (the
same rendering, checks and Message-ID as an SMTP send), with ``Destination`` the envelope
(To/Cc from the rendered headers, Bcc only there), ``EmailTags`` ``evq_key`` =
:func:`worker.delivery.key_tag` (nothing else of evq's, nothing secret) and
``ConfigurationSetName`` from ``EVQ_SES_CONFIGURATION_SET`` (its event destination
publishes delivery events to SNS). Raw rather than Simple content because the message is
then exactly the one evq rendered and verified (header-injection checks, display names,
RFC 2047 words) and carries our Message-ID into SES; SES writes its own Message-ID on the
copy it delivers (its documented behaviour for every content type), but its events echo
the original headers and the tags, which is what matches an event to its step.

SES has no idempotency key, so ``dedupe_window`` is None: an ambiguous send is ``unknown``
and never sent again by evq. Classification (docs/design.md, "Adapters"; fail closed):

| answer | outcome |
|---|---|
| 2xx with a ``MessageId`` | accepted, with SES's MessageId |
| ``TooManyRequestsException``, ``Throttling``/``ThrottlingException``, ``LimitExceededException``, any 429 | retryable, ``throttled`` (pauses the provider for every worker) |
| ``MessageRejected``, ``BadRequestException``, ``InvalidParameterValue``, ``ValidationException``, ``MailFromDomainNotVerifiedException`` | rejected |
| ``AccountSuspendedException``, ``SendingPausedException``, ``AccessDenied(Exception)``, ``NotFoundException`` (the configuration set) | retryable, misconfigured, fault ``forbidden`` (opens the circuit) |
| a credential SES refuses (``UnrecognizedClientException``, ``InvalidSignatureException``, ``ExpiredToken``, ...) or none found | retryable, misconfigured, fault ``auth_failed`` (opens the circuit) |
| ``ServiceUnavailable`` (5xx, SES's own error) | retryable: SES says it did not take the request |
| no connection, or failed before the whole request was written (a proxy refusing or cutting the ``CONNECT`` tunnel included) | retryable (``connection_refused`` opens the circuit) |
| read timeout or reset after the whole request was written | unknown |
| 5xx without SES's own error (a gateway answered), ``InternalFailure`` | unknown |
| anything else (an unknown error code, an unreadable answer, an exception) | unknown |

boto3 builds, signs and parses every call; only the HTTP exchange is this module's
(``before-send`` hands botocore the answer), through httpx with its trace events, so
whether the request was written is known exactly, as in adapters/http/provider.py (a
forward proxy's ``CONNECT``, whose events come through the same hook, is not our request), and
``send_by`` is checked after connecting, right before the first byte (invariant 9). Each
send uses a fresh connection: a pooled one that SES closed while idle would fail after
our request was written, which cannot be told from a lost answer. botocore's own retries
are off (``total_max_attempts=1``): evq decides retries, and a hidden retry of an
ambiguous send is a duplicate. boto3 is synchronous, so each send runs in a bounded
thread pool (the worker's concurrency); at the request's deadline the adapter shuts the
socket down and answers from how far the exchange got.

Credentials (settings or the AWS chain) are registered as secrets, never logged, never in
evidence; the answers kept as evidence are scrubbed.

Beside it: adapters/ses/exchange.py follows how far each exchange got (the trace hook), and
adapters/ses/error_codes.py holds SES's error codes and the outcome of an error answer.
"""

from __future__ import annotations

import asyncio
import ssl
import threading
from concurrent.futures import Future, ThreadPoolExecutor, wait
from email import policy as email_policy
from email.parser import BytesParser
from typing import Any

import boto3
import botocore.session
import httpx
from botocore.awsrequest import AWSResponse
from botocore.config import Config
from botocore.exceptions import (
    ClientError,
    NoCredentialsError,
    NoRegionError,
    ParamValidationError,
    PartialCredentialsError,
)

from evq.adapters import answers
from evq.adapters.ses.error_codes import classify
from evq.adapters.ses.exchange import Attempt, Body, Cut, LeaseTooShort, TransportFailed
from evq.adapters.smtp.message import BuildError, Envelope, build_message
from evq.worker import deadline as limits
from evq.worker.delivery import KEY_TAG, key_tag
from evq.worker.errors import ConfigError
from evq.worker.logs import get_logger, register_secrets
from evq.worker.outcomes import Accepted, Outcome, Rejected, Retryable, Unknown, log_fields
from evq.worker.ports import ProviderProfile, SendRequest
from evq.worker.request import Policy, check_payload
from evq.worker.secret_scrub import scrub_text

log = get_logger("evq.adapters.ses")

# How long a cut-off send's thread gets to report how far it got, once its socket is shut down.
_CUT_GRACE = 0.5


class SesProvider:
    """The SES adapter: satisfies :class:`worker.ports.Provider` (no lookup: SES has none by our values)."""

    name = "ses"
    # SES has no idempotency key: an ambiguous send is unknown, never retried by evq.
    dedupe_window: float | None = None

    def __init__(
        self,
        *,
        region: str | None = None,
        endpoint_url: str | None = None,
        configuration_set: str | None = None,
        timeout: float = 10.0,
        access_key_id: str | None = None,
        secret_access_key: str | None = None,
        policy: Policy = Policy(),
        max_workers: int = 16,
        profile: ProviderProfile | None = None,
    ):
        # What settles a lost answer: the composition root passes the one the settings give
        # (SES events only with a configuration set and a verified webhook); else none known.
        self.profile = profile if profile is not None else ProviderProfile()
        if timeout <= 0 or max_workers < 1:
            raise ValueError("timeout must be positive and max_workers at least 1")
        if bool(access_key_id) != bool(secret_access_key):
            raise ValueError("an access key id needs its secret access key")
        register_secrets([access_key_id, secret_access_key])
        self.endpoint_url = endpoint_url
        self.configuration_set = configuration_set
        self.timeout = timeout
        self.policy = policy
        core = botocore.session.Session()
        session = boto3.session.Session(
            aws_access_key_id=access_key_id or None,
            aws_secret_access_key=secret_access_key or None,
            region_name=region or None,
            botocore_session=core,
        )
        # Resolved once from settings or the AWS chain; refreshed credentials are registered
        # as secrets again at each send (_register_credentials).
        self._credentials = session.get_credentials()
        self._registered: tuple[str | None, str | None] = (None, None)
        self._register_credentials()
        config = Config(
            retries={"total_max_attempts": 1, "mode": "standard"},
            connect_timeout=timeout,
            read_timeout=timeout,
            user_agent_extra="evq",
        )
        try:
            self._client = session.client("sesv2", endpoint_url=endpoint_url or None, config=config)
        except NoRegionError:
            raise ConfigError(
                "the SES adapter needs a region: set AWS_REGION (or a profile's region)", field="AWS_REGION"
            ) from None
        self.region = self._client.meta.region_name
        self._client.meta.events.register("before-send.sesv2.SendEmail", self._exchange)
        ca_bundle = core.get_config_variable("ca_bundle")
        self._http = httpx.Client(
            timeout=httpx.Timeout(timeout),
            # A fresh connection per send (the module's docstring says why).
            limits=httpx.Limits(max_connections=max_workers, max_keepalive_connections=0),
            follow_redirects=False,
            verify=ssl.create_default_context(cafile=ca_bundle) if ca_bundle else True,
        )
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="evq-ses")
        self._local = threading.local()
        self._live: set[Attempt] = set()
        self._jobs: set[Future[Outcome]] = set()
        self._track = threading.Lock()
        self._closed = False

    def __repr__(self) -> str:
        return f"SesProvider(region={self.region!r}, endpoint_url={self.endpoint_url!r}, configuration_set={self.configuration_set!r})"

    # -- send -------------------------------------------------------------------

    async def send(self, request: SendRequest) -> Outcome:
        # Policy may have changed since enqueue: nothing leaves unless today's rules pass.
        refusal = check_payload(request.payload, self.policy)
        if refusal is not None:
            outcome: Outcome = Rejected(refusal, response=answers.evidence("policy"), before_send=True)
        elif self._closed:
            outcome = _closed()
        else:
            outcome = await self._run(request)
        self._log(request, outcome)
        return outcome

    def _message(self, request: SendRequest) -> dict[str, Any]:
        """The SendEmail parameters: the same on every attempt but for the Date header."""
        envelope = build_message(request, internal_domains=self.policy.internal_domains)
        if envelope.smtputf8:
            raise BuildError("SES does not take addresses with a non-ASCII local part (SMTPUTF8)")
        message: dict[str, Any] = {
            "FromEmailAddress": envelope.sender,
            "Destination": destination(envelope),
            "Content": {"Raw": {"Data": envelope.data}},
            "EmailTags": [{"Name": KEY_TAG, "Value": key_tag(request.idempotency_key, request.message_id)}],
        }
        if self.configuration_set:
            message["ConfigurationSetName"] = self.configuration_set
        return message

    async def _run(self, request: SendRequest) -> Outcome:
        attempt = Attempt(request.send_by, request.deadline)
        loop = asyncio.get_running_loop()
        try:
            job = self._pool.submit(self._call, attempt, request)
        except RuntimeError:  # closed meanwhile: nothing was started
            return _closed()
        with self._track:
            self._jobs.add(job)
        job.add_done_callback(self._forget)
        done = asyncio.wrap_future(job, loop=loop)
        timeout = limits.left(request.deadline)
        try:
            return await asyncio.wait_for(asyncio.shield(done), timeout=None if timeout is None else max(0.0, timeout))
        except TimeoutError:
            pass
        except asyncio.CancelledError:
            if _closed_before_start(job):
                return _closed()
            # The worker gave up on this send (its shutdown grace ran out): free the thread;
            # the row is the rescuer's, whatever the thread finds.
            attempt.cut_off()
            raise
        phase = attempt.cut_off()
        try:
            return await asyncio.wait_for(asyncio.shield(done), timeout=_CUT_GRACE)
        except TimeoutError:
            pass
        except asyncio.CancelledError:
            if _closed_before_start(job):
                return _closed()
            raise
        response = {
            **answers.evidence("answer" if phase != "request" else "request"),
            "error_class": "DeadlineExceeded",
        }
        if phase != "request":
            return Unknown(
                "no answer from SES by the send's deadline after the request began; SES may have accepted it",
                response={**response, "sent": True},
            )
        return Retryable(
            "cut off before the request began: the send's deadline passed; nothing was sent", response=response
        )

    def _forget(self, job: Future[Outcome]) -> None:
        with self._track:
            self._jobs.discard(job)

    def _call(self, attempt: Attempt, request: SendRequest) -> Outcome:
        """One SendEmail in a pool thread (rendering a large message is CPU work too, so it
        happens here, off the loop); every exception becomes an outcome."""
        try:
            message = self._message(request)
        except BuildError as exc:
            return Rejected(str(exc), response=answers.evidence("build"), before_send=True)
        self._local.attempt = attempt
        with self._track:
            self._live.add(attempt)
        try:
            answer = self._client.send_email(**message)
        except LeaseTooShort:
            return Retryable(
                "not sent: the lease no longer leaves time to send and record",
                response=answers.evidence("request", error_class="LeaseTooShort"),
            )
        except Cut:
            return Retryable(
                "not sent: the send's deadline passed before the request began",
                response=answers.evidence("request", error_class="DeadlineExceeded"),
            )
        except TransportFailed as exc:
            return self._failed(exc)
        except ClientError as exc:
            return classify(exc, self._scrub)
        except (NoCredentialsError, PartialCredentialsError) as exc:
            return Retryable(
                f"{type(exc).__name__}: no AWS credentials were found for SES; nothing was sent "
                "(set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, a profile or a role: the AWS chain)",
                response=answers.evidence("request", error_class=type(exc).__name__),
                misconfigured=True,
                fault="auth_failed",
            )
        except ParamValidationError as exc:
            # botocore refused the parameters before building a request.
            return Rejected(
                f"not sent: {self._scrub(str(exc))[:300]}",
                response=answers.evidence("request", error_class="ParamValidationError"),
                before_send=True,
            )
        except Exception as exc:  # fail closed: the provider may have acted
            return Unknown(
                f"the ses send raised {type(exc).__name__}; SES may have accepted it",
                response=answers.evidence(
                    attempt.phase, error_class=type(exc).__name__, sent=attempt.phase != "request"
                ),
            )
        finally:
            self._local.attempt = None
            with self._track:
                self._live.discard(attempt)
        answer = answer if isinstance(answer, dict) else {}
        message_id = answer.get("MessageId")
        meta = answer.get("ResponseMetadata") or {}
        if not isinstance(message_id, str) or not message_id:
            return Unknown(
                "SES answered without a MessageId; it may have accepted the message",
                response=answers.evidence("answer", code=meta.get("HTTPStatusCode"), sent=True),
            )
        return Accepted(
            provider_message_id=message_id,
            response=answers.evidence(
                "answer", code=meta.get("HTTPStatusCode"), sent=True, request_id=meta.get("RequestId")
            ),
        )

    def _exchange(self, request: Any, **_kwargs: Any) -> AWSResponse:
        """botocore's ``before-send``: the signed request, sent here, answered to botocore."""
        attempt: Attempt | None = getattr(self._local, "attempt", None)
        if attempt is None:
            # Only _call sends; anything else must not reach SES through an unwatched path.
            raise Cut
        self._register_credentials()
        body = request.body
        if hasattr(body, "read"):
            body = body.read()
        headers = {k: v.decode() if isinstance(v, bytes) else v for k, v in request.headers.items()}
        each = limits.bounded(self.timeout, attempt.deadline)
        try:
            response = self._http.request(
                request.method,
                request.url,
                headers=headers,
                content=body,
                extensions={
                    "trace": attempt.trace,
                    "timeout": {"connect": each, "read": each, "write": each, "pool": each},
                },
            )
        except (LeaseTooShort, Cut):
            raise
        except (httpx.HTTPError, OSError) as exc:
            raise TransportFailed(exc, attempt.written) from None
        return AWSResponse(request.url, response.status_code, dict(response.headers), Body(response.content))

    def _failed(self, exc: TransportFailed) -> Outcome:
        return answers.transport_failure(exc.error, written=exc.written, detail=self._scrub(str(exc.error)), who="SES")

    def _register_credentials(self) -> None:
        if self._credentials is None:
            return
        try:
            frozen = self._credentials.get_frozen_credentials()
        except Exception:  # refreshing failed: the send itself will say so
            return
        pair = (frozen.secret_key, frozen.token)
        if pair != self._registered:
            register_secrets([frozen.access_key, frozen.secret_key, frozen.token])
            self._registered = pair

    def _scrub(self, text: str) -> str:
        return scrub_text(text)[: answers.MAX_BODY * 4]

    def _log(self, request: SendRequest, outcome: Outcome) -> None:
        r = outcome.response
        fields = log_fields(
            request.step_id,
            request.attempt,
            outcome,
            sent=r.get("sent"),
            region=self.region,
            error_name=r.get("error_name"),
        )
        if isinstance(outcome, Retryable) and outcome.misconfigured:
            # Retried, but no retry succeeds until someone fixes the account or the settings.
            log.error("ses_config_failure", reason=outcome.reason, **fields)
        else:
            log.debug("ses_send_finished", **fields)

    async def close(self, grace: float = 1.0) -> None:
        """Stop taking sends, give those in flight ``grace`` seconds, then cut them off."""
        self._closed = True
        self._pool.shutdown(wait=False, cancel_futures=True)
        with self._track:
            jobs = list(self._jobs)
        if jobs:
            await asyncio.to_thread(wait, jobs, grace)
        with self._track:
            live = list(self._live)
            jobs = list(self._jobs)
        for attempt in live:
            attempt.cut_off()
        if jobs:
            await asyncio.to_thread(wait, jobs, _CUT_GRACE)
        self._http.close()
        self._client.close()


def destination(envelope: Envelope) -> dict[str, list[str]]:
    """SES's ``Destination`` for a rendered message: To and Cc as its headers say, and every
    other envelope recipient (the Bcc, which no header names) as Bcc."""
    parser = BytesParser(policy=email_policy.default)
    headers = parser.parsebytes(envelope.data, headersonly=True)
    groups: dict[str, list[str]] = {}
    seen: set[str] = set()
    for header, key in (("to", "ToAddresses"), ("cc", "CcAddresses")):
        named = {f"{a.username}@{a.domain}".lower() for a in (headers[header].addresses if header in headers else ())}
        picked = [r for r in envelope.recipients if r.lower() in named and r.lower() not in seen]
        seen |= {r.lower() for r in picked}
        if picked:
            groups[key] = picked
    bcc = [r for r in envelope.recipients if r.lower() not in seen]
    if bcc:
        groups["BccAddresses"] = bcc
    return groups


def _closed() -> Retryable:
    return Retryable("the ses adapter is closed", response=answers.evidence("closed"))


def _closed_before_start(job: Future[Outcome]) -> bool:
    """Whether the send's job was cancelled by :meth:`SesProvider.close` while still queued (so
    it never ran: nothing was sent), rather than the caller's task being cancelled."""
    task = asyncio.current_task()
    return job.cancelled() and (task is None or task.cancelling() == 0)
