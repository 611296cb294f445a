"""API keys: looked up for every authenticated call, created, revoked, listed."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from evq.adapters.postgres.queries import Q
from evq.adapters.postgres.store.base import PostgresBase, fetch_all
from evq.worker.approval_policy import KeyApproval
from evq.worker.callbacks import secret_text, signing_secret
from evq.worker.errors import AuthFailed, Conflict, NotFound, StateConflict
from evq.worker.keys import NewKey, Role, default_approval, hash_secret


class PostgresKeys(PostgresBase):
    """API keys (worker/keys.py)."""

    async def key_by_id(self, key_id: str) -> dict[str, Any] | None:
        """The key with this id and the server's pepper (worker.keys.KeyLookup); None: no such key."""
        rows = await self._fetch("key_by_id", Q["api_key_by_id"], {"key_id": key_id})
        return rows[0] if rows and rows[0]["name"] is not None else None

    async def server_pepper(self) -> bytes:
        """The server's pepper (table ``api_key_pepper``), for a secret derived from it at
        start: the SMTP journal's witness tags (adapters/smtp/witness.py). Never logged."""
        [row] = await self._fetch("server_pepper", Q["api_key_pepper"], {})
        return bytes(row["pepper"])

    async def wire_keys_from(self) -> int:
        """The first step id whose HTTP idempotency key is keyed by the pepper
        (adapters/http/provider.py::WireKeys); the steps before keep the key they were sent under."""
        [row] = await self._fetch("wire_keys_from", Q["wire_keys_from"], {})
        return int(row["wire_keys_from"])

    async def rehash_key(self, key_id: str, *, old: str, new: str) -> None:
        await self._fetch("rehash_key", Q["api_key_rehash"], {"key_id": key_id, "old": old, "new": new})

    async def end_sessions(self, key_id: str, generation: int) -> None:
        """Sign-out of the ops page: sessions of this key made under ``generation`` end."""
        await self._fetch("end_sessions", Q["api_key_end_sessions"], {"key_id": key_id, "generation": generation})

    async def key_state(self, name: str) -> dict[str, Any]:
        return (await self._fetch("key_state", Q["api_key_state"], {"name": name}))[0]

    async def create_key(
        self,
        *,
        name: str,
        role: Role,
        key: NewKey,
        created_by: str | None,
        notify_email: str | None = None,
        notify_url: str | None = None,
        approval: KeyApproval | None = None,
        now: datetime | None = None,
    ) -> dict[str, Any]:
        """Store a new key (hashed). ``created_by=None`` is the bootstrap: allowed
        only while no active admin key exists. ``notify_email``: the key's default
        notification target (told of a failure when a request names no notify).
        ``approval``: whether its sends wait for a person; None: its role's default
        (worker/keys.py, default_approval: an agent's always)."""
        params = {
            "now": now,
            "notify_email": notify_email,
            "notify_url": notify_url,
            "approval": str(approval or default_approval(role)),
            "name": name,
            "role": str(role),
            "key_id": key.key_id,
            "created_by": created_by,
            "bootstrap": created_by is None,
        }
        async with self._op("create_key") as conn, conn.transaction():
            await conn.execute(Q["api_key_lock"])
            [pepper] = await fetch_all(conn, Q["api_key_pepper"], {})
            params["secret_hash"] = hash_secret(key.secret, bytes(pepper["pepper"]))
            row = (await fetch_all(conn, Q["api_key_create"], params))[0]
        if not row["allowed"]:
            raise AuthFailed(
                "an admin key exists now: creating a key needs one",
                hint="set EVQ_API_KEY or pass --api-key (role admin)",
            )
        if row["name"] is None:
            raise Conflict(
                f"a key named {name!r} exists (names are never reused, even after a revoke)",
                hint="choose another name; `evq keys list` shows the names",
                context={"name": name},
            )
        out = {k: v for k, v in row.items() if k != "allowed"}
        if notify_url is not None:
            # Shown this once; derived from the pepper, so never stored (worker/callbacks.py).
            out["callback_secret"] = secret_text(signing_secret(bytes(pepper["pepper"]), key.key_id, 0))
        return out

    async def revoke_key(
        self, name: str, *, actor: str | None, dry_run: bool = False, now: datetime | None = None
    ) -> dict[str, Any]:
        """Revoke the key called ``name``; with ``dry_run`` the same statement runs and is rolled back."""
        async with self._op("revoke_key") as conn:
            async with conn.transaction(force_rollback=dry_run):
                await conn.execute(Q["api_key_lock"])
                rows = await fetch_all(conn, Q["api_key_revoke"], {"now": now, "name": name, "actor": actor})
        if not rows:
            raise NotFound(f"no key named {name!r}", hint="`evq keys list` shows the names")
        row = rows[0]
        if not row["changed"] and not row["already_revoked"]:
            raise StateConflict(
                f"{name!r} is the last active admin key: revoking it would leave nobody able to manage keys",
                hint="create another admin key first (`evq keys create --name NAME --role admin`)",
                context={"name": name},
            )
        return row

    async def set_key_notify(self, name: str, *, notify_email: str | None) -> dict[str, Any]:
        """Change the key's default notification target (None: none)."""
        rows = await self._fetch(
            "set_key_notify", Q["api_key_set_notify"], {"name": name, "notify_email": notify_email}
        )
        if not rows:
            raise NotFound(f"no key named {name!r}", hint="`evq keys list` shows the names")
        return rows[0]

    async def set_key_approval(self, name: str, *, approval: KeyApproval) -> dict[str, Any]:
        """Change whether the key's sends wait for a person, from its next enqueue on."""
        rows = await self._fetch(
            "set_key_approval", Q["api_key_set_approval"], {"name": name, "approval": str(approval)}
        )
        if not rows:
            raise NotFound(f"no key named {name!r}", hint="`evq keys list` shows the names")
        return rows[0]

    async def list_keys(self) -> list[dict[str, Any]]:
        return await self._fetch("list_keys", Q["api_key_list"], {})

    async def key_events(
        self,
        *,
        since: int,
        limit: int,
        offset: int = 0,
        key_id: str | None = None,
        key_name: str | None = None,
        every: bool = False,
    ) -> tuple[list[dict[str, Any]], int]:
        """A page of a key's event feed after the cursor ``since``, and its total (worker/ports/events.py)."""
        params = {"since": since, "limit": limit, "offset": offset, "key_id": key_id, "key_name": key_name}
        if every:
            return await self._page("key_events", Q["key_events_all"], Q["key_events_count_all"], params)
        return await self._page("key_events", Q["key_events_of_key"], Q["key_events_count_of_key"], params)

    async def set_key_url(self, name: str, *, notify_url: str | None, rotate: bool) -> dict[str, Any]:
        """Change the key's callback URL (None: none); ``rotate``: a new signing secret."""
        rows = await self._fetch(
            "set_key_url", Q["api_key_set_url"], {"name": name, "notify_url": notify_url, "rotate": rotate}
        )
        if not rows:
            raise NotFound(f"no key named {name!r}", hint="`evq keys list` shows the names")
        row = rows[0]
        pepper = bytes(row.pop("pepper"))
        generation = row.pop("callback_generation")
        row["callback_secret"] = (
            secret_text(signing_secret(pepper, row["key_id"], generation)) if row["notify_url"] else None
        )
        return row

    # -- callback deliveries (worker/callbacks.py) ---------------------------------

    async def callback_claim(
        self, *, limit: int, hold_seconds: float, now: datetime | None = None
    ) -> list[dict[str, Any]]:
        return await self._fetch(
            "callback_claim", Q["callback_claim"], {"limit": limit, "hold_seconds": hold_seconds, "now": now}
        )

    async def callback_delivered(self, delivery_id: int, *, status_code: int, now: datetime | None = None) -> None:
        await self._fetch(
            "callback_delivered", Q["callback_delivered"], {"id": delivery_id, "status_code": status_code, "now": now}
        )

    async def callback_failed(
        self,
        delivery_id: int,
        *,
        error: str,
        status_code: int | None,
        delay: float,
        give_up: bool,
        now: datetime | None = None,
    ) -> None:
        await self._fetch(
            "callback_failed",
            Q["callback_failed"],
            {
                "id": delivery_id,
                "error": error,
                "status_code": status_code,
                "delay": delay,
                "give_up": give_up,
                "now": now,
            },
        )
