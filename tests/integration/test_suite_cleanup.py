"""A test session leaves no database behind on the developer's server, even when a test fails:
not its template, not the test's clone, not the clones made ahead for tests that never came."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support import rows

ROOT = Path(__file__).resolve().parents[2]

FAILING_TEST = """
import os
from pathlib import Path


def test_records_its_template_then_fails(template_db, db_url):
    Path(os.environ["SUITEFIX_OUT"]).write_text(template_db + " " + f"evq_t_{os.getpid()}_")
    assert False, "this session must fail, and still clean up"
"""


def test_a_failed_session_drops_its_template_database(pg_server: str, tmp_path: Path) -> None:
    (tmp_path / "test_inner.py").write_text(FAILING_TEST)
    out = tmp_path / "template.txt"
    env = {**os.environ, "SUITEFIX_OUT": str(out)}
    # Its own session (the same conftest, loaded as a plugin), on the same server.
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "tests.conftest",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            str(tmp_path),
            "-c",
            os.devnull,
            str(tmp_path / "test_inner.py"),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    template, clones = out.read_text().split()
    assert template.startswith("evq_tpl_")
    left = rows(pg_server, "SELECT datname FROM pg_database WHERE datname = %s", (template,))
    assert left == [], f"{template} outlived its session"
    left = rows(pg_server, "SELECT datname FROM pg_database WHERE starts_with(datname, %s)", (clones,))
    assert left == [], f"clones outlived their session: {left}"
