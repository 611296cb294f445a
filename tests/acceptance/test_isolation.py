"""A database whose transactions start REPEATABLE READ (failure matrix 15b3): every evq process
refuses at start, before anything listens or works, with the remedy; `evq admin health` says
why; and the remedy it prints, run as printed, makes evq start."""

from __future__ import annotations

import json

import psycopg

from tests.support import rows


def _repeatable_read(db_url: str) -> str:
    name = rows(db_url, "SELECT current_database() AS d")[0]["d"]
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(f"ALTER DATABASE \"{name}\" SET default_transaction_isolation = 'repeatable read'")
    return name


def test_every_process_refuses_and_health_says_why_and_the_printed_remedy_works(evq, db_url):
    name = _repeatable_read(db_url)
    for args in (("serve", "--port", "0"), ("worker", "run"), ("steps", "list")):
        done = evq.run(*args, "-o", "json", timeout=60)
        assert done.returncode == 2, (args, done.returncode, done.stdout, done.stderr[-2000:])
        error = json.loads(done.stdout)["error"]
        assert error["code"] == "E_INVALID_ARG", args
        assert error["message"] == (
            f'evq\'s transactions here start REPEATABLE READ (set by the database ("{name}")); '
            "evq runs only under READ COMMITTED"
        )
        assert "serve_listening" not in done.stderr, args  # refused before it listened
    health = evq.run("admin", "health", "-o", "json")
    assert health.returncode == 9, (health.stdout, health.stderr[-2000:])
    database = json.loads(health.stdout)["data"]["checks"][0]
    assert database["name"] == "database" and not database["ok"]
    assert "REPEATABLE READ" in database["detail"] and "IN DATABASE" in database["detail"]
    # The hint, run as printed: evq's role alone goes back to READ COMMITTED, and the
    # database's default (another application's) stays as it was.
    remedy = json.loads(evq.run("steps", "list", "-o", "json").stdout)["error"]["hint"]
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(remedy)
    assert evq.run("steps", "list", "-o", "json").returncode == 0
    default = rows(
        db_url,
        "SELECT setconfig FROM pg_db_role_setting s JOIN pg_database d ON d.oid = s.setdatabase "
        "WHERE d.datname = %s AND s.setrole = 0",
        (name,),
    )
    assert default == [{"setconfig": ["default_transaction_isolation=repeatable read"]}]
