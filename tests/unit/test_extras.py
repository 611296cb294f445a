"""`pip install evq` is the library, the worker and the CLI; every other library is an extra's,
imported only by the code that needs it, and a command whose extra is missing says which one to
install (worker/extras.py). Here the optional libraries are made unimportable in a child
interpreter (as on a bare install); tests/integration/test_wheel.py does it for real from the wheel."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from evq.worker.extras import EXTRAS

# Every library of every extra, as a bare install lacks them.
OPTIONAL = sorted(set().union(*EXTRAS.values()))

BLOCK = f"import sys\nfor name in {OPTIONAL!r}:\n    sys.modules[name] = None\n"


def child(code: str, *, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("EVQ_")} | (env or {})
    return subprocess.run(
        [sys.executable, "-c", BLOCK + code], capture_output=True, text=True, timeout=120, env=environ, check=False
    )


def evq(*argv: str, env: dict[str, str] | None = None) -> tuple[int, dict]:
    done = child(f"from evq.ops.cli import main\nsys.argv = ['evq', *{list(argv)!r}]\nmain()", env=env)
    return done.returncode, json.loads(done.stdout)


def test_the_worker_the_cli_and_the_library_import_no_optional_library():
    done = child(
        "import evq, evq.ops.cli, evq.ops.wiring, evq.worker.runner, evq.adapters.smtp, evq.adapters.null\n"
        "import evq.adapters.postgres.store, evq.adapters.postgres.enqueue, evq.adapters.http.callback\n"
        "import evq.adapters.http.config, evq.adapters.ses.config, evq.adapters.webhooks.config, evq.worker.evidence_log\n"
        "from evq.ops.settings import Settings\n"
        "Settings.load({}).provider_profiles()\n"
        f"print(sorted(n for n in {OPTIONAL!r} if sys.modules.get(n) is not None))"
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("argv", "env", "extra"),
    [
        (("admin", "serve", "-o", "json"), {"EVQ_DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none"}, "serve"),
        (("admin", "mcp", "-o", "json"), {"EVQ_DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none"}, "mcp"),
        (("admin", "demo", "-o", "json"), {}, "dev"),
        (("steps", "list", "-o", "json"), {"EVQ_DATABASE_URL": "embedded"}, "embedded"),
    ],
)
def test_a_command_whose_extra_is_missing_names_it(argv, env, extra):
    code, out = evq(*argv, env=env)
    assert code == 2 and out["error"]["code"] == "E_INVALID_ARG"
    assert out["error"]["hint"] == f"pip install 'evq[{extra}]'"
    assert out["error"]["context"]["fields"] == [{"field": f"evq[{extra}]", "message": out["error"]["message"]}]


def test_no_database_named_is_an_error_that_says_how_to_name_one_and_starts_none(tmp_path):
    code, out = evq("steps", "list", "-o", "json", env={"HOME": str(tmp_path), "XDG_DATA_HOME": str(tmp_path)})
    assert code == 2 and out["error"]["code"] == "E_INVALID_ARG"
    assert out["error"]["context"]["fields"][0]["field"] == "EVQ_DATABASE_URL"
    assert "EVQ_DATABASE_URL=embedded" in out["error"]["hint"] and "evq admin demo" in out["error"]["hint"]
    assert "database" not in out["meta"]  # none was resolved
    assert list(tmp_path.iterdir()) == []  # no embedded server's folder made
