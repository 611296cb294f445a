"""The JSON contract: every command run for real, on its success and its error
paths, its output validated against docs/cli-schema/; and `evq schema` derived
from the real command definitions, so it cannot drift from them."""

from __future__ import annotations

import json
import re

import click
import pytest

from evq.adapters.postgres.schema import EVIDENCE_KINDS, ROLES, STATUSES
from evq.ops.app.commands import COMMANDS, GROUPS
from evq.ops.app.schemas import output_schema
from evq.ops.cli import cli
from evq.ops.cli.describe import describe_command
from evq.ops.cli.output import EXIT_CODES
from tests.acceptance.conftest import Evq
from tests.contract import SCHEMA_DIR, command_path, leaf_commands, registry
from tests.support import held_steps, unknown_steps, with_store

NOWHERE = "postgresql://nobody@127.0.0.1:1/nothing"
REQUEST = {
    "run_id": "r-c",
    "step_id": "s1",
    "to": ["a@example.com"],
    "from": "agent@example.org",
    "subject": "Hi",
    "text": "Hello",
    "intent": "contract",
}
LEAVES = dict(leaf_commands(cli))


def test_every_command_has_its_schema_file_and_every_file_a_command():
    files = {p.name for p in SCHEMA_DIR.glob("*.schema.json")} - {"_common.schema.json"}
    assert files == {path.replace(".", "-") + ".schema.json" for path in LEAVES}


@pytest.mark.parametrize("path", list(LEAVES))
def test_each_bundled_output_schema_is_a_valid_self_contained_schema(path):
    from jsonschema import Draft202012Validator

    own = json.loads((SCHEMA_DIR / (path.replace(".", "-") + ".schema.json")).read_text()).get("$defs", {})
    common = json.loads((SCHEMA_DIR / "_common.schema.json").read_text())["$defs"]
    assert not set(own) & set(common)  # folding them together loses nothing
    Draft202012Validator.check_schema(output_schema(path))


def test_schema_enumerations_are_the_models():
    common = json.loads((SCHEMA_DIR / "_common.schema.json").read_text())["$defs"]
    assert common["step_status"]["enum"] == list(STATUSES)
    assert common["evidence_kind"]["enum"] == list(EVIDENCE_KINDS)
    assert common["role"]["enum"] == list(ROLES)
    assert common["error_code"]["enum"] == list(EXIT_CODES)


class Script:
    """Runs commands in child processes and records which (command, outcome) pairs it saw."""

    def __init__(self, db_url: str, empty_db_url: str, admin_key: str):
        self.db_url, self.empty_db_url = db_url, empty_db_url
        self.admin = Evq(db_url, api_key=admin_key, process=True)
        self.anyone, self.nowhere = Evq(db_url, process=True), Evq(NOWHERE, process=True)
        self.seen: set[tuple[str, str]] = set()

    def __call__(self, evq: Evq, *args: str, expect: int = 0, input: str | None = None) -> dict:
        out = evq.json(*args, expect=expect, input=input)
        self.seen.add((command_path(args), "success" if out["status"] != "error" else "error"))
        return out


