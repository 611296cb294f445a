"""The API keys as worker/keys.py reads them: the database stays behind this port."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol


class KeyLookup(Protocol):
    async def key_by_id(self, key_id: str) -> Mapping[str, Any] | None:
        """The stored key (name, role, secret_hash, revoked_at, session_generation, approval) with this
        id, and the server's ``pepper``; None when there is no such key."""
        ...

    async def list_keys(self) -> list[dict[str, Any]]:
        """Every key, oldest first, as `evq keys list` shows them (name, role, key_id, created and
        revoked by and at, notify_email, notify_url, approval): never a secret or its hash."""
        ...

    async def rehash_key(self, key_id: str, *, old: str, new: str) -> None:
        """Replace the key's hash ``old`` by ``new`` (a legacy scrypt hash by its HMAC)."""
        ...
