"""One run's whole chain as a list of events in time order: for each step, the
agent's decision, the action it enqueued, every attempt with the adapter's
answer, and every operator close (all from rows; pure, so tested without I/O).

Times are the database's clock (``created_at``): agents' clocks may disagree with
each other; the agent's own ``decided_at`` is kept in the decision's detail.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

DECISION_FIELDS = ("intent", "instruction_version", "prompt_version", "model", "tool", "rationale", "decided_at")
# Who asked (the API key's name and public id, and the interface): on the decision and
# the enqueued action, so an audit of a run names the agent behind every send.
ACTOR_FIELDS = ("actor", "actor_key_id", "interface")
ACTION_FIELDS = ("idempotency_key", "message_id", "provider", "max_attempts", "notify")


def run_events(
    steps: Sequence[Mapping[str, Any]],
    decisions: Sequence[Mapping[str, Any]],
    evidence: Sequence[Mapping[str, Any]],
) -> list[dict[str, Any]]:
    by_id = {s["id"]: s for s in steps}
    by_decision = {s["decision_id"]: s for s in steps}
    asked = {d["id"]: {k: d.get(k) for k in ACTOR_FIELDS} for d in decisions}
    events: list[tuple[Any, int, int, dict[str, Any]]] = []
    for d in decisions:
        step = by_decision.get(d["id"])
        if step is not None:
            events.append(
                (
                    d["created_at"],
                    0,
                    d["id"],
                    _event(
                        d["created_at"],
                        "decision",
                        step,
                        actor=d.get("actor"),
                        detail={k: d.get(k) for k in (*DECISION_FIELDS, *ACTOR_FIELDS)},
                    ),
                )
            )
    for s in steps:
        payload = s["payload"]
        action = {k: s.get(k) for k in ACTION_FIELDS}
        action.update(
            {k: [a["email"] for a in payload.get(k, [])] for k in ("to", "cc", "bcc")},
            subject=payload.get("subject"),
        )
        who = asked.get(s["decision_id"], dict.fromkeys(ACTOR_FIELDS))
        action.update(actor_key_id=who["actor_key_id"], interface=who["interface"])
        enqueued = _event(s["created_at"], "enqueued", s, actor=who["actor"], to_status="pending", detail=action)
        events.append((s["created_at"], 1, s["id"], enqueued))
    for e in evidence:
        step = by_id.get(e["step_id"])
        if step is not None:
            events.append(
                (
                    e["created_at"],
                    2,
                    e["id"],
                    _event(
                        e["created_at"],
                        e["kind"],
                        step,
                        evidence_id=e["id"],
                        **{
                            k: e.get(k)
                            for k in (
                                "attempt",
                                "actor",
                                "from_status",
                                "to_status",
                                "outcome",
                                "reason",
                                "provider_message_id",
                                "latency_ms",
                            )
                        },
                        detail=e.get("detail") or {},
                    ),
                )
            )
    # Same-instant events keep their causal order: decision, then action, then evidence.
    events.sort(key=lambda item: item[:3])
    return [event for *_, event in events]


def _event(at: Any, kind: str, step: Mapping[str, Any], **fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "at": at,
        "kind": kind,
        "step": step["id"],
        "step_id": step["step_id"],
        "evidence_id": None,
        "attempt": None,
        "actor": None,
        "from_status": None,
        "to_status": None,
        "outcome": None,
        "reason": None,
        "provider_message_id": None,
        "latency_ms": None,
        "detail": {},
    }
    return {**base, **fields}