def _steps_script(run: Script) -> None:
    admin, anyone, nowhere = run.admin, run.anyone, run.nowhere
    [unknown] = with_store(run.db_url, lambda store: unknown_steps(store, run_id="r-u"))
    step = run(admin, "enqueue", "--file", "-", input=json.dumps(REQUEST))["data"]
    run(admin, "enqueue", "--file", "-", "--dry-run", input=json.dumps(REQUEST))
    run(admin, "enqueue", "--file", "-", input=json.dumps({**REQUEST, "text": "other"}), expect=3)
    run(admin, "worker", "run", "--drain", "--adapter", "null")
    run(admin, "worker", "run", "--drain", "--concurrency", "0", expect=2)
    # Through smtp, which the null worker above does not send: still pending at the timeout.
    waited = run(anyone, "steps", "wait", str(step["id"]), "--timeout", "1s")
    assert waited["data"]["step"]["next_action"] == "wait" and waited["meta"]["timed_out"] is True
    run(anyone, "steps", "wait", str(step["id"]), "--timeout", "2h", expect=2)  # at most 60s
    run(anyone, "steps", "list", "--status", "unknown")
    assert run(anyone, "steps", "list", "--search", REQUEST["to"][0])["meta"]["total_exact"] is True
    run(anyone, "steps", "list", "--search", "x" * 321, expect=2)
    run(anyone, "steps", "list", "--older-than", "soon", expect=2)
    run(nowhere, "steps", "list", expect=9)
    run(anyone, "steps", "show", str(step["id"]))
    run(anyone, "steps", "show", "999999", expect=1)
    run(anyone, "steps", "resolve", str(unknown.id), "--as", "accepted", "--note", "seen", "--dry-run")
    run(admin, "steps", "resolve", str(unknown.id), "--as", "accepted", "--note", "seen")
    run(admin, "steps", "resolve", str(unknown.id), "--as", "accepted", "--note", "seen", expect=3)
    run(anyone, "runs", "show", "r-u")
    run(anyone, "runs", "show", "no-such-run", expect=1)
    run(anyone, "prune", "--older-than", "90d", "--dry-run")
    run(anyone, "prune", "--older-than", "90d", expect=4)
    run(admin, "prune", "--older-than", "90d")


def _records_script(run: Script) -> None:
    admin, anyone, nowhere = run.admin, run.anyone, run.nowhere
    [unknown] = with_store(run.db_url, lambda store: unknown_steps(store, run_id="r-u"))
    run(admin, "keys", "create", "--name", "ops", "--role", "operator")
    run(anyone, "keys", "create", "--name", "ops2", "--role", "operator", expect=4)
    run(anyone, "keys", "list")
    run(nowhere, "keys", "list", expect=9)
    run(anyone, "providers", "list")
    run(nowhere, "providers", "list", expect=9)
    run(anyone, "policy", "show")
    run(nowhere, "policy", "show", expect=9)
    run(anyone, "enqueue", "--file", "-", input=json.dumps({**REQUEST, "to": []}), expect=2)  # recorded
    assert run(anyone, "refusals", "list", "--limit", "1")["meta"]["count"] == 1
    run(anyone, "refusals", "list", "--interface", "smtp", expect=2)
    run(admin, "keys", "update", "ops", "--notify-email", "ops-inbox@example.org")
    run(admin, "keys", "update", "ops", "--notify-email", "not an address", expect=2)
    run(admin, "events", "list", "--all-keys")
    run(anyone, "events", "list", expect=4)  # a feed is per key: no key is a missing credential
    run(anyone, "deliveries", "list", "--unmatched")
    run(anyone, "deliveries", "list", "--unmatched", "--step", str(unknown.id), expect=2)
    run(admin, "keys", "revoke", "ops")
    run(admin, "keys", "revoke", "nobody", expect=1)
    run(anyone, "schema")
    run(anyone, "schema", "steps")
    run(anyone, "schema", "steps.resolve")
    run(anyone, "schema", "--all")
    run(anyone, "schema", "no.such", expect=1)


def _database_script(run: Script) -> None:
    admin, anyone, nowhere = run.admin, run.anyone, run.nowhere
    run(admin, "db", "upgrade")
    run(admin, "db", "upgrade", "--dry-run")
    run(nowhere, "db", "upgrade", expect=9)
    run(anyone, "db", "status")
    run(Evq(run.empty_db_url, process=True), "db", "status", expect=5)
    run(anyone, "admin", "health", expect=6)  # no worker runs: partial_failure
    run(nowhere, "admin", "health", expect=9)
    run(anyone, "admin", "health", "--no-such-flag", expect=2)
    run(Evq(run.empty_db_url, process=True), "demo")
    with_store(run.db_url, lambda store: unknown_steps(store, run_id="r-u"))
    run(anyone, "demo", expect=3)  # this database holds steps that are not the demo's
    run(nowhere, "demo", expect=9)


