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

R = Reason
# Every (status, reason, maybe_delivered) a step can hold, with the statement that leaves it so,
# and what it tells an agent (safe_to_retry, next_action), spelt out (not derived from
# verdict.py). `unknown` is shown through a provider that can settle it within the hour; the
# rule for the rest is test_an_unknown_step_its_provider_has_not_settled_within_the_hour...
EXISTING = [
    # held: step_enqueue under a hold rule
    ("held", R.APPROVAL_REQUIRED, False, False, "wait_for_approval"),
    # pending: step_enqueue, step_approve, step_release of a first attempt
    ("pending", None, False, False, "wait"),
    ("pending", R.APPROVED, False, False, "wait"),
    ("pending", R.RELEASED, False, False, "wait"),
    # in flight: step_claim keeps the reason it found
    ("in_flight", None, False, False, "wait"),
    ("in_flight", R.PROVIDER_TEMPORARY, False, False, "wait"),
    ("in_flight", R.AMBIGUOUS_DEDUPED, True, False, "wait"),
    # retryable: step_record, step_rescue inside a dedupe window, step_release of a later
    # attempt, an operator's retry or requeue (step_resolve clears the flag)
    ("retryable", R.PROVIDER_TEMPORARY, False, False, "wait"),
    ("retryable", R.PROVIDER_MISCONFIGURED, False, False, "wait"),
    ("retryable", R.AMBIGUOUS_DEDUPED, True, False, "wait"),
    ("retryable", R.LEASE_EXPIRED, True, False, "wait"),
    ("retryable", R.RELEASED, False, False, "wait"),
    ("retryable", R.RELEASED, True, False, "wait"),
    ("retryable", R.OPERATOR, False, False, "wait"),
    # unknown: step_record (an ambiguous answer; a refusal or exhaustion after an attempt that
    # may have been delivered), step_rescue, step_close_windows
    ("unknown", R.AMBIGUOUS_RESPONSE, True, False, "wait"),
    ("unknown", R.LEASE_EXPIRED, True, False, "wait"),
    ("unknown", R.DEDUPE_WINDOW_CLOSED, True, False, "wait"),
    ("unknown", R.PROVIDER_REJECTED, True, False, "wait"),
    ("unknown", R.POLICY_REFUSED, True, False, "wait"),
    ("unknown", R.ATTEMPTS_EXHAUSTED, True, False, "wait"),
    ("unknown", R.RETRY_BUDGET_EXHAUSTED, True, False, "wait"),
    # accepted: step_record, an operator's verdict, the reconciler, a webhook, a late answer
    ("accepted", R.PROVIDER_ACCEPTED, False, False, "none"),
    ("accepted", R.PROVIDER_ACCEPTED, True, False, "none"),
    ("accepted", R.PARTIALLY_REFUSED, False, False, "none"),
    ("accepted", R.PARTIALLY_REFUSED, True, False, "none"),
    ("accepted", R.OPERATOR, True, False, "none"),
    ("accepted", R.RECONCILED, True, False, "none"),
    ("accepted", R.WEBHOOK, True, False, "none"),
    ("accepted", R.LATE_ANSWER, True, False, "none"),
    ("accepted", R.LATE_ANSWER, False, False, "none"),
    # rejected by the provider or the policy (step_record; never when an earlier attempt may
    # have been delivered: that ends unknown)
    ("rejected", R.PROVIDER_REJECTED, False, True, "fix_and_resend"),
    ("rejected", R.POLICY_REFUSED, False, True, "fix_and_resend"),
    # rejected for time or attempts (step_record, steps_expire_held): requeue-able, or resend
    ("rejected", R.ATTEMPTS_EXHAUSTED, False, True, "resend"),
    ("rejected", R.RETRY_BUDGET_EXHAUSTED, False, True, "resend"),
    ("rejected", R.APPROVAL_EXPIRED, False, True, "resend"),
    # stopped on purpose (step_deny, step_cancel: never a step that may have been delivered)
    ("rejected", R.DENIED, False, True, "none"),
    ("rejected", R.CANCELLED, False, True, "none"),
    # closed by an operator's verdict (step_resolve from unknown keeps the flag): finished, and
    # never safe to send again while it may have been delivered
    ("rejected", R.OPERATOR, True, False, "none"),
    ("rejected", R.OPERATOR, False, True, "none"),
    # the provider's definite refusal arriving after the rescue (step_record_late): the flag is
    # the rescue's, for the very attempt the provider refused (after an operator's retry: cleared)
    ("rejected", R.LATE_ANSWER, True, True, "fix_and_resend"),
    ("rejected", R.LATE_ANSWER, False, True, "fix_and_resend"),
]


@pytest.mark.parametrize(("status", "reason", "maybe_delivered", "safe", "action"), EXISTING)
def test_every_state_a_step_can_be_in_says_what_to_do(status, reason, maybe_delivered, safe, action):
    v = verdict(status, reason, maybe_delivered=maybe_delivered, resolvable=True, unknown_for=60)
    assert (v.safe_to_retry, v.next_action) == (safe, action)
    assert v.to_dict() == {"safe_to_retry": safe, "next_action": action}


def test_a_closed_step_never_asks_for_an_operator_or_to_wait():
    """Nothing reopens a closed step but an operator's requeue of one that was never sent: "ask an
    operator" (an operator closed it already) or "wait" would leave an agent waiting for nothing."""
    closed = [row for row in EXISTING if row[0] in ("accepted", "rejected")]
    assert {row[0] for row in closed} == {"accepted", "rejected"}
    for status, reason, maybe_delivered, *_ in closed:
        v = verdict(status, reason, maybe_delivered=maybe_delivered, resolvable=False, unknown_for=10**6)
        assert v.next_action not in ("ask_operator", "wait", "wait_for_approval"), (status, reason, maybe_delivered)


@pytest.mark.parametrize("reason", REASONS)
@pytest.mark.parametrize("status", list(Status))
@pytest.mark.parametrize("maybe_delivered", [False, True])
@pytest.mark.parametrize("resolvable", [False, True])
def test_every_status_and_reason(status, reason, maybe_delivered, resolvable):
    """Every combination, those no statement writes included: an impossible one fails closed."""
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
        known = {(r[1], r[2]): (r[3], r[4]) for r in EXISTING if r[0] == "rejected"}
        # A rejection no statement writes while it may have been delivered (invariant 4): fail closed.
        expected = known.get((reason, maybe_delivered), (False, "ask_operator") if maybe_delivered else None)
        if expected is None:  # any other refusal of the message itself
            expected = (True, "fix_and_resend")
    assert (v.safe_to_retry, v.next_action) == expected
    assert v.next_action in NEXT_ACTIONS


def test_safe_to_retry_only_when_nothing_was_sent():
    for status in Status:
        for reason in REASONS:
            for maybe in (False, True):
                for resolvable in (False, True):
                    v = verdict(str(status), reason, maybe_delivered=maybe, resolvable=resolvable)
                    if v.safe_to_retry:
                        # The flag a late refusal leaves is that very attempt's, answered "refused".
                        assert status is Status.REJECTED and (not maybe or reason is Reason.LATE_ANSWER), (
                            status,
                            reason,
                        )


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
