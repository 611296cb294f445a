"""Everything is imported through `evq.`: no bare `worker`, `adapters`, `ops` or `migrations`.

In a source checkout the repository root is often on sys.path (pytest's rootdir, `python -m` from
the root), so `import ops.cli` works there and names a second copy of every module beside
`evq.ops.cli` (two registries, two sets of metrics, isinstance checks that fail). Installed from
the wheel, it does not work at all: only `evq` is installed (tests/integration/test_wheel.py).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BARE = ("worker", "adapters", "ops", "migrations")
# Folders that are not the project's source: a build's copy, caches, a virtualenv.
SKIP = {".git", "build", "dist", ".venv", "__pycache__", ".hypothesis", ".pytest_cache"}


def _files(*suffixes: str) -> list[Path]:
    return [
        p
        for p in ROOT.rglob("*")
        if p.is_file()
        and (p.suffix in suffixes or p.name in suffixes)
        and not SKIP & set(p.relative_to(ROOT).parts)
        and not any(part.endswith(".egg-info") for part in p.relative_to(ROOT).parts)
    ]


def _is_module(dotted: str) -> bool:
    """Whether ``dotted`` names a module or package in the checkout (``ops.cli`` yes, ``ops.css`` no)."""
    path = ROOT.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _bare_imports(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] in BARE]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] in BARE:
                found.append((node.lineno, node.module))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            # A dotted path in a string: import_module("ops.x"), mock.patch("worker.y.z"), `-m ops.cli`.
            value = node.value.strip()
            if re.fullmatch(r"(worker|adapters|ops|migrations)(\.\w+)+", value) and _is_module(
                ".".join(value.split(".")[:2])
            ):
                found.append((node.lineno, value))
    return found


def test_python_files_import_everything_through_evq():
    files = _files(".py")
    assert len(files) > 100  # the walk found the tree
    found = [
        f"{p.relative_to(ROOT)}:{line}: {name}"
        for p in files
        for line, name in _bare_imports(ast.parse(p.read_text(encoding="utf-8"), str(p)))
    ]
    assert found == []


def test_commands_in_docs_and_code_run_modules_through_evq():
    """`python -m ops.dev.smtp` in a README or a usage line runs the checkout's bare copy (and
    nothing at all once installed); every -m target is `evq.…`."""
    pattern = re.compile(r"-m\s+((?:worker|adapters|ops|migrations)\.[\w.]+)")
    found = [
        f"{p.relative_to(ROOT)}:{n}: {m.group(1)}"
        for p in _files(".py", ".md", ".yml", ".yaml", ".toml", ".ini", ".cfg", "Dockerfile", "run")
        # Its own docstrings show the wrong form; the changelog names the old commands it replaced.
        if p not in (Path(__file__).resolve(), ROOT / "CHANGELOG.md")
        for n, line in enumerate(p.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
        for m in pattern.finditer(line)
        if _is_module(".".join(m.group(1).split(".")[:2]))
    ]
    assert found == []
