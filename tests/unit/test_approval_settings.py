"""EVQ_APPROVAL_* and EVQ_BUDGET_*: read into Settings.policy().approval, and every bad value
refused naming the variable (ops/settings.py, worker/approval_policy.py)."""

from __future__ import annotations

from datetime import time, timedelta

import pytest

from evq.ops.settings import Settings
from evq.worker.approval_policy import Budget, FirstContact, OverBudget
from evq.worker.errors import ConfigError, InvalidRequest
from evq.worker.request import parse
from tests.support import POLICY, request


def test_the_settings_build_the_policy():
    approval = (
        Settings.load(
            {
                "EVQ_APPROVAL_ALWAYS": "true",
                "EVQ_APPROVAL_FIRST_CONTACT": "Domain",
                "EVQ_APPROVAL_MAX_RECIPIENTS": "5",
                "EVQ_APPROVAL_HOURS": "22:00-06:00",
                "EVQ_APPROVAL_WEEKDAYS": "fri-mon",
                "EVQ_APPROVAL_TIMEZONE": "Europe/Berlin",
                "EVQ_APPROVAL_EXPIRES": "never",
                "EVQ_BUDGET_RUN_RECIPIENTS": "100",
                "EVQ_BUDGET_KEY_DAILY": "1000",
                "EVQ_BUDGET_ACTION": "refuse",
            }
        )
        .policy()
        .approval
    )
    assert approval.always and approval.first_contact is FirstContact.DOMAIN and approval.max_recipients == 5
    assert approval.hours is not None
    assert (approval.hours.start, approval.hours.end, approval.hours.timezone) == (time(22), time(6), "Europe/Berlin")
    assert approval.hours.weekdays == (0, 4, 5, 6)
    assert approval.expires_after is None and approval.over_budget is OverBudget.REFUSE
    assert approval.budgets == ((Budget.RUN_RECIPIENTS, 100), (Budget.KEY_DAILY, 1000))
    default = Settings.load({}).policy().approval
    assert not default.active and default.expires_after == timedelta(hours=72)


@pytest.mark.parametrize(
    ("env", "value", "says"),
    [
        ("EVQ_APPROVAL_HOURS", "8-18", "HH:MM-HH:MM"),
        ("EVQ_APPROVAL_HOURS", "09:00-09:00", "same time"),
        ("EVQ_APPROVAL_WEEKDAYS", "someday", "mon-fri"),
        ("EVQ_APPROVAL_TIMEZONE", "Mars/Olympus", "IANA"),
        ("EVQ_APPROVAL_EXPIRES", "soon", "duration"),
        ("EVQ_APPROVAL_EXPIRES", "0", "positive"),
        ("EVQ_APPROVAL_FIRST_CONTACT", "yes", "off, address, domain"),
        ("EVQ_APPROVAL_MAX_RECIPIENTS", "0", "at least 1"),
        ("EVQ_BUDGET_KEY_DAILY", "-3", "at least 1"),
        ("EVQ_BUDGET_ACTION", "drop", "hold, refuse"),
    ],
)
def test_a_bad_value_is_refused_naming_its_variable(env, value, says):
    with pytest.raises(ConfigError) as refused:
        Settings.load({env: value})
    assert env in refused.value.message and says in refused.value.message


def test_the_request_fields_are_checked_and_kept_out_of_the_payload():
    asked = request(step_id="a")
    plain = parse(asked, POLICY)
    gated = parse(
        {**asked, "require_approval": True, "priority": "low", "send_at": "2026-01-01T09:00:00+02:00"}, POLICY
    )
    assert gated.payload_sha256 == plain.payload_sha256  # how a send is gated is not what is sent
    assert (gated.require_approval, gated.priority, gated.send_at.utcoffset()) == (True, "low", timedelta(hours=2))
    for field, value in (
        ("require_approval", "yes"),
        ("priority", "urgent"),
        ("send_at", "tomorrow"),
        ("send_at", "2026-01-01T09:00:00"),  # no offset
        ("send_at", "2999-01-01T00:00:00Z"),  # more than 365 days ahead
    ):
        with pytest.raises(InvalidRequest) as refused:
            parse(request(**{field: value}), POLICY)
        assert refused.value.errors[0]["field"] == field


@pytest.mark.parametrize("bad", ["monkey", "mondayz", "friendly", "mo"])
def test_a_weekday_is_named_whole_or_by_its_three_letters(bad):
    from evq.worker.approval_policy import weekday_list

    with pytest.raises(ValueError, match="expected weekdays"):
        weekday_list(bad)
    assert weekday_list("Monday-wed,FRI") == (0, 1, 2, 4)


def test_hours_with_an_offset_are_refused_for_the_time_zone_setting():
    from evq.worker.approval_policy import hours_range

    with pytest.raises(ValueError, match="EVQ_APPROVAL_TIMEZONE"):
        hours_range("08:00+02:00-18:00+02:00")


def test_hourly_budgets_and_hours_judge_the_hour_a_send_goes_out_in():
    from datetime import UTC, datetime, timedelta

    from evq.worker.approval_policy import ApprovalPolicy, Budget, budget_charges, going_out

    now = datetime(2030, 1, 1, 9, 30, tzinfo=UTC)
    later = now + timedelta(hours=5)
    policy = ApprovalPolicy(budgets=((Budget.KEY_HOURLY, 3),))
    [(_, _, window, _, _)] = budget_charges(
        policy, run_id="r", actor="bot", recipients=["a@example.com"], now=going_out(now, later)
    )
    assert window == datetime(2030, 1, 1, 14, tzinfo=UTC)
    assert going_out(now, now - timedelta(hours=1)) == now  # a past send_at is now
