"""What an HTTP-speaking adapter (adapters/http/, adapters/ses/) keeps of a provider's answer.

One shape for the evidence of every attempt, so the trace, the ops page and the operator read
the same fields whichever API answered: where in the exchange it ended (``phase``), the status
``code``, the start of the provider's words (``reply``, at most :data:`MAX_BODY` characters, already
scrubbed by the caller), the exception class or the provider's error name, and whether the whole
request had been written (``sent``: what decides between retryable and unknown).
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from typing import Any

import httpx

from evq.worker.outcomes import Outcome, Retryable, Unknown

MAX_BODY = 500  # characters of an answer kept as evidence


def evidence(
    phase: str,
    *,
    code: int | None = None,
    reply: str = "",
    error_class: str | None = None,
    error_name: str | None = None,
    sent: bool = False,
    **extra: Any,
) -> dict[str, Any]:
    """The evidence of one attempt's answer; ``extra``: fields of one provider (SES's request id)."""
    return {
        "phase": phase,
        "code": code,
        "reply": reply[:MAX_BODY],
        "error_class": error_class,
        "error_name": error_name,
        "sent": sent,
        **extra,
    }


def short(text: str, limit: int = 200) -> str:
    """``text`` on one line, at most ``limit`` characters: for a log line or an outcome's reason."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def is_tunnel(info: Mapping[str, Any]) -> bool:
    """Whether an httpcore ``*.started`` trace event belongs to a proxy's ``CONNECT`` (HTTPS_PROXY,
    which httpx honours): httpcore passes our trace hook on to that request too, and writing it
    sends nothing to the provider; only our own request's events say how far the send got. The
    ``*.complete`` events carry no request: a caller remembers what the last ``started`` was."""
    request = info.get("request")
    return getattr(request, "method", None) == b"CONNECT"


def transport_failure(error: BaseException, *, written: bool, detail: str, who: str) -> Outcome:
    """The outcome of an exchange that failed without an answer: ``Unknown`` once the whole
    request was ``written`` (``who`` may have acted on it), else ``Retryable`` with the
    transport's fault, if it names one. ``detail``: the error's text, already scrubbed."""
    error_class = type(error).__name__
    if written:
        return Unknown(
            f"{error_class} after the request was sent; {who} may have accepted it",
            response=evidence("answer", error_class=error_class, reply=detail, sent=True),
        )
    return Retryable(
        f"{error_class} before the request was sent" + (f": {short(detail)}" if detail else ""),
        response=evidence("request", error_class=error_class, reply=detail),
        fault=transport_fault(error),
    )


def transport_fault(exc: BaseException) -> str | None:
    """Nothing listening, or TLS that fails (a certificate that does not verify): the
    provider or our settings, not this message (worker/circuit.py)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ConnectionRefusedError):
            return "connection_refused"
        if isinstance(seen, ssl.SSLError):
            return "tls_failed"
        seen = seen.__cause__ or seen.__context__
    text = str(exc)
    # httpcore re-raises the OS error as its own ConnectError with only the message left.
    if isinstance(exc, httpx.ConnectError):
        if "Connection refused" in text or "Errno 111" in text:
            return "connection_refused"
        if "CERTIFICATE_VERIFY_FAILED" in text or "SSL" in text:
            return "tls_failed"
    return None
