"""policy show: the approval policy (worker/approval_policy.py) and its budgets' use."""

from __future__ import annotations

from typing import Any

from evq.ops.app.service.common import Caller, Reply
from evq.ops.settings import Settings
from evq.worker.keys import ALLOWED, Identity, Permission, Role
from evq.worker.ports import AppStore

# -- the approval policy (worker/approval_policy.py) ----------------------------------

POLICY_USAGE_LIMIT = 20


async def show_policy(store: AppStore, caller: Caller, settings: Settings) -> Reply:
    """The approval policy (ApprovalPolicy.describe()) and the budget counters of the current
    windows, most used first (at most POLICY_USAGE_LIMIT: meta.usage_shown says how many)."""
    who = await caller.identify(store, Permission.READ)
    policy = settings.approval_policy()
    caps = {b.value: cap for b, cap in policy.budgets}
    usage = [
        {
            "budget": r["budget"],
            "scope": r["scope"],
            "window_start": r["window_start"],
            "used": r["used"],
            "cap": caps.get(r["budget"]),
        }
        for r in await store.budget_usage(limit=POLICY_USAGE_LIMIT)
    ]
    data = {**policy.describe(), "active": policy.active, "keys": await key_approvals(store, who), "usage": usage}
    return Reply(data, {"usage_shown": len(usage), "usage_limit": POLICY_USAGE_LIMIT})


async def key_approvals(store: AppStore, who: Identity | None) -> list[dict[str, Any]]:
    """Whose sends wait for a person: each active key that may enqueue, with its approval
    (always, policy: the rules above, never), oldest first. An agent key sees its own only
    (other keys' names are not its business); an operator, an admin and the command line see all."""
    may_enqueue = ALLOWED[Permission.ENQUEUE]
    keys = [k for k in await store.list_keys() if k["revoked_at"] is None and Role(k["role"]) in may_enqueue]
    if who is not None and who.role is Role.AGENT:
        keys = [k for k in keys if k["key_id"] == who.key_id]
    return [{"name": k["name"], "role": k["role"], "approval": k["approval"]} for k in keys]
