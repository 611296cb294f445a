"""The per-key feeds: refused enqueues (refusals list), each key's event feed (events list) and
the providers' delivery events (deliveries list, and the webhooks' receive_deliveries)."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from evq.ops.app.labels import with_labels
from evq.ops.app.service.common import Caller, Reply, page_meta
from evq.worker import metrics
from evq.worker.delivery import DELIVERY_TYPES, DeliveryEvent
from evq.worker.errors import (
    AuthFailed,
    Forbidden,
    InvalidRequest,
    NotFound,
)
from evq.worker.keys import Identity, Permission, Role
from evq.worker.logs import get_logger
from evq.worker.ports import AppStore
from evq.worker.refusals import INTERFACES

log = get_logger("evq.service")


# -- refused enqueues (worker/refusals.py) -------------------------------------------

REFUSAL_FIELDS = (
    "id",
    "created_at",
    "interface",
    "key_name",
    "dry_run",
    "requests",
    "request_bytes",
    "request_sha256",
    "error_count",
    "reasons",
    "errors",
    "asked",
)


# Who may read another key's feed (or every key's): those who act on other agents' sends.
_FEED_READERS = (Role.OPERATOR, Role.ADMIN)


def _only_its_own(who: Identity, what: str, *, hint: str) -> Forbidden:
    """The refusal of a key that may read only its own ``what`` asking for another key's."""
    return Forbidden(
        f"the API key {who.name!r} has role {who.role}: it reads only its own {what}",
        hint=hint,
        context={"name": who.name, "role": str(who.role), "roles": [str(r) for r in _FEED_READERS]},
    )


async def list_refusals(
    store: AppStore,
    caller: Caller,
    *,
    key_name: str | None = None,
    interface: str | None = None,
    before_id: int | None = None,
    limit: int = 50,
    offset: int = 0,
) -> Reply:
    """Refused enqueues, newest first: what was asked (identifiers only), by which key, every failing field;
    ``offset`` of them skipped (meta.total counts every one the filters match)."""
    if interface is not None and interface not in INTERFACES:
        raise InvalidRequest(
            [{"field": "--interface", "message": f"one of {', '.join(INTERFACES)}, got {interface[:40]!r}"}]
        )
    who = await caller.identify(store, Permission.READ)
    if who is not None and who.role not in _FEED_READERS:
        # An agent sees what it tried itself; every agent's refusals are an operator's view.
        if key_name is not None and key_name != who.name:
            raise _only_its_own(who, "refusals", hint="leave out --key to read this key's refusals")
        key_name = who.name
    rows, total = await store.list_refusals(
        key_name=key_name, interface=interface, before_id=before_id, limit=limit, offset=offset
    )
    data = [{k: r[k] for k in REFUSAL_FIELDS} for r in rows]
    meta = page_meta(data, total, limit=limit, offset=offset)
    if len(data) == limit and data[-1]["id"] > 1:  # maybe more: the next page starts below this one
        meta["next_before_id"] = data[-1]["id"] - 1
    return Reply(data, meta)


# -- each key's event feed ------------------------------------------------------

EVENTS_LIMIT_MAX = 1000
EVENT_FIELDS = (
    "id",
    "kind",
    "step",
    "run_id",
    "step_id",
    "status",
    "reason",
    "detail",
    "actor",
    "evidence_id",
    "key_id",
    "key_name",
    "created_at",
)


async def list_events(
    store: AppStore,
    caller: Caller,
    *,
    since: int = 0,
    limit: int = 100,
    offset: int = 0,
    key: str | None = None,
    all_keys: bool = False,
) -> Reply:
    """The caller's key's events after cursor ``since`` (every rejection, unknown and operator
    verdict on a step it enqueued), oldest first; ``meta.next_cursor`` is the ``since`` of the
    next call; ``offset`` of them skipped (meta.total counts every one after the cursor). ``key``
    (a key's name) or ``all_keys``: another key's feed, or every key's, for an operator or admin
    key (or the command line without a key, which reads every row anyway)."""
    holder = await caller.key_holder(store)
    if key is not None and all_keys:
        raise InvalidRequest([{"field": "--key", "message": "give --key NAME or --all-keys, not both"}])
    others = key is not None or all_keys
    if others and holder is not None and holder.role not in _FEED_READERS:
        raise _only_its_own(holder, "events", hint="leave out --key and --all-keys to read this key's feed")
    if not others and holder is None:
        # A feed is per key: no key is a missing credential, as for every command that needs one.
        raise AuthFailed(
            "no API key: a feed is per key",
            hint="give the key whose events to read (--api-key or EVQ_API_KEY), or --key NAME / --all-keys",
        )
    if holder is not None and key is None and not all_keys:
        rows, total = await store.key_events(
            since=since, limit=limit, offset=offset, key_id=holder.key_id, key_name=holder.name
        )
    else:
        rows, total = await store.key_events(since=since, limit=limit, offset=offset, key_name=key, every=all_keys)
    data = [with_labels({k: r.get(k) for k in EVENT_FIELDS}) for r in rows]
    cursor = data[-1]["id"] if data else since
    return Reply(data, {**page_meta(data, total, limit=limit, offset=offset), "since": since, "next_cursor": cursor})


