"""The README and the reference pages it links stay true: its commands, its length, the pages it
links, the settings table (docs/settings.md), the metrics (docs/metrics.md), the error codes
(docs/reference/cli.md)."""

from __future__ import annotations

import re
from pathlib import Path

from evq.ops.cli.output import EXIT_CODES
from evq.ops.option_catalogue import CONSTANTS, OPTIONS, constants_table, markdown_table

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
DOCS = ROOT / "docs"
CLI_REFERENCE = (DOCS / "reference" / "cli.md").read_text()


def _commands() -> list[str]:
    return re.findall(r"```sh\n(.+?)\n```", README)[:3]


def test_readme_opens_with_the_venv_line_then_the_two_commands():
    # The venv line comes first: it is what rescues the run command on Debian's python3 (PEP 668).
    venv, run, test = _commands()
    assert venv == "python3 -m venv .venv && . .venv/bin/activate"
    assert run == "python3 -m pip install -e '.[embedded,dev]' && evq admin demo"
    assert test == "python3 -m pip install -e '.[test]' && python3 -m pytest"


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    assert _commands()[2] in ci.splitlines()


def test_the_readme_fits_in_250_lines_and_every_docs_link_it_has_exists():
    """Issue 33: the README says what evq is, how to run and test it, one enqueue and the states, and
    links the rest; every link into docs/ (and every relative link) names a file that exists."""
    assert len(README.splitlines()) <= 250, len(README.splitlines())
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README)
    local = [link for link in links if "://" not in link]
    assert len(local) > 20
    for link in local:
        assert (ROOT / link).exists(), f"README links {link}, which does not exist"


def test_settings_table_is_current_and_the_readme_links_it():
    # Generated from the settings' definitions: a setting another change adds fails here until
    # docs/settings.md is regenerated (python -c 'from evq.ops.option_catalogue import markdown_table; ...').
    assert markdown_table() in (DOCS / "settings.md").read_text()
    assert constants_table() in (DOCS / "settings.md").read_text()
    assert "](docs/settings.md)" in README


# Issue 33: as many settings as a person running evq would turn, and no more (its peers have
# 16 to 37); what nobody turns is a documented constant (docs/settings.md, "Constants").
MAX_SETTINGS = 60


def test_there_are_at_most_60_settings():
    table = (DOCS / "settings.md").read_text().split("## Constants")[0]
    rows = re.findall(r"^\| `(EVQ_[A-Z0-9_]+)` \|", table, flags=re.M)
    assert len(rows) == len(OPTIONS) and len(rows) <= MAX_SETTINGS, len(rows)
    # No variable names a constant: each one is read or it is not a setting at all.
    assert not {f"EVQ_{name.upper()}" for name in CONSTANTS} & set(rows)


def test_the_readme_links_its_reference_pages_and_keeps_no_long_table_of_its_own():
    for page in ("settings.md", "metrics.md", "adapters.md"):
        assert f"](docs/{page}" in README and (DOCS / page).exists(), page
    assert "| variable |" not in README and "| metric | type |" not in README
    assert "| the provider answers |" not in README and "| SES answers |" not in README


def _registered_metrics() -> set[str]:
    sources = [ROOT / "worker" / "metrics.py", ROOT / "ops" / "app" / "metrics.py"]
    return {name for p in sources for name in re.findall(r'"(evq_[a-z_]+)"', p.read_text())}


def test_every_registered_metric_is_in_docs_metrics_and_every_one_there_is_registered():
    text = (DOCS / "metrics.md").read_text()
    documented = set(re.findall(r"^\| `(evq_[a-z_]+)", text, flags=re.M))
    documented |= set(re.findall(r"^\| `evq_[a-z_]+`, `(evq_[a-z_]+)`", text, flags=re.M))
    registered = _registered_metrics()
    # prometheus_client adds _total to a counter's name; a collector's family may carry it already.
    registered_names = registered | {n + "_total" for n in registered}
    assert documented <= registered_names, documented - registered_names
    undocumented = {n for n in registered if n not in documented and n + "_total" not in documented}
    assert undocumented == set(), undocumented


ERROR_CODES = (ROOT / "docs" / "cli-schema" / "error-codes.md").read_text()


def _code_table(text: str) -> dict[str, int]:
    return {code: int(exit_code) for code, exit_code in re.findall(r"\| `(E_[A-Z_]+)` \| (\d+) \|", text)}


