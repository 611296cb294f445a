"""The ambiguity contract's verdict (worker/verdict.py) for every status and reason, and the
places that name its values (labels, the JSON Schemas, `evq schema`) agreeing with it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evq.ops.app.labels import NEXT_ACTION_LABELS
from evq.ops.app.waiting import WAIT_MAX, parse_wait
from evq.worker.errors import InvalidRequest
from evq.worker.states import Reason, Status
from evq.worker.verdict import NEXT_ACTIONS, verdict

SCHEMAS = Path(__file__).resolve().parents[2] / "ops" / "app" / "cli-schema"
REASONS = [None, *Reason]

# What each rejected reason asks of an agent, spelt out (not derived from verdict.py's sets):
# stopped on purpose -> none; ran out of time or attempts -> resend; the message refused -> fix it.
REJECTED = {
    Reason.DENIED: "none",
    Reason.CANCELLED: "none",
    Reason.OPERATOR: "none",
    Reason.ATTEMPTS_EXHAUSTED: "resend",
    Reason.RETRY_BUDGET_EXHAUSTED: "resend",
    Reason.APPROVAL_EXPIRED: "resend",
}


@pytest.mark.parametrize("reason", REASONS)
@pytest.mark.parametrize("status", list(Status))
@pytest.mark.parametrize("maybe_delivered", [False, True])
@pytest.mark.parametrize("resolvable", [False, True])
def test_every_status_and_reason(status, reason, maybe_delivered, resolvable):
    v = verdict(str(status), reason, maybe_delivered=maybe_delivered, resolvable=resolvable)
    expected = {
        Status.HELD: (False, "wait_for_approval"),
        Status.PENDING: (False, "wait"),
        Status.IN_FLIGHT: (False, "wait"),
        Status.RETRYABLE: (False, "wait"),
        Status.UNKNOWN: (False, "wait" if resolvable else "ask_operator"),
        Status.ACCEPTED: (False, "none"),
    }.get(status)
    if expected is None:  # rejected
        if maybe_delivered:
            # Never so unless an operator said it (invariant 4); should it be, fail closed.
            expected = (False, "ask_operator")
        else:
            expected = (True, REJECTED.get(reason, "fix_and_resend"))
    assert (v.safe_to_retry, v.next_action) == expected
    assert v.next_action in NEXT_ACTIONS
    assert v.to_dict() == {"safe_to_retry": expected[0], "next_action": expected[1]}


def test_safe_to_retry_only_when_nothing_was_sent():
    for status in Status:
        for reason in REASONS:
            for maybe in (False, True):
                for resolvable in (False, True):
                    v = verdict(str(status), reason, maybe_delivered=maybe, resolvable=resolvable)
                    if v.safe_to_retry:
                        assert status is Status.REJECTED and not maybe, (status, reason)


def test_every_next_action_is_reachable_labelled_and_in_the_schema():
    seen = {
        verdict(str(s), r, maybe_delivered=m, resolvable=x).next_action
        for s in Status
        for r in REASONS
        for m in (False, True)
        for x in (False, True)
    }
    assert seen == set(NEXT_ACTIONS)
    assert set(NEXT_ACTION_LABELS) == set(NEXT_ACTIONS)
    common = json.loads((SCHEMAS / "_common.schema.json").read_text())["$defs"]
    assert common["next_action"]["enum"] == list(NEXT_ACTIONS)
    for name in NEXT_ACTIONS:
        assert f"{name}: " in common["next_action"]["description"]
    for shape in ("step_summary", "step_row", "enqueue_result"):
        assert {"safe_to_retry", "next_action", "next_action_label"} <= set(common[shape]["required"]), shape


def test_schema_documents_every_next_action():
    """`evq schema steps.wait` (and the MCP tool's description) names each value and what it asks."""
    from click.testing import CliRunner

    from evq.ops.cli import cli

    done = CliRunner().invoke(cli, ["schema", "steps.wait", "-o", "json"], catch_exceptions=False)
    tool = json.loads(done.output)["data"]
    text = json.dumps(tool)
    for name, meaning in NEXT_ACTIONS.items():
        assert f"{name}: {meaning}"[:60] in text, name
    assert tool["effect"] == "read" and tool["interfaces"]["mcp"] == "evq_steps_wait"


@pytest.mark.parametrize(
    ("text", "seconds"), [("30s", 30.0), ("1m", 60.0), ("500ms", 0.5), ("0", 0.0), ("2.5s", 2.5), (" 10 ", 10.0)]
)
def test_a_wait_is_a_short_duration(text, seconds):
    assert parse_wait(text) == seconds


@pytest.mark.parametrize("text", ["61s", "2m", "soon", "-1s", "1h", "", "30 seconds"])
def test_a_wait_too_long_or_unreadable_is_refused(text):
    with pytest.raises(InvalidRequest) as refused:
        parse_wait(text, field="wait")
    assert refused.value.errors[0]["field"] == "wait"
    assert WAIT_MAX == 60


def test_a_view_that_does_not_know_the_providers_profiles_fails_closed():
    """verdict_view without the unresolvable providers (a caller that did not pass them) never
    says `wait` for an unknown step: it may be one nothing will settle, so an operator is asked."""
    from evq.ops.app.service import verdict_view

    unknown = {"status": "unknown", "reason": "ambiguous_response", "maybe_delivered": True, "provider": "http"}
    assert verdict_view(**unknown, unresolvable=None)["next_action"] == "ask_operator"
    assert verdict_view(**unknown, unresolvable=())["next_action"] == "wait"
    assert verdict_view(**unknown, unresolvable=("http",))["next_action"] == "ask_operator"
    shown = verdict_view(**unknown, unresolvable=())
    assert shown == {"safe_to_retry": False, "next_action": "wait", "next_action_label": NEXT_ACTION_LABELS["wait"]}


def test_an_unknown_step_its_provider_has_not_settled_within_the_hour_needs_an_operator():
    """The reconciler's checks are spent, or the provider never had the message and sends no
    event: waiting longer would be waiting forever."""
    from evq.worker.verdict import SETTLE_WITHIN

    fresh = verdict("unknown", "lease_expired", maybe_delivered=True, resolvable=True, unknown_for=60)
    stale = verdict("unknown", "lease_expired", maybe_delivered=True, resolvable=True, unknown_for=SETTLE_WITHIN)
    assert (fresh.next_action, stale.next_action) == ("wait", "ask_operator")
    assert not stale.safe_to_retry


def test_a_run_trace_may_carry_every_evidence_kind():
    """runs show lists each step's evidence by kind: its schema takes every kind the database may hold."""
    import json

    from jsonschema import Draft202012Validator

    from evq.adapters.postgres.schema import EVIDENCE_KINDS
    from evq.ops.app.schemas import output_schema

    kind = output_schema("runs.show")["$defs"]["event"]["properties"]["kind"]
    check = Draft202012Validator({**kind, "$defs": output_schema("runs.show")["$defs"]})
    assert all(check.is_valid(k) for k in (*EVIDENCE_KINDS, "decision", "enqueued"))
    assert not check.is_valid("made_up")
    json.dumps(kind)
