"""API keys on the command line: bootstrap, roles, revocation, and every write
command refusing a missing, wrong, revoked or under-privileged key while its
--dry-run needs none."""

from __future__ import annotations

import json

import pytest

from tests.acceptance.conftest import Evq, make_key
from tests.support import rows, unknown_steps, with_store

REQUEST = {
    "run_id": "r-auth",
    "step_id": "s1",
    "to": ["a@example.com"],
    "from": "agent@example.org",
    "subject": "Hi",
    "text": "Hello",
}


def counts(db_url: str) -> dict:
    return rows(
        db_url,
        """SELECT (SELECT count(*) FROM steps_now) AS steps, (SELECT count(*) FROM evidence) AS evidence,
                                  (SELECT count(*) FROM api_keys) AS keys,
                                  (SELECT count(*) FROM api_keys WHERE revoked_at IS NOT NULL) AS revoked,
                                  (SELECT count(*) FROM email_steps WHERE status = 'unknown') AS unknown""",
    )[0]


def test_a_fresh_install_bootstraps_an_admin_key_then_needs_it(db_url):
    anyone = Evq(db_url)
    out = anyone.json("keys", "create", "--name", "first", "--role", "operator", expect=4)
    assert "first key must be an admin key" in out["error"]["message"]
    assert anyone.json("keys", "create", "--name", "root", "--role", "admin", "--dry-run")["data"]["bootstrap"] is True
    created = anyone.json("keys", "create", "--name", "root", "--role", "admin")["data"]
    assert (
        created["bootstrap"] is True
        and created["created_by"] is None
        and created["key"].startswith(created["key_prefix"])
    )
    # From now on, managing keys needs that admin key.
    assert (
        anyone.json("keys", "create", "--name", "second", "--role", "admin", expect=4)["error"]["code"]
        == "E_AUTH_FAILED"
    )
    root = Evq(db_url, api_key=created["key"])
    alice = root.json("keys", "create", "--name", "alice", "--role", "operator")["data"]
    assert alice["created_by"] == "root" and alice["bootstrap"] is False
    listed = anyone.json("keys", "list")  # reading needs no key
    assert [(k["name"], k["role"], k["active"]) for k in listed["data"]] == [
        ("root", "admin", True),
        ("alice", "operator", True),
    ]
    assert listed["meta"] == {**listed["meta"], "count": 2, "total": 2, "limit": 100, "offset": 0}
    # The key is printed once and stored only as a hash.
    assert created["key"] not in json.dumps(rows(db_url, "SELECT * FROM api_keys"), default=str)
    assert created["key"] not in anyone.run("keys", "list").stdout
    human = root.run("keys", "create", "--name", "bob", "--role", "agent")
    assert human.returncode == 0 and "shown only now" in human.stdout and "evq_" in human.stdout


def test_roles_and_revocation_on_every_write_command(db_url):
    root_key = make_key(db_url, "root", "admin", created_by=None)
    keys = {role: make_key(db_url, f"k-{role}", role) for role in ("agent", "operator")}
    [step] = with_store(db_url, lambda store: unknown_steps(store))
    enqueue = ("enqueue", "--file", "-")
    resolve = ("steps", "resolve", str(step.id), "--as", "rejected", "--note", "checked")
    create = ("keys", "create", "--name", "new", "--role", "agent")
    revoke = ("keys", "revoke", "k-agent")
    refused = {
        enqueue: [None, "wrong", keys["operator"]],
        resolve: [None, "wrong", keys["agent"]],
        create: [None, "wrong", keys["agent"], keys["operator"]],
        revoke: [None, "wrong", keys["agent"], keys["operator"]],
    }
    before = counts(db_url)
    for args, presented in refused.items():
        for key in presented:
            bad = key if key != "wrong" else keys["agent"][:-6] + "AAAAAA"
            out = Evq(db_url, api_key=bad).json(*args, input=json.dumps(REQUEST), expect=4)
            assert out["error"]["code"] == "E_AUTH_FAILED", (args, key)
            assert bad is None or bad not in json.dumps(out)
        # --dry-run prints the plan with no key at all.
        plan = Evq(db_url).json(*args, "--dry-run", input=json.dumps(REQUEST))
        assert plan["data"]["dry_run"] is True, args
    assert counts(db_url) == before  # nothing changed

    # The flag works as well as the variable, and each role does what it may.
    agent = Evq(db_url)
    assert agent.json(*enqueue, "--api-key", keys["agent"], input=json.dumps(REQUEST))["data"]["created"] is True
    assert Evq(db_url, api_key=keys["operator"]).json(*resolve)["data"]["succeeded"] == 1
    assert rows(db_url, "SELECT actor FROM evidence WHERE kind = 'operator_resolved'") == [{"actor": "k-operator"}]
    root = Evq(db_url, api_key=root_key)
    assert root.json(*revoke)["data"]["changed"] is True
    gone = Evq(db_url, api_key=keys["agent"]).json(*enqueue, input=json.dumps({**REQUEST, "step_id": "s2"}), expect=4)
    assert "revoked" in gone["error"]["message"]
    assert root.json(*revoke)["data"]["changed"] is False  # revoking twice changes nothing
    last = root.json("keys", "revoke", "root", expect=3)
    assert last["error"]["code"] == "E_CONFLICT" and "last active admin" in last["error"]["message"]
    assert Evq(db_url).json("keys", "revoke", "root", "--dry-run", expect=3)["error"]["code"] == "E_CONFLICT"
    assert root.json("keys", "revoke", "nobody", expect=1)["error"]["code"] == "E_NOT_FOUND"
    assert (
        root.json("keys", "create", "--name", "k-agent", "--role", "agent", expect=3)["error"]["code"] == "E_CONFLICT"
    )
    assert (
        root.json("keys", "create", "--name", "bad name!", "--role", "agent", expect=2)["error"]["code"]
        == "E_INVALID_ARG"
    )


@pytest.mark.parametrize("valid", [True, False])
def test_an_api_key_never_reaches_the_output_or_a_log_line(db_url, valid):
    key = make_key(db_url, "bot", "agent", created_by=None)
    key = key if valid else key[:-6] + "AAAAAA"
    done = Evq(db_url, api_key=key, EVQ_LOG_LEVEL="debug").run("enqueue", "--file", "-", input=json.dumps(REQUEST))
    assert done.returncode == (0 if valid else 4), done.stderr[-2000:]
    secret = key[len("evq_") + 13 :]  # after the key id (the secret may hold "_" itself)
    assert secret not in done.stdout and secret not in done.stderr
