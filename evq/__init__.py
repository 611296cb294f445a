"""evq: an evidence queue for side-effecting email actions.

The public API, for a program that enqueues sends inside its own transactions::

    import evq
    with psycopg.connect(url) as conn, conn.transaction():
        step = evq.enqueue(conn, {...})

Everything else lives under ``evq.worker`` (the core), ``evq.adapters`` (PostgreSQL,
SMTP, HTTP), ``evq.ops`` (the interfaces: CLI, HTTP API, ops page, MCP) and
``evq.migrations``; docs/design.md says which may import which. Names outside
``__all__`` are internal and may change between versions.

The names are loaded on first use (PEP 562), so ``evq --version`` and the CLI's other
short commands do not pay for psycopg and the validator when they do not need them.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

__version__ = "0.2.0"

# In a source checkout the subpackages are the repository's top-level folders (worker/,
# adapters/, ops/, migrations/ beside this one); the wheel maps them inside evq/
# (pyproject.toml, [tool.setuptools.package-dir]). Adding the checkout's root to this
# package's path makes `evq.worker` the same module in both, with no copy and no second name.
_here = os.path.dirname(os.path.abspath(__file__))
_checkout = os.path.dirname(_here)
if not os.path.isdir(os.path.join(_here, "worker")) and os.path.isfile(
    os.path.join(_checkout, "worker", "__init__.py")
):
    __path__.append(_checkout)

__all__ = [
    "AuthFailed",
    "Conflict",
    "DatabaseUnavailable",
    "EnqueueResult",
    "EvqError",
    "IdempotencyConflict",
    "InvalidRequest",
    "Policy",
    "Unresolvable",
    "__version__",
    "enqueue",
    "enqueue_async",
    "enqueue_many",
    "enqueue_many_async",
    "enqueue_own",
]

_WHERE = {
    "enqueue": "evq.adapters.postgres.enqueue",
    "enqueue_async": "evq.adapters.postgres.enqueue",
    "enqueue_many": "evq.adapters.postgres.enqueue",
    "enqueue_many_async": "evq.adapters.postgres.enqueue",
    "enqueue_own": "evq.adapters.postgres.enqueue",
    "EnqueueResult": "evq.worker.records",
    "Policy": "evq.worker.request",
    "EvqError": "evq.worker.errors",
    "InvalidRequest": "evq.worker.errors",
    "Conflict": "evq.worker.errors",
    "IdempotencyConflict": "evq.worker.errors",
    "AuthFailed": "evq.worker.errors",
    "DatabaseUnavailable": "evq.worker.errors",
    "Unresolvable": "evq.worker.errors",
}

if TYPE_CHECKING:
    from evq.adapters.postgres.enqueue import enqueue, enqueue_async, enqueue_many, enqueue_many_async, enqueue_own
    from evq.worker.errors import (
        AuthFailed,
        Conflict,
        DatabaseUnavailable,
        EvqError,
        IdempotencyConflict,
        InvalidRequest,
        Unresolvable,
    )
    from evq.worker.records import EnqueueResult
    from evq.worker.request import Policy


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'evq' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
