"""The HTTP provider adapter (a Resend-style JSON email API): ``provider`` holds
:class:`HttpProvider` and its wire format, ``config`` its ``EVQ_HTTP_*`` options and
:class:`HttpConfig`.

The names below are loaded on first use (PEP 562), so the settings loader, which reads
``config`` for every `evq` command, does not pay for httpx.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = [
    "TAG_NAME",
    "HttpConfig",
    "HttpProvider",
    "WireKeys",
    "legacy_wire_key",
    "retry_after",
    "tag_value",
    "wire_body",
]

_WHERE = {
    "HttpConfig": "evq.adapters.http.config",
    **{
        name: "evq.adapters.http.provider"
        for name in ("TAG_NAME", "HttpProvider", "WireKeys", "legacy_wire_key", "retry_after", "tag_value", "wire_body")
    },
}

if TYPE_CHECKING:
    from evq.adapters.http.config import HttpConfig
    from evq.adapters.http.provider import (
        TAG_NAME,
        HttpProvider,
        WireKeys,
        legacy_wire_key,
        retry_after,
        tag_value,
        wire_body,
    )


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'evq.adapters.http' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
