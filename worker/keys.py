"""API keys: who may change rows, and under which name evidence records them.

A key reads ``evq_<key id>_<secret>``. The key id (12 hex digits) is stored in
clear so a key is found with one indexed lookup; the secret is stored only as its
HMAC-SHA256 under a server-side secret (the *pepper*, table ``api_key_pepper``) and
compared in constant time. The secrets are 256 random bits, so a keyed fast hash
guards a stolen table as well as a slow one, and a check costs microseconds: a flood
of wrong keys costs the server next to nothing (scrypt, before, cost tens of
milliseconds and 16 MiB each). Keys hashed with scrypt before that (by evq
0.1) still work; their check runs in a worker thread, never on an event
loop, and the first success rehashes them. The key's *name* is the actor written
into evidence; its *role* says what it may do.

Nothing here touches the database: the lookup comes in through :class:`KeyLookup`,
so every interface (CLI, HTTP API, MCP, the ops page) authenticates the same way, and
:func:`identity_of` is the one place an :class:`Identity` is made.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from evq.worker.approval_policy import KeyApproval
from evq.worker.errors import AuthFailed, BadKey, EvqError, Forbidden, InvalidRequest
from evq.worker.logs import get_logger
from evq.worker.ports import KeyLookup

log = get_logger("evq.keys")


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
    # A message's text and html in `steps show` (every interface). An agent enqueues and
    # reads back status and proof (headers, sizes, SHA-256); the people who check or
    # resend a send see what it says.
    READ_CONTENT = "read_content"
    # A held send's approval or denial (issue 17): a person's decision, never an agent's.
    APPROVE = "approve"
    # Cancelling a send not yet sent: an agent only the steps its own key enqueued
    # (ops/app/approvals.py checks the decision's key); operators and admins any.
    CANCEL = "cancel"


# Which roles hold each permission. Anything not listed is refused.
ALLOWED: dict[Permission, tuple[Role, ...]] = {
    # Reading needs a key only where the caller is not trusted with the database (HTTP, MCP).
    Permission.READ: (Role.AGENT, Role.OPERATOR, Role.ADMIN),
    Permission.ENQUEUE: (Role.AGENT, Role.ADMIN),
    Permission.RESOLVE: (Role.OPERATOR, Role.ADMIN),
    Permission.MANAGE_KEYS: (Role.ADMIN,),
    Permission.PRUNE: (Role.ADMIN,),
    Permission.READ_CONTENT: (Role.OPERATOR, Role.ADMIN),
    Permission.APPROVE: (Role.OPERATOR, Role.ADMIN),
    Permission.CANCEL: (Role.AGENT, Role.OPERATOR, Role.ADMIN),
}

PREFIX = "evq_"
_KEY = re.compile(r"^evq_([0-9a-f]{12})_([A-Za-z0-9_-]{32,128})$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$")

HMAC_SCHEME = "hmac-sha256"
# The scheme of keys evq 0.1 made: about 16 MiB and tens of
# milliseconds per check, which is why it never runs on an event loop.
SCRYPT_SCHEME = "scrypt"
_N, _R, _P, _DKLEN = 2**14, 8, 1, 32


@dataclass(frozen=True, slots=True)
class Identity:
    """Who a verified key belongs to: ``name`` is the actor recorded in evidence, ``key_id`` the
    key's public id (never its secret), recorded with what it enqueues and compared by the rules
    about one's own sends (ops/app/approvals.py: an enqueuer never approves its send, an agent
    cancels only its own). Made only by :func:`identity_of`, so every interface has all three."""

    name: str
    role: Role
    key_id: str
    # Whether the key's sends wait for a person (worker/approval_policy.py), as its row says at this
    # call; carried to what it enqueues (worker/request.py's Actor). Made without a row: always.
    approval: KeyApproval = KeyApproval.ALWAYS

    def may(self, permission: Permission) -> bool:
        return self.role in ALLOWED[permission]

    def enqueued(self, decision: Mapping[str, Any] | None) -> bool:
        """Whether this key asked for the send behind ``decision`` (its ``actor_key_id``). A send
        of the Python API, which has no key, is nobody's."""
        return decision is not None and decision.get("actor_key_id") == self.key_id


def identity_of(key_id: str, row: Mapping[str, Any], *, context: Mapping[str, Any] | None = None) -> Identity:
    """The identity behind the stored key ``row`` (``KeyLookup.key_by_id(key_id)``, read for this
    call): the one way every interface (CLI, HTTP, MCP, the ops page's session) builds it, so
    the same key is the same identity everywhere. BadKey when the key was revoked.

    The caller has proved it holds the key first: :func:`authenticate` by its secret, the ops
    page by a session cookie signed at sign-in (ops/web/session.py), which carries the key id
    and not the role or the name, so a session acts as the key is now."""
    # A row without an approval (a store that does not keep one) fails closed: always.
    approval = KeyApproval(row.get("approval") or KeyApproval.ALWAYS)
    identity = Identity(name=row["name"], role=Role(row["role"]), key_id=key_id, approval=approval)
    if row["revoked_at"] is not None:
        raise BadKey(
            f"the API key {identity.name!r} was revoked",
            hint="ask an admin for a new key",
            context={**(context or {}), "name": identity.name},
        )
    return identity


def default_approval(role: Role) -> KeyApproval:
    """What a new key's sends get when its creator says nothing (`evq keys create` without
    --approval): an agent's always wait for a person (the agent harness rule: a send always
    waits for a person, no exceptions; an admin who wants otherwise says so, per key); an
    operator's or admin's follow the installation's policy, as every send did before."""
    return KeyApproval.ALWAYS if role is Role.AGENT else KeyApproval.POLICY


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