def test_every_error_code_is_documented_with_its_exit_code():
    assert _code_table(CLI_REFERENCE) == EXIT_CODES
    assert _code_table(ERROR_CODES) == EXIT_CODES
    assert "130" in CLI_REFERENCE and "130" in ERROR_CODES


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
    (every other test runs `python -m evq.ops.cli`, so this is the one that checks the script)."""
    import shutil
    import subprocess
    import tomllib
    from importlib.metadata import entry_points

    assert tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"] == {"evq": "evq.ops.cli:main"}
    assert [e.value for e in entry_points(group="console_scripts", name="evq")] == ["evq.ops.cli:main"]
    script = shutil.which("evq")
    assert script, "the evq console script is not installed: python3 -m pip install -e '.[test]'"
    done = subprocess.run([script, "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "evq admin demo" in done.stdout
    for part in (
        "pyproject.toml",
        "worker",
        "migrations",
        "adapters",
        "ops",
        "tests",
        "docker-compose.yml",
    ):
        assert (ROOT / part).exists(), part


DESIGN = (ROOT / "docs" / "design.md").read_text()
_TOP = ("worker", "adapters", "ops", "migrations", "tests", "docs")


def _design_references(text: str) -> list[tuple[str, str | None]]:
    """(path, name or None) for each `path/like/this.py` or `path.py::name` the text names."""
    found = []
    for ref in re.findall(r"`([\w.-]+(?:/[\w.-]+)+/?(?:::\w+)?)`", text):
        path, _, name = ref.partition("::")
        if path.split("/", 1)[0] in _TOP:
            found.append((path, name or None))
    return found


def test_the_design_names_files_and_tests_that_exist():
    references = _design_references(DESIGN)
    assert len(references) > 60
    for path, name in references:
        assert (ROOT / path).exists(), f"docs/design.md names {path}, which does not exist"
        if name:
            source = (ROOT / path).read_text()
            assert re.search(rf"^\s*(async )?(def|class) {name}\b", source, flags=re.M), f"{path} has no {name}"
    # The data model names every table of the schema (the model the baseline is rendered from).
    from evq.adapters.postgres.schema import metadata

    model = DESIGN[DESIGN.index("## Data model") : DESIGN.index("## States and transitions")]
    assert set(re.findall(r"^\| `(\w+)` \|", model, flags=re.M)) == {*metadata.tables, "alembic_version"}


def test_code_cites_sections_of_the_design_that_exist():
    """Code points at the repository's own design, by a section that exists, never at a file
    outside the repository (the design intent the project started from)."""
    headings = set(re.findall(r"^#+ (.+)$", DESIGN, flags=re.M))
    external = "DESIGN" + ".md"
    cited = 0
    code = [p for top in ("worker", "adapters", "ops", "migrations", "tests") for p in (ROOT / top).rglob("*")]
    for path in sorted(code):
        if path.suffix not in (".py", ".sql"):
            continue
        text = path.read_text()
        assert external not in text, f"{path.relative_to(ROOT)} points at {external}, outside the repository"
        for section in re.findall(r'docs/design\.md, "([^"]+)"', text):
            assert section in headings, f"{path.relative_to(ROOT)} cites a section docs/design.md lacks: {section}"
            cited += 1
    assert cited >= 10


def test_the_core_imports_no_adapter_and_no_ops():
    """docs/design.md, "Layout and dependency direction": worker/ never imports adapters or ops."""
    import ast

    paths = sorted((ROOT / "worker").rglob("*.py"))
    assert ROOT / "worker" / "ports" / "__init__.py" in paths
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            modules = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else ([node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            )
            for module in modules:
                # Under the one import root the core's neighbours are evq.adapters and evq.ops;
                # a bare `adapters` or `ops` is no module at all once installed.
                top = module.removeprefix("evq.").split(".")[0]
                assert top not in ("adapters", "ops"), f"{path.relative_to(ROOT)} imports {module}"


def test_the_readme_draws_every_state_as_how_a_send_moves_does():
    """The README's state diagram is the one docs/how-a-send-moves.md opens with, and it names every
    state the core knows (worker/states.py): a state added without its place in the picture fails."""
    from evq.worker.states import Status

    def diagram(text: str) -> str:
        section = text[text.index("How a send moves") :]
        return section[section.index("```\n") + 4 : section.index("\n```", section.index("```\n") + 4)]

    drawn = diagram(README)
    assert drawn == diagram((DOCS / "how-a-send-moves.md").read_text())
    assert {str(s) for s in Status} <= set(re.findall(r"[a-z_]+", drawn))