# -- delivery events (worker/delivery.py) ---------------------------------------------

DELIVERIES_SHOWN = 100  # a step's delivery events `steps show` lists (newest first)
DELIVERY_FIELDS = (
    "id",
    "provider",
    "event_id",
    "type",
    "occurred_at",
    "received_at",
    "step",
    "run_id",
    "step_id",
    "key_digest",
    "message_id",
    "provider_message_id",
    "recipient",
    "detail",
)


def delivery_view(state: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A step's latest delivery state as every view shows it: {state, at, events}; None: no event."""
    if state is None:
        return None
    return {"state": state["state"], "at": state["at"], "events": int(state["events"])}


def public_deliveries(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [{k: r.get(k) for k in DELIVERY_FIELDS} for r in rows]


def delivery_actor(provider: str) -> str:
    """Who the evidence of a webhook's event names: the provider's webhook, not a person or key."""
    return f"webhook:{provider}"


async def receive_deliveries(
    store: AppStore, provider: str, events: Sequence[DeliveryEvent], step_providers: Collection[str]
) -> Reply:
    """Verified events from ``provider``'s webhook (its signature checked by the caller, the
    HTTP route): each stored, matched and acted on in a transaction of its own
    (DeliveryStore.delivery_record), so a provider that retries a whole batch after a
    failure part way finds the stored ones duplicates. ``step_providers``: the step providers
    whose messages this webhook can report on (Settings.webhook_step_providers); an event
    naming another's step is kept unmatched. Data: one entry per event, in order."""
    wrong = [i for i, e in enumerate(events) if e.provider != provider]
    if wrong:
        raise InvalidRequest(
            [{"field": f"events[{i}].provider", "message": f"not {provider!r}"} for i in wrong[:50]],
            hint="an event is stored under the provider whose webhook verified it",
        )
    actor = delivery_actor(provider)
    metrics.init_delivery(provider, DELIVERY_TYPES)  # every series at 0: the rates exist before the first event
    data: list[dict[str, Any]] = []
    for event in events:
        done = await store.delivery_record(event, actor=actor, step_providers=step_providers)
        log.info(
            "delivery_event",
            provider=provider,
            type=event.type,
            delivery=done.id,
            step=done.step,
            duplicate=done.duplicate,
            closed=done.closed,
        )
        data.append(
            {
                "event_id": event.event_id,
                "type": event.type,
                "matched": done.step is not None,
                "step": done.step,
                "duplicate": done.duplicate,
                "closed": done.closed,
            }
        )
    meta = {
        "count": len(data),
        "duplicates": sum(1 for d in data if d["duplicate"]),
        "unmatched": sum(1 for d in data if not d["matched"]),
        "closed": sum(1 for d in data if d["closed"]),
    }
    return Reply(data, meta)


async def _enqueued_by(store: AppStore, step_id: int, who: Identity) -> bool:
    try:
        detail = await store.get_step(step_id)
    except NotFound:
        return False
    return who.enqueued(detail.decision)


async def list_deliveries(
    store: AppStore,
    caller: Caller,
    *,
    unmatched: bool = False,
    step: int | None = None,
    provider: str | None = None,
    since: int | None = None,
    limit: int = 50,
    offset: int = 0,
) -> Reply:
    """Delivery events newest first: of one step, of one provider, or those that matched no step.
    ``since``: the next page, events older than this cursor (the last page's meta.next_cursor);
    ``offset`` of them skipped (meta.total counts every one that matches)."""
    if unmatched and step is not None:
        raise InvalidRequest([{"field": "--step", "message": "give --step ID or --unmatched, not both"}])
    who = await caller.identify(store, Permission.READ)
    if who is not None and who.role not in _FEED_READERS:
        # An agent reads the events of the sends it enqueued itself; every agent's (and the
        # unmatched ones, of nobody's) are an operator's view, as refusals are.
        mine = step is not None and not unmatched and await _enqueued_by(store, step, who)
        if not mine:
            raise _only_its_own(who, "steps' delivery events", hint="give --step ID of a step this key enqueued")
    rows, total = await store.delivery_events(
        step=step, unmatched=unmatched, provider=provider, before_id=since or None, limit=limit, offset=offset
    )
    data = public_deliveries(rows)
    meta = page_meta(data, total, limit=limit, offset=offset)
    if len(data) == limit and data[-1]["id"] > 1:  # maybe more: the next page is older than this one
        meta["next_cursor"] = data[-1]["id"]
    return Reply(data, meta)