def _approvals_script(run: Script) -> None:
    """The held lifecycle (issue 17): approve (dry run, an agent refused, a correction, twice), deny, cancel."""
    from tests.acceptance.conftest import make_key

    admin, anyone = run.admin, run.anyone
    held = with_store(run.db_url, lambda store: held_steps(store, 3, run_id="r-h"))
    h1, h2, h3 = (str(h.id) for h in held)
    agent = Evq(run.db_url, api_key=make_key(run.db_url, "agent-h", "agent"), process=True)
    run(anyone, "steps", "approve", h1, "--note", "ok", "--dry-run")
    run(agent, "steps", "approve", h1, "--note", "mine", expect=4)  # an agent key never approves
    assert run(admin, "steps", "approve", h1, "--note", "typo", "--subject", "Corrected")["data"]["edited"]
    run(admin, "steps", "approve", h1, "--note", "again", expect=3)  # no longer held
    run(anyone, "steps", "deny", h2, "--note", "no", "--dry-run")
    run(admin, "steps", "deny", h2, "--note", "not to this customer")
    run(admin, "steps", "deny", "999999", "--note", "no", expect=1)
    run(anyone, "steps", "cancel", h3, "--dry-run")
    run(admin, "steps", "cancel", h3, "--note", "not needed")
    run(admin, "steps", "cancel", h3, expect=3)  # already closed


def _processes_script(run: Script) -> None:
    anyone, nowhere = run.anyone, run.nowhere
    run(anyone, "bench", "--mode", "ceiling", "--steps", "100", "--runs", "1", "--peer", "off")
    run(anyone, "bench", "--steps", "1", expect=2)
    run(nowhere, "serve", "--port", "0", expect=9)
    run(nowhere, "mcp", expect=9)
    run.seen.add(("admin.serve", _served_until_sigterm(anyone)["status"]))


# Each script covers its commands' success and error paths; together they cover every leaf.
# They are separate tests so that parallel workers share them and none runs for minutes.
SCRIPTS = {
    "steps": (
        _steps_script,
        {
            "steps.enqueue",
            "steps.list",
            "steps.show",
            "steps.wait",
            "steps.resolve",
            "steps.prune",
            "worker.run",
            "runs.show",
        },
    ),
    "records": (
        _records_script,
        {
            "keys.create",
            "keys.list",
            "keys.update",
            "keys.revoke",
            "providers.list",
            "policy.show",
            "refusals.list",
            "events.list",
            "deliveries.list",
            "schema.show",
        },
    ),
    "approvals": (_approvals_script, {"steps.approve", "steps.deny", "steps.cancel"}),
    "database": (_database_script, {"admin.db-upgrade", "admin.db-version", "admin.health", "admin.demo"}),
    "processes": (_processes_script, {"admin.bench", "admin.serve", "admin.mcp"}),
}


def test_the_scripts_together_cover_every_command_once():
    covered = [path for _, paths in SCRIPTS.values() for path in paths]
    assert sorted(covered) == sorted(LEAVES)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SCRIPTS))
def test_every_command_for_real_success_and_error(name, db_url, empty_db_url, admin_key):
    """Each line runs the real command, each in a child process of its own (the contract is
    about what a process prints and exits with); Evq.json validates every output against its schema."""
    script, paths = SCRIPTS[name]
    run = Script(db_url, empty_db_url, admin_key)
    script(run)
    # `evq admin mcp` prints nothing on success: stdout is the MCP protocol's (tests/web/test_mcp.py speaks it).
    expected = {(path, status) for path in paths for status in ("success", "error")}
    assert {seen for seen in run.seen if seen[0] in paths} == expected - {("admin.mcp", "success")}


def _served_until_sigterm(evq: Evq) -> dict:
    """`evq serve -o json` started, asked once over HTTP, stopped by SIGTERM: its one JSON line."""
    import signal
    import urllib.request

    from tests import contract

    proc = evq.popen("serve", "--port", "0", "-o", "json")
    try:
        for line in proc.stderr:
            if '"serve_listening"' in line:
                port = json.loads(line)["port"]
                break
        else:
            raise AssertionError("evq serve did not start")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as answer:
            assert answer.read() == b"ok\n"
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        proc.kill() if proc.poll() is None else None
    assert proc.returncode == 0
    result = json.loads(out)
    contract.check(("admin", "serve"), result)
    assert result["data"]["port"] == port
    assert result["data"]["host"] == "127.0.0.1"  # no --host, no EVQ_SERVE_HOST: loopback only
    return result


