"""The README's first command: `evq demo`, on a given database and on the embedded default."""

from __future__ import annotations

import os

from tests.acceptance.conftest import Evq

EXPECTED = {
    "welcome": ("accepted", "provider_accepted"),
    "receipt": ("accepted", "provider_accepted"),  # over HTTP
    "team-update": ("accepted", "provider_accepted"),
    "report": ("unknown", "ambiguous_response"),  # SMTP: waits for an operator
    "statement": ("accepted", "reconciled"),  # HTTP: the same loss, settled by the reconciler
    "invite": ("rejected", "provider_rejected"),
    "evq:notice:rejected:invite": ("accepted", "provider_accepted"),  # the notice to invite's sender
}


def check(out: dict) -> None:
    data = out["data"]
    steps = {s["step_id"]: s for s in data["steps"]}
    assert {name: (s["status"], s["reason"]) for name, s in steps.items()} == EXPECTED
    assert steps["statement"]["provider"] == "http" and steps["statement"]["provider_message_id"]
    notice = steps["evq:notice:rejected:invite"]
    assert notice["notice_of"] == steps["invite"]["id"] and notice["to"] == ["assistant@example.org"]
    assert notice["subject"] == "[delivery failed] Invitation"
    assert data["repeat_created"] is False and data["worker_exit"] == 0
    # Everything but the refused invite arrived, once: four over SMTP (the lost reply too), two over HTTP.
    assert len(data["delivered"]) == 6 and set(data["delivered"].values()) == {1}


def test_demo_on_a_database_url(evq: Evq):
    check(evq.json("demo"))
    human = evq.run("demo")
    assert human.returncode == 0 and "UNKNOWN" in human.stdout and "evq steps show" in human.stdout
    assert "reconciler" in human.stdout and "failure notice" in human.stdout


def test_demo_on_the_embedded_database(tmp_path):
    """No EVQ_DATABASE_URL: a machine with only Python gets an embedded PostgreSQL for the demo."""
    evq = Evq("")
    evq.env.pop("EVQ_DATABASE_URL")
    evq.env["EVQ_DATA_DIR"] = str(tmp_path / "evq-data")
    out = evq.json("demo")
    check(out)
    assert out["data"]["database"] == "embedded"
    assert os.path.isdir(tmp_path / "evq-data" / "pgdata")
    # The same embedded database serves the next command that names it: the operator can look at
    # the demo's rows.
    listed = evq.json("steps", "list", "--status", "unknown", EVQ_DATABASE_URL="embedded")
    assert [s["step_id"] for s in listed["data"]] == ["report"]
    assert listed["meta"]["database"]["host"] == str(tmp_path / "evq-data" / "pgdata")
    # A command that names no database opens none (only the demo does): it says how to name one.
    refused = evq.json("steps", "list", expect=2)
    assert refused["error"]["context"]["fields"][0]["field"] == "EVQ_DATABASE_URL"


def test_demo_refuses_a_database_that_holds_other_steps(evq: Evq, db_url):
    """Its worker sends through loopback servers: on someone's real queue it would claim their
    sends and "deliver" them there. It changes nothing and says where to run instead."""
    from tests.support import rows, valid, with_store

    theirs = with_store(db_url, lambda store: store.enqueue(valid(run_id="production", to=["real@example.com"])))
    out = evq.json("demo", expect=3)
    assert out["error"]["code"] == "E_CONFLICT" and "EVQ_DATABASE_URL" in out["error"]["hint"]
    assert out["error"]["context"] == {"foreign_steps": 1}
    assert rows(db_url, "SELECT id, status FROM steps_now") == [{"id": theirs.id, "status": "pending"}]
