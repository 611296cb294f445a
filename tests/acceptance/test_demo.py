"""The README's first command: `evq demo`, on a given database and on the embedded default."""

from __future__ import annotations

import os

from tests.acceptance.conftest import Evq

EXPECTED = {
    "welcome": "accepted",
    "receipt": "accepted",
    "team-update": "accepted",
    "report": "unknown",
    "invite": "rejected",
}


def check(out: dict) -> None:
    data = out["data"]
    assert {s["step_id"]: s["status"] for s in data["steps"]} == EXPECTED
    assert data["repeat_created"] is False and data["worker_exit"] == 0
    assert len(data["delivered"]) == 4 and set(data["delivered"].values()) == {1}


def test_demo_on_a_database_url(evq: Evq):
    check(evq.json("demo"))
    human = evq.run("demo")
    assert human.returncode == 0 and "UNKNOWN" in human.stdout and "evq steps show" in human.stdout


def test_demo_on_the_embedded_database(tmp_path):
    """No EVQ_DATABASE_URL: a machine with only Python gets an embedded PostgreSQL."""
    evq = Evq("")
    evq.env.pop("EVQ_DATABASE_URL")
    evq.env["EVQ_DATA_DIR"] = str(tmp_path / "evq-data")
    out = evq.json("demo")
    check(out)
    assert out["data"]["database"] == "embedded"
    assert os.path.isdir(tmp_path / "evq-data" / "pgdata")
    # The same default database serves the next command: the operator can look at the demo's rows.
    listed = evq.json("steps", "list", "--status", "unknown")
    assert [s["step_id"] for s in listed["data"]] == ["report"]
