"""The Amazon SES adapter (SES API v2 through boto3): ``provider`` holds
:class:`SesProvider`, ``exchange`` how far each send's HTTP exchange got, ``error_codes``
SES's error codes and what each makes of a send, ``config`` its ``EVQ_SES_*`` options and
:class:`SesConfig`.

The names below are loaded on first use (PEP 562), so the settings loader, which reads
``config`` for every `evq` command, does not pay for boto3.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["SesConfig", "SesProvider", "destination"]

_WHERE = {
    "SesConfig": "evq.adapters.ses.config",
    "SesProvider": "evq.adapters.ses.provider",
    "destination": "evq.adapters.ses.provider",
}

if TYPE_CHECKING:
    from evq.adapters.ses.config import SesConfig
    from evq.adapters.ses.provider import SesProvider, destination


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'evq.adapters.ses' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
