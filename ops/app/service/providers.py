"""providers list: each provider's circuit, profile and rate limit as every interface shows them."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from evq.ops.app.labels import REASON_LABELS, STATE_LABELS, label
from evq.ops.app.service.common import Caller, Reply, page_meta
from evq.ops.option_catalogue import ADAPTERS
from evq.ops.settings import Settings
from evq.worker.keys import Permission
from evq.worker.ports import AppStore
from evq.worker.ports.providers import ProviderProfile
from evq.worker.ratelimit import RateLimit

# -- providers' circuits (worker/circuit.py) -----------------------------------------


def circuit_view(provider: str, row: Mapping[str, Any] | None) -> dict[str, Any]:
    """One provider's circuit as every interface shows it; no row means closed, never opened."""
    row = row or {}
    state = row.get("state") or "closed"
    held = state != "closed"
    reason = row.get("reason") if held else None
    return {
        "provider": provider,
        "state": state,
        "state_label": label(STATE_LABELS, state),
        "sending": not held,
        "reason": reason,
        "reason_label": label(REASON_LABELS, reason),
        "detail": row.get("detail") if held else None,
        "opened_at": row.get("opened_at"),
        # Durations in whole seconds: how long it has been open (down), how long until the next probe (up).
        "open_for_seconds": int(row["open_for"]) if held and row.get("open_for") is not None else None,
        "next_probe_at": row.get("probe_at"),
        "next_probe_in_seconds": math.ceil(max(0.0, row["probe_in"])) if row.get("probe_in") is not None else None,
        "failed_probes": row.get("probes", 0) if held else 0,
        "probe_owner": row.get("probe_owner"),
        "openings": row.get("openings", 0),
        "updated_at": row.get("updated_at"),
    }


def profile_view(profile: ProviderProfile | None) -> dict[str, Any] | None:
    """What a provider can do to settle a send whose answer was lost (docs/design.md,
    "Provider profiles"); None for a provider this evq has no adapter for."""
    if profile is None:
        return None
    window = profile.dedupe_window
    return {
        "dedupe_window_seconds": None if window is None else math.ceil(window),
        "lookup_by": list(profile.lookup_by),
        "webhook_events": list(profile.webhook_events),
        "resolvable": profile.resolvable,
    }


def rate_view(limit: RateLimit | None) -> dict[str, Any] | None:
    """The provider's shared rate limit (EVQ_RATE_LIMIT, worker/ratelimit.py); None: unlimited."""
    if limit is None:
        return None
    return {"per_second": limit.per_second, "burst": limit.burst, "setting": str(limit)}


async def list_providers(store: AppStore, caller: Caller, settings: Settings) -> Reply:
    """Every provider a step may name (and any other with a circuit row): its profile (what can
    settle a lost answer, from the settings: Settings.provider_profiles), its rate limit
    (EVQ_RATE_LIMIT), whether this process's EVQ_ADAPTER names it, and its circuit (whether
    evq sends to it now and, if not, why)."""
    await caller.identify(store, Permission.READ)
    rows = {r["provider"]: r for r in await store.circuits()}
    names = list(ADAPTERS) + sorted(set(rows) - set(ADAPTERS))
    profiles = settings.provider_profiles()
    limits = {limit.provider: limit for limit in settings.rate_limit}
    data = [
        {
            **circuit_view(name, rows.get(name)),
            "configured": name in settings.adapter,
            "profile": profile_view(profiles.get(name)),
            "rate_limit": rate_view(limits.get(name)),
        }
        for name in names
    ]
    meta = {
        # Every provider in one answer (a handful: the adapters and any a circuit row names), not paged.
        **page_meta(data, len(data), limit=None, offset=0),
        "held": sum(1 for d in data if not d["sending"]),
        "unresolvable": sum(1 for d in data if d["profile"] is not None and not d["profile"]["resolvable"]),
    }
    return Reply(data, meta)