def test_schema_discloses_the_surface_a_level_at_a_time(db_url):
    evq = Evq(db_url)
    root = evq.json("schema")["data"]
    assert evq.json("schema", "list")["data"] == root
    assert root["level"] == "products" and [g["name"] for g in root["products"]] == sorted(GROUPS)
    assert all("tools" not in g for g in root["products"])  # the overview embeds no tool arrays
    assert root["exit_codes"] == {**EXIT_CODES, "interrupted": 130}
    group = evq.json("schema", "steps")["data"]
    assert group["level"] == "product" and group["product_id"] == "steps"
    assert [t["canonical_path"] for t in group["tools"]] == [
        "steps.approve",
        "steps.cancel",
        "steps.deny",
        "steps.enqueue",
        "steps.list",
        "steps.prune",
        "steps.resolve",
        "steps.show",
        "steps.wait",
    ]
    assert group["tool_count"] == 9 and "parameters" not in group["tools"][0]
    one = evq.json("schema", "steps.resolve")["data"]
    assert evq.json("schema", "steps resolve")["data"] == one == evq.json("schema", "steps", "resolve")["data"]
    assert evq.json("schema", "--cli-path", "steps resolve")["data"] == one
    assert one["level"] == "tool" and one["canonical_path"] == "steps.resolve" and one["is_alias"] is False
    assert one["cli_path"] == one["primary_cli_path"] == "steps resolve" and one["aliases"] == []
    assert one["api_key"]["roles"] == ["operator", "admin"] and one["writes"] is True
    assert (one["effect"], one["risk"], one["needs_confirmation"]) == ("write", "high", True)
    assert one["interfaces"]["mcp"] == "evq_steps_resolve"
    assert one["output_schema"] == output_schema("steps.resolve")
    params = one["parameters"]
    assert one["parameter_count"] == len(params) and one["has_parameters"] is True
    assert params["as"] == {**params["as"], "property": "as", "type": "string", "required": True}
    assert params["as"]["enum"] == ["accepted", "rejected", "retry"]
    assert params["STEP_ID"]["kind"] == "argument" and params["STEP_ID"]["type"] == "integer"
    assert params["STEP_ID"]["required"] is False
    assert params["STEP_ID"]["required_when"]["unless_any"] == ["status"]
    assert params["status"]["required_when"]["unless_any"] == ["STEP_ID"]
    assert params["older-than"]["property"] == "older_than"
    assert params["dry-run"]["type"] == "boolean" and "default" not in params["dry-run"]
    assert params["api-key"]["env"] == "EVQ_API_KEY" and params["api-key"]["property"] is None
    assert params["api-key"]["required_when"] == {**params["api-key"]["required_when"], "unless_any": ["dry-run"]}
    worker = evq.json("schema", "worker.run")["data"]["parameters"]
    assert worker["concurrency"] == {
        **worker["concurrency"],
        "type": "integer",
        "default": 10,
        "env": "EVQ_CONCURRENCY",
    }
    assert worker["pooler"]["enum"] == ["auto", "none", "transaction"]
    assert "default" not in worker["smtp-password"]
    # An alias is the same tool, said to be one.
    alias = evq.json("schema", "enqueue")["data"]
    primary = evq.json("schema", "steps.enqueue")["data"]
    assert alias["is_alias"] is True and alias["cli_path"] == "enqueue"
    assert {**alias, "is_alias": False, "cli_path": "steps enqueue"} == primary
    assert primary["aliases"] == ["enqueue"]
    assert primary["parameters"]["to"]["required_when"]["unless_any"] == ["file"]
    assert primary["parameters"]["intent"]["property"] == "intent"
    assert primary["parameters"]["model"]["property"] == "decision.model"
    assert evq.json("schema", "db", "status")["data"]["canonical_path"] == "admin.db-version"
    everything = evq.json("schema", "--all")["data"]
    assert [t["canonical_path"] for g in everything["products"] for t in g["tools"]] == list(LEAVES)
    human = evq.run("schema", "steps.resolve")
    assert human.returncode == 0 and "provider-message-id" in human.stdout
    assert "is an alias of `evq steps enqueue`" in evq.run("schema", "enqueue").stdout
    for args in (("schema",), ("schema", "--all")):  # the exit codes, for people too
        human = evq.run(*args).stdout
        assert "steps" in human and all(re.search(rf"{code}\s+{n}\b", human) for code, n in root["exit_codes"].items())


