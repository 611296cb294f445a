"""The API key on the command line: ``--api-key`` or ``EVQ_API_KEY``, checked against
the keys table (worker/keys.py) by the commands that change rows.

The command table (ops/app/commands/) names the permission each command's key needs,
so `evq schema` states the roles from the same declaration the command enforces.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import click

from evq.ops.app.service import Caller
from evq.worker.keys import Identity, Permission, authenticate
from evq.worker.logs import register_secrets
from evq.worker.ports import KeyLookup


@dataclass(frozen=True, slots=True)
class Credential:
    """The key a command was given (maybe none) and the permission the command needs."""

    key: str | None
    permission: Permission

    async def identify(self, lookup: KeyLookup) -> Identity:
        return await authenticate(lookup, self.key, self.permission)

    @property
    def caller(self) -> Caller:
        """The key as the application layer takes it (ops/app/service/): the command line reads without one."""
        return Caller(self.key, trusted_reader=True)


def credential_callback(permission: Permission) -> Callable[[click.Context, click.Parameter, Any], Credential]:
    """The ``--api-key`` value (or EVQ_API_KEY) as the Credential the command body receives."""

    def convert(_ctx: click.Context, _param: click.Parameter, value: str | None) -> Credential:
        register_secrets([value])  # before anything can log it
        return Credential(value or None, permission)

    return convert
