"""CONTRIBUTING.md, CHANGELOG.md and the pre-commit configuration stay true to the tree."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml

import evq

ROOT = Path(__file__).resolve().parents[2]
CONTRIBUTING = (ROOT / "CONTRIBUTING.md").read_text()
# Folders a contributor's path may start with. tests/core is announced before it exists.
_TOP = ("evq", "worker", "adapters", "ops", "migrations", "tests", "docs", ".ci")
_NOT_YET = {"tests/core", "adapters/NAME.py"}  # and the example of a new adapter


def test_contributing_names_paths_that_exist():
    named = {
        ref.split("::")[0].rstrip("/")
        for ref in re.findall(r"`([\w.-]+(?:/[\w.-]+)+/?(?:::\w+)?)`", CONTRIBUTING)
        if ref.split("/", 1)[0] in _TOP
    }
    assert len(named) > 10
    missing = sorted(p for p in named - _NOT_YET if not (ROOT / p).exists())
    assert missing == []


def test_contributing_gives_the_readme_test_command_as_the_full_suite():
    assert "`python3 -m pip install -e '.[test]' && python3 -m pytest`" in CONTRIBUTING
    assert "`python3 -m pytest tests/unit`" in CONTRIBUTING  # the fast suite: no database


def test_the_changelog_has_this_version():
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert re.search(rf"^## {re.escape(evq.__version__)} - \d{{4}}-\d{{2}}-\d{{2}}$", changelog, flags=re.M)


def test_pre_commit_runs_the_ruff_ci_runs():
    """The hook's pinned ruff is the one installed here (what .ci/run's `python3 -m ruff` runs):
    two versions would disagree about formatting and fail a commit CI accepts, or the reverse."""
    config = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())
    [ruff] = [r for r in config["repos"] if r["repo"] == "https://github.com/astral-sh/ruff-pre-commit"]
    assert [h["id"] for h in ruff["hooks"]] == ["ruff-check", "ruff-format"]
    installed = subprocess.run(
        [sys.executable, "-m", "ruff", "--version"], capture_output=True, text=True, timeout=30, check=True
    ).stdout.split()[-1]
    assert ruff["rev"] == f"v{installed}"
    local = {h["id"]: h for r in config["repos"] if r["repo"] == "local" for h in r["hooks"]}
    # The local hooks run exactly the commands CI runs.
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert local["mypy"]["entry"] in ci and local["lint-imports"]["entry"] in ci
