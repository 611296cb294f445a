#!/usr/bin/env python3
"""`lint-imports` (the contracts: [tool.importlinter] in pyproject.toml) over this checkout,
laid out as the wheel installs it.

Plain `lint-imports` finds a package's modules in the folders its import spec names. In a
checkout that is only evq/: worker/, adapters/, ops/ and migrations/ become evq.worker and so
on when evq/__init__.py runs and adds the repository root to evq.__path__ (and the root also
holds tests/, docs/...). So this script gives evq a path of evq/ plus a scratch folder that
links each mapped folder under its package name ([tool.setuptools.package-dir]), which is
the installed tree exactly, and then runs lint-imports (arguments pass through).
"""

from __future__ import annotations

import os
import sys
import tempfile
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> None:
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        mapping = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
    os.chdir(ROOT)
    sys.path.insert(0, ROOT)
    import evq

    with tempfile.TemporaryDirectory(prefix="evq-lint-imports-") as tree:
        for package, folder in mapping.items():
            if package.count(".") == 1:  # evq.worker -> worker/
                os.symlink(os.path.join(ROOT, folder), os.path.join(tree, package.split(".")[1]))
        evq.__path__[:] = [os.path.join(ROOT, mapping["evq"]), tree]
        from importlinter.cli import lint_imports_command

        # No cache: it would be written into the checkout, and the graph takes a second to build.
        lint_imports_command(["--no-cache", *sys.argv[1:]])


if __name__ == "__main__":
    main()