@pytest.mark.parametrize("path", list(LEAVES))
def test_described_parameters_are_what_the_command_accepts(path):
    """Drift would show here: each described flag, with a value of its described
    type (every enum value), parses in the real command into the parameter the table
    names; a value outside the enum is refused; `--help` shows nothing more."""
    cmd, entry = LEAVES[path], COMMANDS[path]
    described = describe_command(entry)["parameters"]
    dests = {p.key: p.dest for p in entry.params}
    for key, p in described.items():
        samples = p.get("enum") or [{"integer": "3", "number": "2.5", "string": "x"}.get(p["type"])]
        for value in samples:
            args = (
                [p["flags"][0]] if p["kind"] == "flag" else [p["flags"][0], value] if p["kind"] == "option" else [value]
            )
            got = cmd.make_context(path, [*args, *_required_others(described, key)]).params[dests[key]]
            got = got.key if dests[key] == "credential" else got[0] if p["multiple"] else got
            assert got == {"boolean": True, "integer": 3, "number": 2.5}.get(p["type"], value), (path, key)
        if p.get("enum"):
            with pytest.raises(click.BadParameter):
                cmd.make_context(path, [p["flags"][0], "not-a-choice", *_required_others(described, key)])
    help_text = cmd.get_help(click.Context(cmd, info_name=path))
    shown = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]+)", help_text.split("Options:")[-1]))
    assert shown <= {f for p in described.values() for f in p["flags"]} | {"--help"}


def _required_others(described: dict, but: str) -> list[str]:
    args: list[str] = []
    for key, p in described.items():
        if p["required"] and key != but:
            sample = (p.get("enum") or ["1" if p["type"] == "integer" else "x"])[0]
            args += [p["flags"][0], sample] if p["kind"] == "option" else [sample]
    return args


def test_the_bundled_schema_validates_without_the_files(db_url):
    """`evq schema X` hands an agent one self-contained document for X's output."""
    from jsonschema import Draft202012Validator

    out = Evq(db_url).json("steps", "list")
    bundled = Evq(db_url).json("schema", "steps.list")["data"]["output_schema"]
    Draft202012Validator.check_schema(bundled)
    assert not list(Draft202012Validator(bundled).iter_errors(out))
    assert "_common.schema.json" not in json.dumps(bundled)
    assert registry()  # the files themselves resolve too (tests/contract.py)


def test_an_unexpected_failure_is_e_internal_exit_1_with_the_traceback_on_stderr(db_url):
    """A bug (here: a column the query needs is gone) is still one JSON object on stdout, code
    E_INTERNAL and exit 1, with the detail in the log on stderr, never on stdout."""
    from tests.support import execute

    execute(db_url, "ALTER TABLE email_steps RENAME COLUMN held_since TO held_since_gone")
    evq = Evq(db_url)
    out = evq.json("steps", "list", expect=1)
    assert out["error"]["code"] == "E_INTERNAL" and "see the log on stderr" in out["error"]["message"]
    done = evq.run("steps", "list", "-o", "json")
    assert "Traceback" not in done.stdout
    logged = [json.loads(line) for line in done.stderr.splitlines()]
    assert [e["event"] for e in logged] == ["internal_error"] and "UndefinedColumn" in logged[0]["exception"]
    human = evq.run("steps", "list")
    assert human.returncode == 1 and human.stdout == "" and "internal error" in human.stderr
