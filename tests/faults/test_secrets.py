"""No secret in logs, evidence, error messages or `-o json` output (DESIGN invariant 7).

A whole run — enqueue, a send that authenticates, a send whose login is refused, a
lost reply, reading back — with known secrets, then every log line, every output and
every row of every table is scanned for them.
"""

from __future__ import annotations

import json

import psycopg

from ops.devhttp import DevHttpServer
from ops.devsmtp import DevSmtpServer
from tests.acceptance.conftest import Evq, smtp_env
from tests.support import rows

SMTP_PASSWORD = "smtp-Secret-Pa55word-7f3a"
HTTP_API_KEY = "re_http-Secret-Key-5d19e0"
DB_PASSWORD = "db-Secret-Pa55word-91c2"


def _with_password(url: str, password: str) -> str:
    info = psycopg.conninfo.conninfo_to_dict(url)
    info["password"] = password  # trust authentication accepts it and ignores it
    return psycopg.conninfo.make_conninfo(**info)


def _all_rows_text(url: str) -> str:
    tables = [r["tablename"] for r in rows(url, "SELECT tablename FROM pg_tables WHERE schemaname = 'public'")]
    return "\n".join(
        json.dumps(r) for t in tables for r in rows(url, f'SELECT row_to_json(x)::text AS j FROM "{t}" x')
    )


def test_no_secret_anywhere_after_a_whole_run(db_url, admin_key):
    url = _with_password(db_url, DB_PASSWORD)
    outputs: list[str] = []
    with DevSmtpServer(auth=("evq", SMTP_PASSWORD)) as good, DevSmtpServer(auth=("evq", "another-one")) as bad:
        evq = Evq(url, api_key=admin_key)
        for step, to in (("ok", "ok@example.com"), ("lost", "lose-reply@example.com")):
            request = {"run_id": "secrets", "step_id": step, "to": [to], "from": "a@example.org",
                       "subject": step, "text": "t"}
            done = evq.run("enqueue", "--file", "-", "-o", "json", input=json.dumps(request))
            outputs += [done.stdout, done.stderr]
        env = smtp_env(good, EVQ_SMTP_USERNAME="evq", EVQ_SMTP_PASSWORD=SMTP_PASSWORD, EVQ_LOG_LEVEL="debug")
        done = evq.run("worker", "run", "--drain", "-o", "json", **env)
        outputs += [done.stdout, done.stderr]
        assert done.returncode == 0
        # The same password against a server that refuses it: the error path.
        request = {"run_id": "secrets", "step_id": "refused-login", "to": ["ok@example.com"], "from": "a@example.org",
                   "subject": "s", "text": "t"}
        outputs.append(evq.run("enqueue", "--file", "-", input=json.dumps(request)).stdout)
        env = smtp_env(bad, EVQ_SMTP_USERNAME="evq", EVQ_SMTP_PASSWORD=SMTP_PASSWORD, EVQ_LOG_LEVEL="debug",
                       EVQ_MAX_ATTEMPTS="1")
        done = evq.run("worker", "run", "--drain", **env)
        outputs += [done.stdout, done.stderr]
        for args in (("steps", "list"), ("steps", "list", "-o", "json"), ("steps", "show", "1", "-o", "json"),
                     ("steps", "show", "3", "-o", "json"), ("worker", "run", "--concurrency", "x", "-o", "json")):
            done = evq.run(*args, **env)
            outputs += [done.stdout, done.stderr]
        # Through the HTTP provider too: an accepted send, a lost reply, a refused key.
        with DevHttpServer(api_key=HTTP_API_KEY) as api, DevHttpServer(api_key="not-the-one") as wrong:
            for step, to, server in (("http-ok", "ok@example.com", api), ("http-lost", "lose-reply@example.com", api),
                                     ("http-refused-key", "ok@example.com", wrong)):
                request = {"run_id": "secrets", "step_id": step, "to": [to], "from": "a@example.org",
                           "subject": step, "text": "t", "provider": "http"}
                outputs.append(evq.run("enqueue", "--file", "-", "-o", "json", input=json.dumps(request)).stdout)
                http_env = {"EVQ_ADAPTER": "http", "EVQ_HTTP_BASE_URL": server.url, "EVQ_HTTP_API_KEY": HTTP_API_KEY,
                            "EVQ_HTTP_TIMEOUT": "2", "EVQ_LEASE_SECONDS": "8", "EVQ_MAX_ATTEMPTS": "1",
                            "EVQ_RETRY_BASE": "0", "EVQ_RETRY_MAX": "0", "EVQ_LOG_LEVEL": "debug"}
                done = evq.run("worker", "run", "--drain", **http_env)
                outputs += [done.stdout, done.stderr]
            assert api.messages, "the HTTP send went through"
        # A bad URL's error message must not echo the password either.
        done = Evq(_with_password(db_url.replace("port=5432", "port=1"), DB_PASSWORD)).run("steps", "list", "-o", "json")
        outputs += [done.stdout, done.stderr]
        assert good.messages, "the authenticated send went through"
    everything = "\n".join(outputs) + _all_rows_text(db_url)
    assert "smtp authentication failed" in everything  # the refused login is on record...
    # The API key's secret part is never stored or echoed either (only its salted hash is kept).
    for secret in (SMTP_PASSWORD, HTTP_API_KEY, DB_PASSWORD, admin_key, admin_key.rsplit("_", 1)[1]):
        assert secret not in everything  # ...but no secret is, anywhere
    import base64

    for blob in (SMTP_PASSWORD.encode(), b"\0evq\0" + SMTP_PASSWORD.encode()):
        assert base64.b64encode(blob).decode() not in everything
