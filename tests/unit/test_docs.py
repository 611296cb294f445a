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


ERROR_CODES = (ROOT / "docs" / "cli-schema" / "error-codes.md").read_text()


def _code_table(text: str) -> dict[str, int]:
    return {code: int(exit_code) for code, exit_code in re.findall(r"\| `(E_[A-Z_]+)` \| (\d+) \|", text)}


def test_every_error_code_is_documented_with_its_exit_code():
    assert _code_table(README) == EXIT_CODES
    assert _code_table(ERROR_CODES) == EXIT_CODES
    assert "130" in README and "130" in ERROR_CODES


def _matrix_references(text: str) -> list[tuple[str, str | None]]:
    """(file, test or None) for each test a table row names; ``::name`` continues the row's last file."""
    found: list[tuple[str, str | None]] = []
    for line in text.splitlines():
        if not line.startswith("|"):
            continue
        current = None
        for ref in re.findall(r"`((?:tests/[\w/]+\.py)?(?:::\w+)?)`", line):
            path, _, name = ref.partition("::")
            current = path or current
            assert current, f"{ref!r} names no file: {line[:120]}"
            found.append((current, name or None))
    return found


def test_the_failure_matrix_names_tests_that_exist_and_the_readme_links_it():
    matrix = (ROOT / "docs" / "failure-matrix.md").read_text()
    references = _matrix_references(matrix)
    assert len(references) > 40
    for path, name in references:
        source = (ROOT / path).read_text() if (ROOT / path).is_file() else None
        assert source is not None, f"docs/failure-matrix.md names {path}, which does not exist"
        if name:
            assert re.search(rf"^(async )?def {name}\(", source, flags=re.M), f"{path} has no test {name}"
    rows = re.findall(r"^\| (\d+)[a-z]? \|.*\|(.*)\|$", matrix, flags=re.M)
    assert {int(n) for n, _ in rows} >= set(range(1, 9))
    for n, cell in rows:
        assert "::test_" in cell, f"row {n} names no test function"
    assert "](docs/failure-matrix.md)" in README


def test_one_distribution_with_the_evq_console_script_and_the_design_layout():
    """The README's commands call `evq`, the console script `pip install -e .` puts on PATH
    (every other test runs `python -m ops.cli`, so this is the one that checks the script)."""
    import shutil
    import subprocess
    import tomllib
    from importlib.metadata import entry_points

    assert tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"] == {"evq": "ops.cli:main"}
    assert [e.value for e in entry_points(group="console_scripts", name="evq")] == ["ops.cli:main"]
    script = shutil.which("evq")
    assert script, "the evq console script is not installed: python3 -m pip install -e '.[test]'"
    done = subprocess.run([script, "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "evq demo" in done.stdout
    for part in ("pyproject.toml", "worker", "migrations", "adapters", "ops", "tests", "docker-compose.yml"):
        assert (ROOT / part).exists(), part