def hash_secret(secret: str, pepper: bytes) -> str:
    """``hmac-sha256$<hex>``: the secret's HMAC under the server's pepper (api_key_pepper)."""
    return f"{HMAC_SCHEME}${_mac(secret, pepper)}"


def _mac(secret: str, pepper: bytes) -> str:
    return hmac.new(pepper, secret.encode(), hashlib.sha256).hexdigest()


def scrypt_hash(secret: str, salt: bytes | None = None) -> str:
    """``scrypt$N$r$p$salt$hash``, as evq 0.1 stored keys (kept to check them)."""
    salt = salt if salt is not None else secrets.token_bytes(16)
    digest = hashlib.scrypt(secret.encode(), salt=salt, n=_N, r=_R, p=_P, dklen=_DKLEN)
    return f"{SCRYPT_SCHEME}${_N}${_R}${_P}${salt.hex()}${digest.hex()}"


def is_legacy(stored: str) -> bool:
    return stored.startswith(SCRYPT_SCHEME + "$")


def verify_secret(secret: str, stored: str, pepper: bytes) -> bool:
    """Whether ``secret`` matches ``stored``, compared in constant time. A legacy scrypt
    hash makes this slow: call it in a thread then (:func:`authenticate` does)."""
    scheme, _, rest = stored.partition("$")
    if scheme == HMAC_SCHEME:
        return hmac.compare_digest(_mac(secret, pepper), rest)
    if scheme != SCRYPT_SCHEME:
        return False
    try:
        n, r, p, salt, expected = rest.split("$")
        digest = hashlib.scrypt(
            secret.encode(), salt=bytes.fromhex(salt), n=int(n), r=int(r), p=int(p), dklen=len(expected) // 2
        )
    except ValueError:
        return False
    return hmac.compare_digest(digest.hex(), expected)


# Checked against when a key id is unknown (or the key is malformed), so an unknown id
# does exactly the work of a wrong secret for a known one: one HMAC-SHA256 of the
# presented secret under a 32-byte key, one constant-time comparison of 64 hex digits.
_DECOY_PEPPER = secrets.token_bytes(32)
_DECOY = hash_secret(secrets.token_urlsafe(32), _DECOY_PEPPER)


def split_key(text: str) -> tuple[str, str] | None:
    match = _KEY.match(text.strip())
    return (match[1], match[2]) if match else None


def check_name(name: str) -> str:
    if not _NAME.match(name):
        raise InvalidRequest(
            [{"field": "--name", "message": "1 to 64 of letters, digits and . _ @ -, starting with a letter or digit"}]
        )
    return name


# How a command-line user gives a key; other interfaces pass their own words.
CLI_KEY_SOURCE = "EVQ_API_KEY or --api-key"


async def authenticate(
    lookup: KeyLookup,
    presented: str | None,
    permission: Permission,
    *,
    source: str = CLI_KEY_SOURCE,
) -> Identity:
    """The identity behind ``presented`` if it may do ``permission``; AuthFailed otherwise
    (Forbidden, a subclass, when the key is good but its role may not).

    Every refusal is the same error code; the message says what to fix without
    ever repeating the key. ``source`` names where the caller puts a key.
    """
    parts = split_key(presented) if presented else None
    row = await lookup.key_by_id(parts[0]) if parts else None
    ok = None
    if parts and row is not None and is_legacy(row["secret_hash"]):
        # scrypt blocks for tens of milliseconds: never on the event loop.
        ok = await asyncio.to_thread(verify_secret, parts[1], row["secret_hash"], bytes(row["pepper"]))
        if ok:
            await _rehash(lookup, parts[0], parts[1], row)
    return check_key(presented, row, permission, source=source, ok=ok)


def check_key(
    presented: str | None,
    row: Mapping[str, Any] | None,
    permission: Permission,
    *,
    source: str = CLI_KEY_SOURCE,
    ok: bool | None = None,
) -> Identity:
    """:func:`authenticate`'s check once the key's row was read (``row``: ``KeyLookup.key_by_id``
    of the presented key's id, None when there is none), without I/O: the Python API reads the
    row on the caller's own connection and checks it here. ``ok``: the secret's check when the
    caller made it already (authenticate runs a legacy hash in a thread); made here otherwise (a
    legacy hash then costs its tens of milliseconds in the calling thread)."""
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
    secret = parts[1] if parts else presented
    if row is None or parts is None:
        verify_secret(secret, _DECOY, _DECOY_PEPPER)  # the same work as a wrong secret, then refused
        ok = False
    elif ok is None:
        ok = verify_secret(secret, row["secret_hash"], bytes(row["pepper"]))
    if not ok or row is None or parts is None:
        raise BadKey("the API key is not valid", hint=f"check the key in {source}", context=context)
    return authorize(identity_of(parts[0], row, context=context), permission)


async def _rehash(lookup: KeyLookup, key_id: str, secret: str, row: Mapping[str, Any]) -> None:
    """A legacy key just matched: store its HMAC, so later checks are fast. A database
    that refuses the write (read-only, say) costs only the speed-up: the key still works."""
    try:
        await lookup.rehash_key(key_id, old=row["secret_hash"], new=hash_secret(secret, bytes(row["pepper"])))
    except EvqError as exc:
        log.warning("key_rehash_failed", key_name=row["name"], error_class=type(exc).__name__)


def authorize(identity: Identity, permission: Permission) -> Identity:
    """``identity`` if its role may do ``permission``; Forbidden otherwise."""
    if not identity.may(permission):
        roles = [str(r) for r in ALLOWED[permission]]
        raise Forbidden(
            f"the API key {identity.name!r} has role {identity.role}; this command needs {' or '.join(roles)}",
            context={"permission": str(permission), "roles": roles, "name": identity.name, "role": str(identity.role)},
        )
    return identity
