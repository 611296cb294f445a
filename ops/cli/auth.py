"""The API key on the command line: ``--api-key`` or ``EVQ_API_KEY``, checked against
the keys table (worker/keys.py) by the commands that change rows.

The option object carries the permission its command needs, so `evq schema` states
the roles from the same declaration the command enforces.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import click

from evq.ops.app.service import Caller
from evq.worker.keys import ALLOWED, Identity, Permission, authenticate
from evq.worker.logs import register_secrets
from evq.worker.ports import KeyLookup

F = TypeVar("F", bound=Callable[..., Any])
ENV = "EVQ_API_KEY"


class ApiKeyOption(click.Option):
    def __init__(self, *args: Any, permission: Permission, **kwargs: Any):
        self.permission = permission
        super().__init__(*args, **kwargs)

    @property
    def roles(self) -> list[str]:
        return [str(r) for r in ALLOWED[self.permission]]


@dataclass(frozen=True, slots=True)
class Credential:
    """The key a command was given (maybe none) and the permission the command needs."""

    key: str | None
    permission: Permission

    async def identify(self, lookup: KeyLookup) -> Identity:
        return await authenticate(lookup, self.key, self.permission)

    @property
    def caller(self) -> Caller:
        """The key as the application layer takes it (ops/app/service.py): the command line reads without one."""
        return Caller(self.key, trusted_reader=True)


def _credential(permission: Permission) -> Callable[[click.Context, click.Parameter, Any], Credential]:
    def convert(_ctx: click.Context, _param: click.Parameter, value: str | None) -> Credential:
        register_secrets([value])  # before anything can log it
        return Credential(value or None, permission)

    return convert


def api_key_option(permission: Permission) -> Callable[[F], F]:
    roles = " or ".join(str(r) for r in ALLOWED[permission])
    return click.option(
        "--api-key",
        "credential",
        cls=ApiKeyOption,
        permission=permission,
        envvar=ENV,
        metavar="KEY",
        callback=_credential(permission),
        help=f"API key with role {roles} [env: {ENV}; prefer the variable: flags show in `ps`]. Not needed with --dry-run.",
    )


def dry_run_option(fn: F) -> F:
    return click.option(
        "--dry-run", is_flag=True, help="Print exactly what would change, change nothing; needs no API key."
    )(fn)
