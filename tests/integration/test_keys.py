"""API keys in the real database: bootstrap, lookup, roles, revocation."""

from __future__ import annotations

import asyncio

import pytest

from evq.worker.errors import AuthFailed, Conflict, NotFound, StateConflict
from evq.worker.keys import Permission, Role, authenticate, generate, split_key
from tests.support import rows


async def make(store, name: str, role: Role, by: str | None = "root") -> str:
    key = generate()
    await store.create_key(name=name, role=role, key=key, created_by=by)
    return key.text


async def test_bootstrap_only_while_no_admin_key_exists(store, db_url):
    root = await make(store, "root", Role.ADMIN, by=None)
    with pytest.raises(AuthFailed, match="an admin key exists"):
        await make(store, "sneaky", Role.ADMIN, by=None)
    assert await authenticate(store, root, Permission.MANAGE_KEYS) == await authenticate(
        store, root, Permission.RESOLVE
    )
    stored = rows(db_url, "SELECT * FROM api_keys")
    assert len(stored) == 1 and stored[0]["created_by"] is None
    # Only the hash is stored: neither the key nor its secret appears anywhere in the row.
    assert root not in str(stored) and split_key(root)[1] not in str(stored)


async def test_two_bootstraps_at_once_make_one_admin(store):
    results = await asyncio.gather(
        *(make(store, f"root-{i}", Role.ADMIN, by=None) for i in range(4)), return_exceptions=True
    )
    assert sum(isinstance(r, str) for r in results) == 1
    assert all(isinstance(r, AuthFailed) for r in results if not isinstance(r, str))


async def test_roles_decide_what_a_key_may_do(store):
    await make(store, "root", Role.ADMIN, by=None)
    agent, operator = await make(store, "bot", Role.AGENT), await make(store, "alice", Role.OPERATOR)
    assert (await authenticate(store, agent, Permission.ENQUEUE)).name == "bot"
    assert (await authenticate(store, operator, Permission.RESOLVE)).name == "alice"
    for key, permission in (
        (agent, Permission.RESOLVE),
        (operator, Permission.ENQUEUE),
        (operator, Permission.MANAGE_KEYS),
    ):
        with pytest.raises(AuthFailed, match="has role") as err:
            await authenticate(store, key, permission)
        assert key not in err.value.message and key not in str(err.value.context)


@pytest.mark.parametrize("presented", [None, "", "not-a-key", "evq_000000000000_" + "x" * 43])
async def test_missing_malformed_and_unknown_keys_are_refused(store, presented):
    await make(store, "root", Role.ADMIN, by=None)
    with pytest.raises(AuthFailed):
        await authenticate(store, presented, Permission.ENQUEUE)


async def test_a_wrong_secret_for_a_real_key_id_is_refused(store):
    key = await make(store, "root", Role.ADMIN, by=None)
    with pytest.raises(AuthFailed, match="not valid"):
        await authenticate(store, key[:-4] + "AAAA", Permission.ENQUEUE)


async def test_revoke_takes_effect_at_once_and_keeps_the_last_admin(store):
    root = await make(store, "root", Role.ADMIN, by=None)
    alice = await make(store, "alice", Role.OPERATOR)
    planned = await store.revoke_key("alice", actor="root", dry_run=True)
    assert planned["changed"] is True
    assert (await authenticate(store, alice, Permission.RESOLVE)).name == "alice"  # the dry run changed nothing
    done = await store.revoke_key("alice", actor="root")
    assert done["changed"] and done["revoked_by"] == "root"
    with pytest.raises(AuthFailed, match="revoked"):
        await authenticate(store, alice, Permission.RESOLVE)
    again = await store.revoke_key("alice", actor="root")
    assert again["changed"] is False and again["already_revoked"] is True
    with pytest.raises(StateConflict, match="last active admin"):
        await store.revoke_key("root", actor="root")
    await make(store, "root-2", Role.ADMIN)
    assert (await store.revoke_key("root", actor="root-2"))["changed"]
    with pytest.raises(AuthFailed):
        await authenticate(store, root, Permission.MANAGE_KEYS)
    with pytest.raises(NotFound):
        await store.revoke_key("nobody", actor="root-2")
    with pytest.raises(Conflict, match="never reused"):
        await make(store, "alice", Role.OPERATOR, by="root-2")
    assert [k["name"] for k in await store.list_keys()] == ["root", "alice", "root-2"]
