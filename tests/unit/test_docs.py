"""The README stays true: its commands, its settings table, its error codes."""

from __future__ import annotations

import re
from pathlib import Path

from ops.cli.output import EXIT_CODES
from worker.settings import markdown_table

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def _commands() -> list[str]:
    return re.findall(r"```sh\n(.+?)\n```", README)[:2]


def test_readme_opens_with_the_two_commands():
    run, test = _commands()
    assert run == "python3 -m pip install -e . && evq demo"
    assert test == "python3 -m pip install -e '.[test]' && python3 -m pytest"


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    assert _commands()[1] in ci.splitlines()


def test_settings_table_is_current():
    assert markdown_table() in README


def test_every_documented_error_code_has_its_exit_code():
    for code, exit_code in re.findall(r"\| `(E_[A-Z_]+)` \| (\d+) \|", README):
        assert EXIT_CODES[code] == int(exit_code)
