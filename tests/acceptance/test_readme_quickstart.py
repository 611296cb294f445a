"""Issue 18's done-when: a newcomer following only the getting-started page the README links reaches a
delivered send on their own PostgreSQL. The shell blocks of docs/getting-started/your-own-postgresql.md
are read FROM the page and run for real, in order, in one bash (set -euo pipefail) in a temp dir: a
fresh database on the test's server, the real dev sink, the real worker with --drain. Only what the
page says is the reader's to choose is replaced (the database's name, the sink's port), and the
server's address when the test's server is not the page's 127.0.0.1:5432. The install block is the
one not run: this evq is installed already. An edit that breaks the quickstart fails here."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.support import free_port, spawn, stop

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "getting-started" / "your-own-postgresql.md"


def quickstart_blocks(page: str) -> list[str]:
    """Every shell block of the page, in order (the README links the page from its "Run it")."""
    return re.findall(r"```sh\n(.*?)\n```", page, flags=re.S)


def _replace_once(script: str, old: str, new: str) -> str:
    assert script.count(old) == 1, f"the quickstart should say {old!r} once"
    return script.replace(old, new)


def quickstart_script(page: str, *, database: str, sink_port: int, server: dict[str, Any]) -> str:
    blocks = quickstart_blocks(page)
    installs = [b for b in blocks if "pip install" in b]
    assert len(installs) == 1 and "python3 -m venv .venv" in installs[0], installs
    script = "\n".join(b for b in blocks if b not in installs)
    script = _replace_once(script, "DB=evq_first\n", f"DB={database}\n")
    script = _replace_once(script, "SINK_PORT=2525\n", f"SINK_PORT={sink_port}\n")
    host, port, user = server.get("host") or "127.0.0.1", server.get("port") or "5432", server.get("user") or "postgres"
    script = _replace_once(script, "-h 127.0.0.1 -U postgres", f"-h {host} -p {port} -U {user}")
    script = _replace_once(script, "postgresql://postgres@127.0.0.1:5432/", f"postgresql://{user}@{host}:{port}/")
    # The trap is the test's, not the page's: a block that fails leaves the background sink
    # running, holding the output pipes open.
    return "set -euo pipefail\ntrap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n" + script + "\n"


def _run(script: str, cwd: Path, server: dict[str, Any]) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EVQ_")}
    env["PYTHONPATH"] = str(ROOT)  # `evq` and `python3 -m evq...` run this checkout
    if server.get("password"):
        env["PGPASSWORD"] = server["password"]
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["EVQ_LOG_FORMAT"] = "json"
    # Its own session, so the sink it starts in the background is stopped with it, whatever happens.
    proc = spawn(
        ["bash", "-c", script],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        out, err = "", "timed out"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
        else:
            # The sink is killed by the script's last block; if a block failed before it, it still runs.
            with _suppress():
                os.killpg(proc.pid, 15)
        stop(proc)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


class _suppress:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return exc[0] is ProcessLookupError or exc[0] is PermissionError


@pytest.fixture
def fresh_name(pg_server: str):
    name = f"evq_e_quick_{os.getpid()}_{free_port()}"  # not created: the page's createdb does that
    yield name
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_the_quickstart_delivers_one_send_on_your_own_postgresql(pg_server, fresh_name, tmp_path):
    server = psycopg.conninfo.conninfo_to_dict(pg_server)
    page = PAGE.read_text()
    script = quickstart_script(page, database=fresh_name, sink_port=free_port(), server=server)
    done = _run(script, tmp_path, server)
    assert done.returncode == 0, (done.returncode, done.stdout[-3000:], done.stderr[-3000:])

    # The request the page shows, in full, is the one that was sent.
    request = json.loads((tmp_path / "request.json").read_text())
    received = [line for line in (tmp_path / "sink.log").read_text().splitlines() if line.startswith("received ")]
    assert len(received) == 1, received
    assert f"from {request['from']} to ada@example.com" in received[0]

    url = psycopg.conninfo.make_conninfo(pg_server, dbname=fresh_name)
    with psycopg.connect(url) as conn:
        steps = conn.execute("SELECT run_id, step_id, status, message_id FROM steps_now").fetchall()
        keys = conn.execute("SELECT name, role FROM api_keys WHERE revoked_at IS NULL ORDER BY name").fetchall()
    assert steps == [(request["run_id"], request["step_id"], "accepted", steps[0][3])]
    assert steps[0][3] in received[0]  # the sink got this step's Message-ID
    assert keys == [("admin", "admin"), ("agent", "agent"), ("operator", "operator")]
    # What `evq steps list` printed: the step, accepted.
    [row] = [line for line in done.stdout.splitlines() if line.startswith("1 ") and "welcome" in line]
    assert "accepted" in row.split() and "welcome" in row.split(), done.stdout
    assert "drained: 1 claimed, 1 accepted" in done.stdout


def test_without_the_workers_sink_settings_the_quickstart_fails_and_says_which_to_set(pg_server, fresh_name, tmp_path):
    """The test above is a proof only if a broken quickstart fails it: the same script without the
    line that points the worker at the sink stops at the worker, exit 6, naming the settings."""
    server = psycopg.conninfo.conninfo_to_dict(pg_server)
    page = PAGE.read_text()
    script = quickstart_script(page, database=fresh_name, sink_port=free_port(), server=server)
    script = _replace_once(script, "export EVQ_SMTP_HOST=127.0.0.1 EVQ_SMTP_PORT=$SINK_PORT\n", "")
    # Where nothing listens, whatever this machine has on port 25.
    script = script.replace("evq worker run --drain", f"EVQ_SMTP_PORT={free_port()} evq worker run --drain")
    done = _run(script, tmp_path, server)
    assert done.returncode == 6, (done.returncode, done.stdout[-3000:], done.stderr[-3000:])
    assert "every attempt failed" in done.stdout and "set EVQ_SMTP_HOST/EVQ_SMTP_PORT" in done.stdout


def test_the_readme_sends_a_newcomer_to_this_quickstart():
    """The page the tests above run is the one the README's "Run it" links, from the repository root."""
    readme = (ROOT / "README.md").read_text()
    run_it = readme[readme.index("## Run it\n") : readme.index("\n## ", readme.index("## Run it\n") + 1)]
    assert "](docs/getting-started/your-own-postgresql.md)" in run_it
    assert len(quickstart_blocks(PAGE.read_text())) >= 5
