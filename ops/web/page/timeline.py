"""A run's trace as the page reads it: worker/timeline.py's events (already in time order, the
decision first) each with a label for what happened, who did it, the state change, and how long
it took: an attempt from its start to the adapter's answer, and every event's gap since the one
before. Pure, so the test of the markup and this can trust the same numbers."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from evq.ops.app.age import age
from evq.worker.timeline import run_events

# What each evidence kind (and the timeline's own "decision" and "enqueued") means, for a person.
# A kind a newer evq writes and this does not know is shown as itself.
EVENT_LABELS: dict[str, str] = {
    "decision": "The agent decided",
    "enqueued": "Send enqueued",
    "held": "Held for a person's approval",
    "approved": "Approved by a person",
    "denied": "Denied by a person",
    "cancelled": "Cancelled",
    "hold_expired": "Nobody approved it in time",
    "attempt_started": "Attempt started",
    "provider_response": "The provider answered",
    "late_response": "A late answer arrived",
    "attempt_released": "Handed back unsent",
    "lease_expired": "The worker stopped mid-send",
    "window_closed": "The provider's dedupe window closed",
    "reconciled": "Checked with the provider",
    "operator_resolved": "Closed by an operator",
    "notice_enqueued": "The agent's notify address was told",
    "content_redacted": "Message content removed (retention)",
    "delivery_event": "The provider's webhook reported",
}
# Who acts in each kind: the agent (its key), a worker (its owner name), a person (operator or
# admin key name), the provider, or evq itself (an expiry or retention pass).
ACTORS: dict[str, str] = {
    "decision": "agent",
    "enqueued": "agent",
    "attempt_started": "worker",
    "provider_response": "worker",
    "late_response": "worker",
    "attempt_released": "worker",
    "lease_expired": "worker",
    "window_closed": "worker",
    "reconciled": "worker",
    "operator_resolved": "operator",
    "approved": "operator",
    "denied": "operator",
    "cancelled": "operator",
    "delivery_event": "provider",
}


def span(seconds: float | None) -> str:
    """A duration short enough for a table cell, precise where attempts live: 340 ms, 4.2 s, 5m."""
    if seconds is None:
        return ""
    if seconds < 1:
        return f"{max(0.0, seconds) * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    return age(seconds)


def _at(value: Any) -> datetime:
    return datetime.fromisoformat(value) if isinstance(value, str) else value


def trace_rows(events: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each event with ``label``, ``who`` (name), ``who_kind``, ``key`` (the agent's public key id,
    when the event names one), ``took`` (an answer: since its attempt started), ``latency`` (the
    adapter's own measure, ms) and ``gap`` (since the previous event of the run)."""
    started: dict[tuple[Any, Any], datetime] = {}
    rows: list[dict[str, Any]] = []
    previous: datetime | None = None
    for event in events:
        at = _at(event["at"])
        kind = str(event["kind"])
        detail = event.get("detail") or {}
        attempt = (event.get("step"), event.get("attempt"))
        took = None
        if kind == "attempt_started":
            started[attempt] = at
        elif kind in ("provider_response", "late_response", "attempt_released", "lease_expired") and (
            attempt in started
        ):
            took = (at - started[attempt]).total_seconds()
        latency = event.get("latency_ms")
        rows.append(
            {
                **event,
                "label": EVENT_LABELS.get(kind, kind),
                "who": event.get("actor") or ("evq" if kind not in ACTORS else ""),
                "who_kind": ACTORS.get(kind, "evq"),
                "key": detail.get("actor_key_id") if isinstance(detail, Mapping) else None,
                "took": span(took) if took is not None else "",
                "latency": f"{latency:.0f} ms" if isinstance(latency, (int, float)) else "",
                "gap": span((at - previous).total_seconds()) if previous is not None else "",
                "rationale": detail.get("rationale") if kind == "decision" and isinstance(detail, Mapping) else None,
            }
        )
        previous = at
    return rows


# How many of a step's latest events its group shows open; the earlier ones are one click away.
SHOWN_EVENTS = 3


def by_step(rows: Sequence[Mapping[str, Any]], keep: int = SHOWN_EVENTS) -> list[dict[str, Any]]:
    """The trace's rows (trace_rows) grouped by step, in the order each step first appears: its
    ``recent`` events (the last ``keep``) and the ``earlier`` ones (collapsed on the page), and
    each event's place on the run's time axis, ``x`` in percent from the run's first event (0) to
    its last (100), so the groups' axes line up and show when each step acted."""
    if not rows:
        return []
    times = [_at(r["at"]) for r in rows]
    start, end = min(times), max(times)
    width = (end - start).total_seconds() or 1.0
    groups: dict[Any, dict[str, Any]] = {}
    for row, at in zip(rows, times, strict=True):
        group = groups.setdefault(
            row.get("step"), {"step": row.get("step"), "step_id": row.get("step_id"), "events": []}
        )
        group["events"].append({**row, "x": round((at - start).total_seconds() / width * 100, 2)})
    out = []
    for group in groups.values():
        events = group["events"]
        first, last = _at(events[0]["at"]), _at(events[-1]["at"])
        out.append(
            {
                **group,
                "recent": events[-keep:],
                "earlier": events[:-keep] if len(events) > keep else [],
                "x0": events[0]["x"],
                "x1": events[-1]["x"],
                "lasted": span((last - first).total_seconds()),
            }
        )
    return out


# How many of a step's latest events its own page shows open (an unknown row's story ends with
# its last attempts and answers); the earlier ones are inside a closed <details>.
SHOWN_STEP_EVENTS = 5


def step_timeline(
    step: Mapping[str, Any], decision: Mapping[str, Any] | None, evidence: Sequence[Mapping[str, Any]]
) -> dict[str, Any] | None:
    """One step's events (the decision, the enqueue, then its evidence: holds, approvals,
    attempts, answers, webhooks' reports, notices) as one by_step group on the step's own time
    axis (0: its first event, 100: its last), the latest SHOWN_STEP_EVENTS open; None when
    there is nothing to show (a step always has at least its enqueue)."""
    events = trace_rows(run_events([step], [decision] if decision else [], evidence))
    groups = by_step(events, keep=SHOWN_STEP_EVENTS)
    if not groups:
        return None
    group = groups[0]
    return {**group, "start": events[0]["at"], "end": events[-1]["at"]}
