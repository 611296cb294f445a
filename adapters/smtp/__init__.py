"""The SMTP provider adapter, by job:

- ``message``: the payload rendered as RFC 5322 bytes and an envelope (no network);
- ``conversation``: one attempt's SMTP conversation, phase by phase (RFC 1047: docs/design.md,
  "Adapters");
- ``client``: the smtplib client it talks through (whole reply lines only), the greeting
  name, dot-stuffing and the client TLS context;
- ``replies``: what a server's reply means (queue ids, session faults) and what of it is
  scrubbed before it is kept;
- ``provider``: :class:`SmtpProvider`, the port the worker calls;
- ``config``: its ``EVQ_SMTP_*`` options and :class:`SmtpConfig`.

The names below are loaded on first use (PEP 562), so the settings loader, which reads
``config`` for every `evq` command, does not pay for smtplib and the renderer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = [
    "BuildError",
    "Envelope",
    "SmtpConfig",
    "SmtpProvider",
    "address_literal",
    "build_message",
    "queue_id",
    "tls_context",
]

_WHERE = {
    "BuildError": "evq.adapters.smtp.message",
    "Envelope": "evq.adapters.smtp.message",
    "build_message": "evq.adapters.smtp.message",
    "address_literal": "evq.adapters.smtp.client",
    "queue_id": "evq.adapters.smtp.replies",
    "tls_context": "evq.adapters.smtp.client",
    "SmtpProvider": "evq.adapters.smtp.provider",
    "SmtpConfig": "evq.adapters.smtp.config",
}

if TYPE_CHECKING:
    from evq.adapters.smtp.client import address_literal, tls_context
    from evq.adapters.smtp.config import SmtpConfig
    from evq.adapters.smtp.message import BuildError, Envelope, build_message
    from evq.adapters.smtp.provider import SmtpProvider
    from evq.adapters.smtp.replies import queue_id


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'evq.adapters.smtp' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
