"""evq keys create | list | revoke

Bootstrap: while no active admin key exists, `evq keys create --role admin`
needs no key (whoever can reach the database could write the table anyway).
From then on, managing keys needs an admin key, and the last active admin key
cannot be revoked, so key management can neither lock itself out nor reopen.
"""

from __future__ import annotations

from typing import Any

from evq.ops import wiring
from evq.ops.cli.auth import Credential
from evq.ops.cli.common import command, load_settings, run
from evq.ops.cli.output import Output, table
from evq.ops.cli.table import from_table, table_group
from evq.worker.errors import AuthFailed, Conflict, InvalidRequest, NotFound
from evq.worker.keys import PREFIX, Role, check_name, generate
from evq.worker.request import notify_address

keys = table_group("keys")


@from_table("keys.create", keys)
@command
def keys_create(
    out: Output,
    name: str,
    role: str,
    notify_email: str | None,
    dry_run: bool,
    credential: Credential,
    database_url: str | None,
) -> None:
    check_name(name)
    settings = load_settings(database_url=database_url)
    if notify_email is not None:
        notify_email = notify_address(notify_email, settings.policy(), "--notify-email")

    async def work() -> dict[str, Any]:
        async with wiring.open_store(settings, max_size=1) as store:
            state = await store.key_state(name)
            bootstrap = not state["admin_exists"] and credential.key is None
            if dry_run:
                if state["name_taken"]:
                    raise Conflict(f"a key named {name!r} exists", context={"name": name})
                return {
                    "dry_run": True,
                    "name": name,
                    "role": role,
                    "bootstrap": bootstrap,
                    "notify_email": notify_email,
                }
            if bootstrap and role != Role.ADMIN:
                raise AuthFailed(
                    "no admin key exists yet: the first key must be an admin key",
                    hint="create the admin key first (`evq keys create --name NAME --role admin`), "
                    "then this one with EVQ_API_KEY set to it",
                )
            created_by = None if bootstrap else (await credential.identify(store)).name
            key = generate()
            row = await store.create_key(
                name=name, role=Role(role), key=key, created_by=created_by, notify_email=notify_email
            )
            return {"dry_run": False, **key_view(row), "key": key.text, "bootstrap": bootstrap}

    data = run(work())
    out.success(data, human=_human_created)


def key_view(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": row["name"],
        "role": row["role"],
        "key_prefix": PREFIX + row["key_id"],
        "active": row.get("revoked_at") is None,
        "created_at": row["created_at"],
        "created_by": row["created_by"],
        "revoked_at": row.get("revoked_at"),
        "revoked_by": row.get("revoked_by"),
        "notify_email": row.get("notify_email"),
    }


def _human_created(d: dict[str, Any]) -> str:
    if d["dry_run"]:
        how = " (bootstrap: no admin key exists yet, so none is needed)" if d["bootstrap"] else ""
        return f"dry run: would create key {d['name']!r} with role {d['role']}{how}; nothing was changed"
    return "\n".join(
        [
            f"created key {d['name']!r} (role {d['role']}). It is shown only now; keep it in a secret store:",
            "",
            f"    {d['key']}",
            "",
            "Use it with: export EVQ_API_KEY=<the key>",
        ]
    )


@from_table("keys.list", keys)
@command
def keys_list(out: Output, limit: int, offset: int, database_url: str | None) -> None:
    settings = load_settings(database_url=database_url)

    async def fetch() -> list[dict[str, Any]]:
        async with wiring.open_store(settings, max_size=1) as store:
            return await store.list_keys()

    every = [key_view(r) for r in run(fetch())]
    data = every[offset : offset + limit]
    out.success(
        data,
        human=lambda d: table(
            [{**k, "state": "active" if k["active"] else "revoked"} for k in d],
            [
                ("name", "name"),
                ("role", "role"),
                ("state", "state"),
                ("key_prefix", "key"),
                ("created_at", "created"),
                ("created_by", "by"),
                ("revoked_at", "revoked"),
            ],
        ),
        meta={"count": len(data), "total": len(every), "limit": limit, "offset": offset},
    )


@from_table("keys.update", keys)
@command
def keys_update(
    out: Output,
    name: str,
    notify_email: str | None,
    clear_notify_email: bool,
    dry_run: bool,
    credential: Credential,
    database_url: str | None,
) -> None:
    settings = load_settings(database_url=database_url)
    if (notify_email is None) == (not clear_notify_email):
        raise InvalidRequest(
            [{"field": "--notify-email", "message": "give --notify-email ADDR or --clear-notify-email (one of them)"}]
        )
    target = None if clear_notify_email else notify_address(notify_email, settings.policy(), "--notify-email")

    async def work() -> dict[str, Any]:
        async with wiring.open_store(settings, max_size=1) as store:
            if dry_run:
                row = next((k for k in await store.list_keys() if k["name"] == name), None)
                if row is None:
                    raise NotFound(f"no key named {name!r}", hint="`evq keys list` shows the names")
                return {
                    "dry_run": True,
                    **key_view(row),
                    "notify_email": target,
                    "changed": row["notify_email"] != target,
                }
            await credential.identify(store)
            before = next((k for k in await store.list_keys() if k["name"] == name), None)
            row = await store.set_key_notify(name, notify_email=target)
            changed = before is None or before["notify_email"] != target
            return {"dry_run": False, **key_view(row), "changed": changed}

    data = run(work())
    where = data["notify_email"] or "no address (the event feed only)"
    verb = "would tell" if data["dry_run"] else "tells"
    out.success(data, human=lambda d: f"key {d['name']!r} {verb} {where} of its failed sends")


@from_table("keys.revoke", keys)
@command
def keys_revoke(out: Output, name: str, dry_run: bool, credential: Credential, database_url: str | None) -> None:
    settings = load_settings(database_url=database_url)

    async def work() -> dict[str, Any]:
        async with wiring.open_store(settings, max_size=1) as store:
            actor = None if dry_run else (await credential.identify(store)).name
            row = await store.revoke_key(name, actor=actor, dry_run=dry_run)
            view = key_view(row)
            if dry_run:
                view.update(active=not row["already_revoked"], revoked_at=None, revoked_by=None)
            return {"dry_run": dry_run, **view, "changed": row["changed"]}

    data = run(work())

    def human(d: dict[str, Any]) -> str:
        if d["dry_run"]:
            return f"dry run: key {d['name']!r} would {'be revoked' if d['changed'] else 'stay as it is (already revoked)'}"
        return f"key {d['name']!r} " + ("revoked" if d["changed"] else f"was already revoked at {d['revoked_at']}")

    out.success(data, human=human)
