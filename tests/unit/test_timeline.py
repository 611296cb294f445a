"""A run's chain in time order, from rows."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from evq.worker.timeline import run_events

T = datetime(2030, 1, 1, tzinfo=UTC)


def test_decision_then_action_then_evidence_even_at_the_same_instant():
    step = {
        "id": 7,
        "step_id": "welcome",
        "decision_id": 3,
        "created_at": T,
        "idempotency_key": "r:welcome",
        "message_id": "<m@x>",
        "provider": "smtp",
        "max_attempts": None,
        "notify": None,
        "payload": {"to": [{"email": "a@x"}], "cc": [], "bcc": [], "subject": "Hi"},
    }
    decision = {
        "id": 3,
        "created_at": T,
        "intent": "greet",
        "model": "m",
        "tool": "send_email",
        "instruction_version": "v1",
        "prompt_version": None,
        "rationale": "asked",
        "decided_at": None,
    }
    evidence = [
        {
            "id": 2,
            "step_id": 7,
            "created_at": T + timedelta(seconds=2),
            "kind": "provider_response",
            "attempt": 1,
            "actor": "w",
            "from_status": "in_flight",
            "to_status": "unknown",
            "outcome": "unknown",
            "detail": {},
        },
        {
            "id": 1,
            "step_id": 7,
            "created_at": T,
            "kind": "attempt_started",
            "attempt": 1,
            "actor": "w",
            "from_status": "pending",
            "to_status": "in_flight",
            "detail": {},
        },
        {"id": 9, "step_id": 99, "created_at": T, "kind": "attempt_started", "detail": {}},  # not this run's step
    ]
    events = run_events([step], [decision], evidence)
    assert [e["kind"] for e in events] == ["decision", "enqueued", "attempt_started", "provider_response"]
    assert events[0]["detail"]["intent"] == "greet" and events[1]["detail"]["to"] == ["a@x"]
    assert events[3]["evidence_id"] == 2 and events[3]["outcome"] == "unknown"
    assert all(set(e) == set(events[0]) for e in events)  # one shape for every event
