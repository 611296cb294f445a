"""SES's error codes by what they mean to a send (the table in adapters/ses/provider.py's
docstring; fail closed: a code not known here is ``unknown``), and the outcome of an error answer."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from botocore.exceptions import ClientError

from evq.adapters import answers
from evq.worker.outcomes import Outcome, Rejected, Retryable, Unknown

_THROTTLED = frozenset(
    {
        "TooManyRequestsException",
        "TooManyRequests",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "LimitExceededException",
        "LimitExceeded",
    }
)
_REJECTED = frozenset(
    {
        "MessageRejected",
        "BadRequestException",
        "BadRequest",
        "InvalidParameterValue",
        "InvalidParameterException",
        "InvalidParameter",
        "ValidationException",
        "ValidationError",
        "MailFromDomainNotVerifiedException",
        "MailFromDomainNotVerified",
    }
)
_FORBIDDEN = frozenset(
    {
        "AccountSuspendedException",
        "AccountSuspended",
        "SendingPausedException",
        "SendingPaused",
        "AccessDeniedException",
        "AccessDenied",
        "NotFoundException",
        "ConfigurationSetDoesNotExist",
    }
)
_BAD_CREDENTIALS = frozenset(
    {
        "UnrecognizedClientException",
        "InvalidClientTokenId",
        "InvalidSignatureException",
        "SignatureDoesNotMatch",
        "IncompleteSignature",
        "IncompleteSignatureException",
        "MissingAuthenticationToken",
        "MissingAuthenticationTokenException",
        "ExpiredToken",
        "ExpiredTokenException",
        "AuthFailure",
    }
)
# SES's own word that it did not take the request, for the moment.
_UNAVAILABLE = frozenset({"ServiceUnavailable", "ServiceUnavailableException"})


def classify(exc: ClientError, scrub: Callable[[str], str]) -> Outcome:
    """The outcome of an error answer botocore raised for SendEmail (the provider's docstring
    has the table); ``scrub`` keeps secrets out of the message kept as evidence."""
    error = exc.response.get("Error") or {}
    meta = exc.response.get("ResponseMetadata") or {}
    code = str(error.get("Code") or "")
    status = meta.get("HTTPStatusCode")
    headers = meta.get("HTTPHeaders") or {}
    message = scrub(str(error.get("Message") or ""))
    # An answer SES wrote names its error (x-amzn-ErrorType or the body's code); a gateway's
    # HTML or an empty body leaves botocore only the status as the "code".
    parsed = bool(code) and not code.isdigit()
    evidence = answers.evidence(
        "answer", code=status, reply=message, error_name=code or None, sent=True, request_id=meta.get("RequestId")
    )
    what = f"ses {status} {code}" + (f": {answers.short(message)}" if message else "")
    if code in _THROTTLED or status == 429:
        return Retryable(what, retry_after=retry_after(headers), response=evidence, throttled=True)
    if code in _REJECTED:
        return Rejected(what, response=evidence)
    if code in _FORBIDDEN:
        return Retryable(
            f"{what} (the account or its settings may not send: check SES and EVQ_SES_CONFIGURATION_SET)",
            response=evidence,
            misconfigured=True,
            fault="forbidden",
        )
    if code in _BAD_CREDENTIALS or (status in (401, 403) and not parsed):
        return Retryable(
            f"{what} (check the AWS credentials: AWS_ACCESS_KEY_ID, a profile or a role)",
            response=evidence,
            misconfigured=True,
            fault="auth_failed",
        )
    if code in _UNAVAILABLE and isinstance(status, int) and status >= 500:
        return Retryable(what, retry_after=retry_after(headers), response=evidence)
    if isinstance(status, int) and status >= 500 and not parsed:
        return Unknown(f"{what} without SES's own error; SES may have accepted the message", response=evidence)
    return Unknown(f"{what}: an answer evq does not know; SES may have accepted the message", response=evidence)


def retry_after(headers: Mapping[str, Any]) -> float | None:
    value = str(headers.get("retry-after") or "").strip()
    return float(value) if value.isdigit() else None
