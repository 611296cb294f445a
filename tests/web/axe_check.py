"""axe-core inside a page Selenium drives: the pinned npm package in tests/web/axe/, installed
with `npm ci` (by .ci/run; locally by the first test that needs it), injected into each page and
run there. Under CI a missing axe-core fails; elsewhere, with no npm either, the test skips."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest

AXE_DIR = Path(__file__).resolve().parent / "axe"
AXE_JS = AXE_DIR / "node_modules" / "axe-core" / "axe.min.js"
# The impacts that fail a page (axe's scale: minor, moderate, serious, critical).
FAILING = ("serious", "critical")

_installed: dict[str, str] = {}
_lock = threading.Lock()


def axe_source() -> str:
    """axe.min.js's text, installing the pinned package once per session when npm is there."""
    with _lock, open(AXE_DIR / ".install.lock", "w") as held:
        if "js" in _installed:
            return _installed["js"]
        # Each xdist worker is a process of its own: two running npm ci into one directory at
        # once tear each other's files out (TAR_ENTRY_ERROR), so the install is theirs in turn.
        fcntl.flock(held, fcntl.LOCK_EX)
        if not AXE_JS.exists():
            npm = shutil.which("npm")
            if npm is None:
                if os.environ.get("CI") == "true":
                    pytest.fail(
                        "axe-core is not installed: .ci/run runs `npm ci --prefix tests/web/axe`", pytrace=False
                    )
                pytest.skip("axe-core is not installed and npm is missing; under CI this fails instead")
            # npm ci installs exactly the lock file's version, so every machine checks with the same rules.
            done = subprocess.run(
                [npm, "ci", "--no-audit", "--no-fund", "--prefix", str(AXE_DIR)],
                capture_output=True,
                text=True,
                timeout=300,
            )
            if done.returncode != 0 or not AXE_JS.exists():
                pytest.fail(f"npm ci in {AXE_DIR} failed: {done.stderr[-2000:]}", pytrace=False)
        _installed["js"] = AXE_JS.read_text(encoding="utf-8")
        return _installed["js"]


def run_axe(driver: Any) -> dict[str, Any]:
    """axe.run on the whole page as it is now, its full results. axe is injected anew because each
    navigation drops it; it runs in the page's own context (WebDriver's script injection)."""
    driver.execute_script(axe_source())
    results = driver.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "axe.run(document, {resultTypes: ['violations', 'incomplete', 'passes']})"
        ".then(r => done(JSON.parse(JSON.stringify(r))), e => done({error: String(e)}));"
    )
    assert isinstance(results, dict) and "error" not in results, results
    # A run that checked nothing would pass every page: axe ran only if rules passed.
    assert results["passes"], "axe-core ran no rule on the page"
    return results


def failing(results: dict[str, Any]) -> list[str]:
    """One line per serious or critical violation: rule, impact, where, and axe's help page."""
    return [
        f"{v['id']} ({v['impact']}): {', '.join(' '.join(n['target']) for n in v['nodes'])} — {v['help']} {v['helpUrl']}"
        for v in results["violations"]
        if v["impact"] in FAILING
    ]


def write(results: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1), encoding="utf-8")


def report(pages: dict[str, dict[str, Any]], path: Path) -> None:
    """The summary: each page checked, its violations by impact, and every finding at all."""
    lines = [
        "# axe-core on the ops page",
        "",
        f"axe-core {next(iter(pages.values()))['testEngine']['version'] if pages else '?'}; "
        f"a {' or '.join(FAILING)} violation fails the test.",
        "",
        "| page | passes | violations (impact) | incomplete |",
        "| --- | --- | --- | --- |",
    ]
    for name, r in pages.items():
        found = ", ".join(f"{v['id']} ({v['impact']})" for v in r["violations"]) or "none"
        lines.append(f"| {name} | {len(r['passes'])} | {found} | {len(r['incomplete'])} |")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
