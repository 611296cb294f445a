"""The page's CLI equivalents (ops/web/page/common.py::cli_equivalent) are lines the real `evq`
parser reads back into the very values the form posted: the words and flags are the table's."""

from __future__ import annotations

import shlex

import pytest

from evq.ops.cli import cli
from evq.ops.cli.table import find
from evq.ops.web.page.common import cli_equivalent


def parsed(line: str) -> dict[str, object]:
    """What click hands the command body for ``line`` (without running it)."""
    words = shlex.split(line)
    assert words[0] == "evq"
    group, rest = cli, words[1:]
    while rest and rest[0] in getattr(group, "commands", {}):
        group, rest = group.commands[rest[0]], rest[1:]
    assert group is find(cli, " ".join(words[1 : len(words) - len(rest)]))
    ctx = group.make_context(group.name or "", rest)
    return dict(ctx.params)


@pytest.mark.parametrize(
    ("path", "values"),
    [
        ("steps.resolve", {"step_id": 123, "verdict": "accepted", "note": "it's in the log; $(rm -rf /) `x`"}),
        ("steps.resolve", {"step_id": 7, "verdict": "retry", "note": "checked", "reason": "not_in_provider_log"}),
        ("steps.approve", {"step_id": 42, "note": "fixed the greeting", "subject": 'Your "invoice"\n line 2'}),
        ("steps.deny", {"step_id": 9, "note": "not to this customer"}),
        ("steps.cancel", {"step_id": 3, "note": "the customer replied first"}),
        (
            "steps.resolve",
            {"statuses": ["unknown"], "older_than": "2h", "verdict": "rejected", "note": "outage", "dry_run": True},
        ),
    ],
)
def test_the_line_parses_back_to_the_values_the_form_posted(path, values):
    line = cli_equivalent(path, **values)
    assert line.startswith("evq " + path.replace(".", " ") + " ")
    got = parsed(line)
    for dest, value in values.items():
        expected = tuple(value) if isinstance(value, list) else value
        assert got[dest] == expected, (dest, line)


def test_blank_values_are_left_out_and_the_example_reads_as_in_the_issue():
    assert cli_equivalent(
        "steps.resolve", step_id=123, verdict="accepted", note="found it", reason="", evidence_url=None
    ) == ("evq steps resolve 123 --as accepted --note 'found it'")
    assert cli_equivalent("steps.cancel", step_id=5, note="") == "evq steps cancel 5"


def test_a_parameter_the_command_lacks_and_the_api_key_are_refused():
    with pytest.raises(ValueError, match="no parameter"):
        cli_equivalent("steps.deny", step_id=1, note="x", subject="not a deny flag")
    with pytest.raises(ValueError, match="credential"):
        cli_equivalent("steps.approve", step_id=1, note="x", credential="evq_secret")
