"""Errors that cross an interface boundary.

Every error a caller can act on carries a stable machine code (``E_*``). The CLI
maps the code to a fixed exit code (ops/cli/output.py); the HTTP API maps it to
a status. Nothing here ever carries a secret: messages are built from request
fields and identifiers only.
"""

from __future__ import annotations

from typing import Any


class EvqError(Exception):
    code = "E_INTERNAL"

    def __init__(self, message: str, *, hint: str | None = None, context: dict[str, Any] | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.context = context or {}

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.hint:
            out["hint"] = self.hint
        if self.context:
            out["context"] = self.context
        return out


class InvalidRequest(EvqError):
    """The request (or a flag) is malformed; ``context["fields"]`` names each failing field."""

    code = "E_INVALID_ARG"

    def __init__(self, errors: list[dict[str, str]], *, hint: str | None = None):
        self.errors = errors
        first = errors[0]
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        super().__init__(
            f"invalid request: {first['field']}: {first['message']}{more}",
            hint=hint,
            context={"fields": errors},
        )


class Unresolvable(InvalidRequest):
    """A step through a provider whose lost answers nothing could ever settle (no dedupe, no
    lookup, no webhook), refused because EVQ_REFUSE_UNRESOLVABLE is on. A refused enqueue like
    any field error (``context["fields"]`` names each ``provider``), with a code of its own."""

    code = "E_UNRESOLVABLE"


class Conflict(EvqError):
    code = "E_CONFLICT"


class IdempotencyConflict(Conflict):
    """The idempotency key is taken by a different request: another payload or another provider."""


class StateConflict(Conflict):
    """The row is not in the state the operation requires (or someone else changed it first)."""


class NotFound(EvqError):
    code = "E_NOT_FOUND"


class AuthFailed(EvqError):
    """No key, a wrong or revoked one (HTTP 401)."""

    code = "E_AUTH_FAILED"


class BadKey(AuthFailed):
    """A key was presented and is wrong or revoked (what a guesser gets; servers count them)."""


class Forbidden(AuthFailed):
    """A valid key whose role may not do this (HTTP 403); the same code everywhere else."""


class SchemaMismatch(EvqError):
    code = "E_SCHEMA_MISMATCH"


class DatabaseUnavailable(EvqError):
    code = "E_DB_UNAVAILABLE"


class ReadOnlyDatabase(DatabaseUnavailable):
    """The database refuses writes (read-only transaction, hot standby, disk full)."""


class ConfigError(EvqError):
    """A setting is wrong. Like every E_INVALID_ARG, ``context["fields"]`` names what failed."""

    code = "E_INVALID_ARG"

    def __init__(self, message: str, *, hint: str | None = None, field: str = "$settings"):
        super().__init__(message, hint=hint, context={"fields": [{"field": field, "message": message}]})


class Aborted(EvqError):
    """Long work stopped by its first interrupt; ``context`` holds what was done so far."""

    code = "E_ABORTED"


class MaxFailures(EvqError):
    """Long work stopped after too many consecutive failures; ``context`` holds what was done."""

    code = "E_MAX_FAILURES"


class BudgetExceeded(InvalidRequest):
    """A new send over a blast-radius budget (worker/approval_policy.py) with EVQ_BUDGET_ACTION=refuse.
    A refused enqueue like any field error (``context["fields"]`` names the budget, its scope,
    cap and what was used), with a code of its own; nothing was written or charged."""

    code = "E_BUDGET"
