"""The trace's timeline rows (ops/web/page/timeline.py): labels, who, gaps and an attempt's duration."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from evq.ops.web.page.timeline import EVENT_LABELS, span, trace_rows

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def event(kind: str, seconds: float, **fields):
    return {"at": T0 + timedelta(seconds=seconds), "kind": kind, "step": 1, "attempt": None, "detail": {}, **fields}


def test_each_row_says_what_who_and_how_long():
    rows = trace_rows(
        [
            event("decision", 0, actor="bot", detail={"actor_key_id": "k1", "rationale": {"why": "asked"}}),
            event("enqueued", 0, actor="bot", detail={"actor_key_id": "k1"}),
            event("attempt_started", 4, actor="w-1", attempt=1),
            event("provider_response", 4.25, actor="w-1", attempt=1, latency_ms=231.6),
            event("attempt_started", 70, actor="w-2", attempt=2),
            event("lease_expired", 190, actor="rescuer@w-1", attempt=2),
            event("operator_resolved", 4000, actor="alice"),
            event("something_newer", 4001),
        ]
    )
    assert [r["label"] for r in rows[:3]] == [EVENT_LABELS["decision"], EVENT_LABELS["enqueued"], "Attempt started"]
    assert rows[-1]["label"] == "something_newer" and rows[-1]["who"] == "evq"
    assert [r["gap"] for r in rows] == ["", "0 ms", "4.0 s", "250 ms", "1m", "2m", "1h03m", "1.0 s"]
    assert rows[3]["took"] == "250 ms" and rows[3]["latency"] == "232 ms"
    assert rows[5]["took"] == "2m"  # attempt 2: started at 70 s, its lease expired at 190 s
    assert rows[2]["took"] == "" and rows[4]["took"] == ""
    assert (rows[0]["who"], rows[0]["who_kind"], rows[0]["key"]) == ("bot", "agent", "k1")
    assert rows[0]["rationale"] == {"why": "asked"} and rows[1]["rationale"] is None
    assert (rows[6]["who"], rows[6]["who_kind"]) == ("alice", "operator")


def test_span_is_precise_where_attempts_live():
    assert [span(s) for s in (None, 0.0004, 0.34, 4.26, 59.9, 61, 7300)] == [
        "",
        "0 ms",
        "340 ms",
        "4.3 s",
        "59.9 s",
        "1m",
        "2h01m",
    ]


def test_by_step_groups_in_first_seen_order_on_one_axis_and_keeps_the_latest_three_open():
    from evq.ops.web.page.timeline import by_step

    rows = trace_rows(
        [
            event("decision", 0, step=1),
            event("enqueued", 0, step=1),
            event("decision", 10, step=2),
            event("attempt_started", 20, step=1, attempt=1),
            event("provider_response", 30, step=1, attempt=1),
            event("enqueued", 40, step=2),
        ]
    )
    first, second = by_step(rows)
    assert (first["step"], second["step"]) == (1, 2)
    assert [e["kind"] for e in first["earlier"]] == ["decision"]
    assert [e["kind"] for e in first["recent"]] == ["enqueued", "attempt_started", "provider_response"]
    assert second["earlier"] == [] and [e["x"] for e in second["recent"]] == [25.0, 100.0]
    assert (first["x0"], first["x1"], first["lasted"]) == (0.0, 75.0, "30.0 s")
    assert by_step([]) == []


def test_a_steps_own_timeline_puts_every_kind_on_its_axis_and_folds_all_but_the_latest_five():
    """The step page's timeline (issue 34): the decision, the enqueue and every evidence kind
    (hold, approval, attempts, answers, a webhook's report, a notice) in time order on the step's
    own axis (0 at its first event, 100 at its last); the latest five open, the rest folded."""
    from datetime import UTC, datetime, timedelta

    from evq.ops.web.page.timeline import SHOWN_STEP_EVENTS, step_timeline

    t0 = datetime(2026, 5, 1, 9, 0, tzinfo=UTC)
    step = {"id": 7, "step_id": "s-7", "decision_id": 3, "created_at": t0, "payload": {"to": [{"email": "a@b.c"}]}}
    decision = {"id": 3, "created_at": t0, "actor": "bot"}
    kinds = ["held", "approved", "attempt_started", "provider_response", "delivery_event", "notice_enqueued"]
    evidence = [
        {"id": i + 1, "step_id": 7, "kind": k, "created_at": t0 + timedelta(seconds=10 * (i + 1))}
        for i, k in enumerate(kinds)
    ]
    shown = step_timeline(step, decision, evidence)
    assert shown is not None and SHOWN_STEP_EVENTS == 5
    assert [e["kind"] for e in shown["events"]] == ["decision", "enqueued", *kinds]
    assert [e["kind"] for e in shown["recent"]] == kinds[1:]
    assert [e["kind"] for e in shown["earlier"]] == ["decision", "enqueued", "held"]
    assert [e["x"] for e in shown["events"]] == [0.0, 0.0, 16.67, 33.33, 50.0, 66.67, 83.33, 100.0]
    assert (shown["start"], shown["end"], shown["lasted"]) == (t0, t0 + timedelta(seconds=60), "1m")
    only = step_timeline(step, None, [])
    assert only is not None and [e["kind"] for e in only["recent"]] == ["enqueued"] and only["earlier"] == []
