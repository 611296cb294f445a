"""API keys: who may change rows, and under which name evidence records them.

A key reads ``evq_<key id>_<secret>``. The key id (12 hex digits) is stored in
clear so a key is found with one indexed lookup; the secret is stored only as a
salted scrypt hash and compared in constant time. The key's *name* is the actor
written into evidence; its *role* says what it may do.

Nothing here touches the database: the lookup comes in through :class:`KeyLookup`,
so every interface (CLI, HTTP API, MCP) authenticates the same way.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from worker.errors import AuthFailed, Forbidden, InvalidRequest


class Role(StrEnum):
    AGENT = "agent"
    OPERATOR = "operator"
    ADMIN = "admin"


class Permission(StrEnum):
    READ = "read"
    ENQUEUE = "enqueue"
    RESOLVE = "resolve"
    MANAGE_KEYS = "manage_keys"
    PRUNE = "prune"  # evq prune: deletes history for good


# Which roles hold each permission. Anything not listed is refused.
ALLOWED: dict[Permission, tuple[Role, ...]] = {
    # Reading needs a key only where the caller is not trusted with the database (HTTP, MCP).
    Permission.READ: (Role.AGENT, Role.OPERATOR, Role.ADMIN),
    Permission.ENQUEUE: (Role.AGENT, Role.ADMIN),
    Permission.RESOLVE: (Role.OPERATOR, Role.ADMIN),
    Permission.MANAGE_KEYS: (Role.ADMIN,),
    Permission.PRUNE: (Role.ADMIN,),
}

PREFIX = "evq_"
_KEY = re.compile(r"^evq_([0-9a-f]{12})_([A-Za-z0-9_-]{32,128})$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$")

# scrypt cost: about 16 MiB and a few tens of milliseconds per check. The secrets
# are 256 random bits, so the hash guards a stolen table, not a guessable password.
_N, _R, _P, _DKLEN = 2**14, 8, 1, 32


@dataclass(frozen=True, slots=True)
class Identity:
    """Who a verified key belongs to: ``name`` is the actor recorded in evidence."""

    name: str
    role: Role

    def may(self, permission: Permission) -> bool:
        return self.role in ALLOWED[permission]


@dataclass(frozen=True, slots=True)
class NewKey:
    key_id: str
    secret: str

    @property
    def text(self) -> str:
        """The key as its holder uses it; shown once, never stored."""
        return f"{PREFIX}{self.key_id}_{self.secret}"

    @property
    def prefix(self) -> str:
        return f"{PREFIX}{self.key_id}"


def generate() -> NewKey:
    return NewKey(key_id=secrets.token_hex(6), secret=secrets.token_urlsafe(32))


def hash_secret(secret: str, salt: bytes | None = None) -> str:
    """``scrypt$N$r$p$salt$hash``: the parameters travel with the hash so they can change later."""
    salt = salt if salt is not None else secrets.token_bytes(16)
    digest = hashlib.scrypt(secret.encode(), salt=salt, n=_N, r=_R, p=_P, dklen=_DKLEN)
    return f"scrypt${_N}${_R}${_P}${salt.hex()}${digest.hex()}"


def verify_secret(secret: str, stored: str) -> bool:
    try:
        scheme, n, r, p, salt, expected = stored.split("$")
        if scheme != "scrypt":
            return False
        digest = hashlib.scrypt(
            secret.encode(), salt=bytes.fromhex(salt), n=int(n), r=int(r), p=int(p), dklen=len(expected) // 2
        )
    except ValueError:
        return False
    return hmac.compare_digest(digest.hex(), expected)


# Checked against when a key id is unknown, so an unknown id costs as much as a wrong secret.
_DECOY = hash_secret("decoy-secret-that-matches-nothing")


def split_key(text: str) -> tuple[str, str] | None:
    match = _KEY.match(text.strip())
    return (match[1], match[2]) if match else None


def check_name(name: str) -> str:
    if not _NAME.match(name):
        raise InvalidRequest(
            [{"field": "--name", "message": "1 to 64 of letters, digits and . _ @ -, starting with a letter or digit"}]
        )
    return name


class KeyLookup(Protocol):
    async def key_by_id(self, key_id: str) -> Mapping[str, Any] | None:
        """The stored key (name, role, secret_hash, revoked_at) with this id, or None."""
        ...


# How a command-line user gives a key; other interfaces pass their own words.
CLI_KEY_SOURCE = "EVQ_API_KEY or --api-key"


class Verified:
    """Keys a long-running server has verified, so each request does not pay for scrypt.

    The row is still read every time (a revoke or a role change applies at once); what
    is remembered is only that this secret matched this stored hash, by the secret's
    SHA-256 (the secrets are 256 random bits: the slow hash guards a stolen table,
    not the process's memory). Bounded, forgetting the oldest first.
    """

    def __init__(self, size: int = 1024):
        self.size = size
        self._seen: dict[tuple[str, str], str] = {}

    def check(self, key_id: str, secret: str, stored: str) -> bool:
        digest = hashlib.sha256(secret.encode()).hexdigest()
        known = self._seen.get((key_id, stored))
        if known is not None:
            return hmac.compare_digest(known, digest)
        if not verify_secret(secret, stored):
            return False
        if len(self._seen) >= self.size:
            self._seen.pop(next(iter(self._seen)))
        self._seen[(key_id, stored)] = digest
        return True


async def authenticate(
    lookup: KeyLookup,
    presented: str | None,
    permission: Permission,
    *,
    source: str = CLI_KEY_SOURCE,
    verified: Verified | None = None,
) -> Identity:
    """The identity behind ``presented`` if it may do ``permission``; AuthFailed otherwise
    (Forbidden, a subclass, when the key is good but its role may not).

    Every refusal is the same error code; the message says what to fix without
    ever repeating the key. ``source`` names where the caller puts a key.
    """
    roles = [str(r) for r in ALLOWED[permission]]
    context = {"permission": str(permission), "roles": roles}
    if not presented:
        raise AuthFailed(
            f"this command needs an API key with role {' or '.join(roles)}",
            hint=f"give a key in {source}; `evq keys create` makes one"
            + (" (--dry-run needs none)" if source == CLI_KEY_SOURCE else ""),
            context=context,
        )
    parts = split_key(presented)
    row = await lookup.key_by_id(parts[0]) if parts else None
    if parts and row is not None and verified is not None:
        ok = verified.check(parts[0], parts[1], row["secret_hash"])
    else:
        ok = verify_secret(parts[1] if parts else presented, row["secret_hash"] if row else _DECOY)
    if row is None or not ok:
        raise AuthFailed("the API key is not valid", hint=f"check the key in {source}", context=context)
    identity = Identity(name=row["name"], role=Role(row["role"]))
    if row["revoked_at"] is not None:
        raise AuthFailed(
            f"the API key {identity.name!r} was revoked",
            hint="ask an admin for a new key",
            context={**context, "name": identity.name},
        )
    return authorize(identity, permission)


def authorize(identity: Identity, permission: Permission) -> Identity:
    """``identity`` if its role may do ``permission``; Forbidden otherwise."""
    if not identity.may(permission):
        roles = [str(r) for r in ALLOWED[permission]]
        raise Forbidden(
            f"the API key {identity.name!r} has role {identity.role}; this command needs {' or '.join(roles)}",
            context={"permission": str(permission), "roles": roles, "name": identity.name, "role": str(identity.role)},
        )
    return identity
