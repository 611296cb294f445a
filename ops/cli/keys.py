"""evq keys create | list | update | revoke

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
from evq.worker.addresses import notify_address
from evq.worker.approval_policy import KeyApproval
from evq.worker.callbacks import check_url
from evq.worker.errors import AuthFailed, Conflict, InvalidRequest, NotFound
from evq.worker.keys import PREFIX, Role, check_name, default_approval, generate
from evq.worker.logs import register_secrets

keys = table_group("keys")


@from_table("keys.create", keys)
@command
def keys_create(
    out: Output,
    name: str,
    role: str,
    approval: str | None,
    notify_email: str | None,
    notify_url: str | None,
    dry_run: bool,
    credential: Credential,
    database_url: str | None,
) -> None:
    check_name(name)
    # Not given: the role's default (an agent's sends wait for a person), said in the answer.
    chosen = KeyApproval(approval) if approval is not None else default_approval(Role(role))
    settings = load_settings(database_url=database_url)
    if notify_email is not None:
        notify_email = notify_address(notify_email, settings.policy(), "--notify-email")
    if notify_url is not None:
        notify_url = check_url(notify_url)

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
                    "approval": str(chosen),
                    "bootstrap": bootstrap,
                    "notify_email": notify_email,
                    "notify_url": notify_url,
                    "failures": failures_view(notify_email, notify_url),
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
                name=name,
                role=Role(role),
                key=key,
                created_by=created_by,
                notify_email=notify_email,
                notify_url=notify_url,
                approval=chosen,
            )
            register_secrets([row.get("callback_secret")])
            return {
                "dry_run": False,
                **key_view(row),
                "key": key.text,
                "bootstrap": bootstrap,
                "callback_secret": row.get("callback_secret"),
                "failures": failures_view(row.get("notify_email"), row.get("notify_url")),
            }

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
        "notify_url": row.get("notify_url"),
        "approval": row["approval"],
    }


# What each approval means, in the words `evq keys create|update` print.
APPROVAL_WORDS = {
    KeyApproval.ALWAYS: "every send it enqueues waits for a person (an operator or admin approves it)",
    KeyApproval.POLICY: "its sends follow the installation's approval policy (`evq policy show`)",
    KeyApproval.NEVER: "its sends go out without a person (the budgets still cap them)",
}


def failures_view(notify_email: str | None, notify_url: str | None) -> dict[str, Any]:
    """Where the failures of the key's sends go (docs/design.md, "Failure notices"): always its
    event feed; and its default address and callback URL when it has them. ``feed_only`` says
    plainly when the feed is all there is, so whoever made the key knows to poll it."""
    feed_only = notify_email is None and notify_url is None
    places = ["its event feed (`evq events list` with the key)"]
    places += [f"a notice to {notify_email}"] if notify_email else []
    places += [f"a signed callback to {notify_url}"] if notify_url else []
    note = (
        "failures of this key's sends will only be in its event feed (`evq events list` with the key): "
        "no --notify-email or --notify-url was given (`evq keys update` adds one)"
        if feed_only
        else "failures of this key's sends reach " + ", ".join(places)
    )
    return {"feed": True, "notify_email": notify_email, "notify_url": notify_url, "feed_only": feed_only, "note": note}


def _human_created(d: dict[str, Any]) -> str:
    told = [
        f"Approval: {d['approval']}: {APPROVAL_WORDS[KeyApproval(d['approval'])]}.",
        f"Failures: {d['failures']['note']}.",
    ]
    if d["dry_run"]:
        how = " (bootstrap: no admin key exists yet, so none is needed)" if d["bootstrap"] else ""
        return "\n".join(
            [f"dry run: would create key {d['name']!r} with role {d['role']}{how}; nothing was changed", *told]
        )
    return "\n".join(
        [
            f"created key {d['name']!r} (role {d['role']}). It is shown only now; keep it in a secret store:",
            "",
            f"    {d['key']}",
            "",
            "Use it with: export EVQ_API_KEY=<the key>",
            "",
            *told,
            *(
                [
                    "",
                    "Callbacks to its URL are signed with (shown only now; give it to the receiver):",
                    "",
                    f"    {d['callback_secret']}",
                ]
                if d.get("callback_secret")
                else []
            ),
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
                ("approval", "approval"),
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
    notify_url: str | None,
    clear_notify_url: bool,
    rotate_callback_secret: bool,
    approval: str | None,
    dry_run: bool,
    credential: Credential,
    database_url: str | None,
) -> None:
    settings = load_settings(database_url=database_url)
    for given, clear, flag in ((notify_email, clear_notify_email, "email"), (notify_url, clear_notify_url, "url")):
        if given is not None and clear:
            raise InvalidRequest(
                [{"field": f"--notify-{flag}", "message": f"give --notify-{flag} or --clear-notify-{flag}, not both"}]
            )
    email_change = notify_email is not None or clear_notify_email
    url_change = notify_url is not None or clear_notify_url or rotate_callback_secret
    if not email_change and not url_change and approval is None:
        raise InvalidRequest(
            [
                {
                    "field": "--notify-email",
                    "message": "nothing to change: give --notify-email/--clear-notify-email, "
                    "--notify-url/--clear-notify-url, --rotate-callback-secret or --approval",
                }
            ]
        )
    email = None if notify_email is None else notify_address(notify_email, settings.policy(), "--notify-email")
    url = None if notify_url is None else check_url(notify_url)

    async def work() -> dict[str, Any]:
        async with wiring.open_store(settings, max_size=1) as store:
            # The key first: without a valid one nobody learns which names exist.
            if not dry_run:
                await credential.identify(store)
            before = next((k for k in await store.list_keys() if k["name"] == name), None)
            if before is None:
                raise NotFound(f"no key named {name!r}", hint="`evq keys list` shows the names")
            after = {
                "notify_email": email if email_change else before["notify_email"],
                "notify_url": url if (notify_url is not None or clear_notify_url) else before["notify_url"],
                "approval": approval or before["approval"],
            }
            changed = any(after[k] != before[k] for k in after) or rotate_callback_secret
            if dry_run:
                return {"dry_run": True, **key_view({**before, **after}), "changed": changed, "callback_secret": None}
            row = before
            if after["approval"] != before["approval"]:
                row = await store.set_key_approval(name, approval=KeyApproval(after["approval"]))
            if email_change:
                row = await store.set_key_notify(name, notify_email=after["notify_email"])
            secret = None
            if url_change:
                # A new receiver gets a new secret: the old receiver's must not verify the new one's
                # callbacks, and a secret is printed only when it is new (never read back).
                moved = after["notify_url"] is not None and after["notify_url"] != before["notify_url"]
                rotate = rotate_callback_secret or moved
                row = await store.set_key_url(name, notify_url=after["notify_url"], rotate=rotate)
                new_secret = row.pop("callback_secret", None)
                secret = new_secret if rotate and after["notify_url"] is not None else None
                register_secrets([new_secret])
            return {"dry_run": False, **key_view(row), "changed": changed, "callback_secret": secret}

    data = run(work())

    def human(d: dict[str, Any]) -> str:
        verb = "would tell" if d["dry_run"] else "tells"
        lines = [
            f"key {d['name']!r} {verb} {d['notify_email'] or 'no address'} by email"
            f" and {d['notify_url'] or 'no URL'} by callback of its failed sends (and its event feed)",
            f"approval: {d['approval']}: {APPROVAL_WORDS[KeyApproval(d['approval'])]}",
        ]
        if d.get("callback_secret"):
            lines += ["", "Callbacks are signed with (shown only now):", "", f"    {d['callback_secret']}"]
        return "\n".join(lines)

    out.success(data, human=human)


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
