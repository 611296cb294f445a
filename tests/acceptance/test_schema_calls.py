"""The "done when" of the schema contract: a script that reads only `evq schema --all -o json`
builds a correct call for every command, conditional requirements included, and runs it.

:func:`build_call` is that script: it knows nothing about evq but the catalogue. Each call runs
for real against a test database and must not be refused for a missing or unknown parameter;
then each parameter the catalogue made it pass is dropped in turn, and that call must be
refused (so ``required`` and ``required_when`` say no more than is true, and no less).
"""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Mapping
from typing import Any

import pytest

from evq.ops.cli import cli
from tests import contract
from tests.acceptance.conftest import Evq
from tests.contract import leaf_commands
from tests.support import spawn, stop

# Optional parameters this test adds to keep each run short (a drained worker on the null adapter,
# one small benchmark mode, any free port): never a required one, and each is checked to be in the
# catalogue, so every call is still built from it.
SHORT = {
    "worker.run": {"drain": True, "adapter": "null"},
    "admin.bench": {"mode": "ceiling", "steps": 100, "runs": 1, "peer": "off"},
    "admin.serve": {"port": 0},
    "steps.wait": {"timeout": "1s"},  # a pending step and no worker: the wait runs to its timeout
}
# Servers: still running after this long means started, not refused.
SERVERS = {"admin.serve": 8.0}
PATHS = sorted(dict(leaf_commands(cli)))


def value(p: Mapping[str, Any]) -> Any:
    """A valid value for a parameter, from its description alone."""
    if p["type"] == "boolean":
        return True
    if "example" in p:
        return p["example"]
    if p.get("enum"):
        return p["enum"][0]
    if p["type"] in ("integer", "number"):
        return p.get("minimum", 1)
    return "x"


def build_call(tool: Mapping[str, Any], env: Mapping[str, str], secrets: Mapping[str, str]) -> dict[str, Any]:
    """The parameters a call of ``tool`` needs: the required ones, and each conditional one
    whose condition holds (none of ``unless_any`` given, ``unless_env`` not set); a tool that
    needs confirmation is called with --dry-run first. A parameter the caller holds a secret
    for (``env`` named in ``secrets``) is passed through that variable, as the catalogue advises."""
    params = tool["parameters"]
    chosen: dict[str, Any] = {"dry-run": True} if tool["needs_confirmation"] else {}
    changed = True
    while changed:
        changed = False
        for key, p in params.items():
            if key in chosen:
                continue
            cond = p.get("required_when")
            needed = p["required"] or (
                cond is not None
                and not any(other in chosen for other in cond["unless_any"])
                and not env.get(cond.get("unless_env") or "")
            )
            if needed:
                chosen[key] = ("env", secrets[p["env"]]) if p.get("env") in secrets else value(p)
                changed = True
    return chosen


def command_line(tool: Mapping[str, Any], chosen: Mapping[str, Any]) -> tuple[list[str], dict[str, str]]:
    args, env = tool["cli_path"].split(), {}
    for key, p in tool["parameters"].items():  # in the catalogue's order: arguments where they belong
        if key not in chosen:
            continue
        given = chosen[key]
        if isinstance(given, tuple) and given[0] == "env":
            env[p["env"]] = given[1]
        elif p["kind"] == "argument":
            args.append(str(given))
        elif p["kind"] == "flag":
            args.append(p["flags"][-1])
        else:
            args += [p["flags"][-1], str(given)]
    return [*args, "-o", "json"], env


def run(evq: Evq, path: str, args: list[str], env: dict[str, str]) -> tuple[int | None, dict[str, Any] | None]:
    """Its exit code (None: a server still serving) and its one JSON object, if it printed one."""
    # No stdin: `evq admin mcp` reads the protocol there, and ends at its end.
    proc = spawn(
        evq.cmd(*args),
        env={**evq.env, **env},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        out, _ = proc.communicate(timeout=SERVERS.get(path, 120))
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
        code = None
    finally:
        stop(proc)
    body = json.loads(out) if out.strip() else None
    if body is not None:
        contract.check(tuple(args), body)
    return code, body


def refused_for_parameters(code: int | None, body: dict[str, Any] | None) -> bool:
    return code == 2 or bool(body and body["status"] == "error" and body["error"]["code"] == "E_INVALID_ARG")


@pytest.fixture
def catalogue(db_url: str) -> list[dict[str, Any]]:
    data = Evq(db_url).json("schema", "--all")["data"]
    tools = [t for g in data["products"] for t in g["tools"]]
    # A send first, so the commands that read or close one have something to find.
    return sorted(tools, key=lambda t: t["canonical_path"] != "steps.enqueue")


def call_and_check(evq: Evq, tool: Mapping[str, Any], secrets: Mapping[str, str], *, each: bool) -> None:
    """The tool called as the catalogue alone says; with ``each``, also once without each parameter
    it asked for, which must then be refused."""
    path = tool["canonical_path"]
    chosen = build_call(tool, evq.env, secrets)
    for key, given in SHORT.get(path, {}).items():
        assert key in tool["parameters"] and key not in chosen, (path, key)
        chosen[key] = given
    args, env = command_line(tool, chosen)
    code, body = run(evq, path, args, env)
    assert not refused_for_parameters(code, body), (path, args, body)
    assert code != 4, (path, args, body)  # a key was needed and not asked for
    if not each:
        return
    # Each parameter the catalogue asked for is needed: without it, the call is refused.
    for key in chosen:
        if key in SHORT.get(path, {}) or key == "dry-run":
            continue
        fewer, env = command_line(tool, {k: v for k, v in chosen.items() if k != key})
        code, body = run(evq, path, fewer, env)
        if tool["parameters"][key]["property"] is None and tool["parameters"][key].get("env"):
            assert code == 4 and body is not None and body["error"]["code"] == "E_AUTH_FAILED", (path, key)
        else:
            assert refused_for_parameters(code, body), (path, key, fewer, body)


def test_the_catalogue_lists_every_command(catalogue):
    assert sorted(t["canonical_path"] for t in catalogue) == PATHS


# One test per command (parallel workers share them; none runs for minutes on a loaded machine).
@pytest.mark.parametrize("path", PATHS)
def test_a_call_built_from_the_catalogue_alone_runs_for_every_command(path, db_url, admin_key, catalogue):
    evq = Evq(db_url)
    evq.env.pop("EVQ_DEFAULT_FROM", None)  # so the sender's condition is the catalogue's to state
    secrets = {"EVQ_API_KEY": admin_key}
    tools = {t["canonical_path"]: t for t in catalogue}
    if path != "steps.enqueue":
        # A send first, so the commands that read or close one have something to find.
        call_and_check(evq, tools["steps.enqueue"], secrets, each=False)
    call_and_check(evq, tools[path], secrets, each=True)
