"""The pure parts of the ops page's action guards (issue 18): the bulk loop's CLI line built
without a textual placeholder, and the zone names EVQ_OPS_TIMEZONE and /ops/zone accept."""

from __future__ import annotations

import shlex

import pytest

from evq.ops.time_zones import time_zone
from evq.ops.web.page.bulk_actions import cli_commands


def test_a_note_holding_any_word_stays_as_typed_in_the_loop_line():
    note = "STEP_ID_OF_THE_LOOP and $id are words here"
    [loop] = cli_commands("cancel", [4, 9], {"note": note}, {})
    words = shlex.split(loop["command"].removeprefix("for id in 4 9; do ").removesuffix("; done"))
    assert words == ["evq", "steps", "cancel", "$id", "--note", note]
    [one, _] = cli_commands("close", [4], {"note": note, "verdict": "rejected"}, {})
    words = shlex.split(one["command"].removeprefix("for id in 4; do ").removesuffix("; done"))
    assert words == ["evq", "steps", "resolve", "$id", "--as", "rejected", "--note", note]


@pytest.mark.parametrize("name", ["right/Europe/Berlin", "posix/Europe/Berlin", "posixrules", "localtime", "Factory"])
def test_names_outside_the_iana_list_are_refused(name):
    with pytest.raises(ValueError):
        time_zone(name)


@pytest.mark.parametrize("name", ["UTC", "Europe/Berlin", "America/Argentina/Buenos_Aires"])
def test_iana_names_are_taken(name):
    assert time_zone(name) == name


def test_a_done_notice_follows_the_latest_decision_not_the_state_a_worker_moved_the_step_to():
    from evq.ops.web.page.step import done_notice

    approved_then_sent = [{"kind": "held"}, {"kind": "approved"}, {"kind": "attempt"}, {"kind": "outcome"}]
    assert done_notice("approved", approved_then_sent) is not None  # the worker sent it already
    assert done_notice("denied", approved_then_sent) is None
    assert done_notice("approved", [{"kind": "held"}]) is None  # still held: nothing was decided
    requeued = [{"kind": "operator_resolved", "detail": {"requeued": True}}, {"kind": "attempt"}]
    assert done_notice("requeued", requeued) is not None
    assert done_notice("requeued", [{"kind": "operator_resolved", "detail": {"requeued": False}}]) is None
    # A later decision is the one a notice may claim: approved, then cancelled.
    assert done_notice("approved", [{"kind": "approved"}, {"kind": "cancelled"}]) is None
    assert done_notice("cancelled", [{"kind": "approved"}, {"kind": "cancelled"}]) is not None
    assert done_notice("bogus", approved_then_sent) is None
