"""No secret in logs, evidence, error messages or `-o json` output (docs/design.md, "Invariants", 7).

A whole run — enqueue, a send that authenticates, a send whose login is refused, a
lost reply, reading back — with known secrets, then every log line, every output and
every row of every table is scanned for them.
"""

from __future__ import annotations

import json

import psycopg
import pytest

from evq.ops.dev.http import DevHttpServer
from evq.ops.dev.smtp import DevSmtpServer
from evq.worker.keys import split_key
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
    return "\n".join(json.dumps(r) for t in tables for r in rows(url, f'SELECT row_to_json(x)::text AS j FROM "{t}" x'))


@pytest.mark.slow
def test_no_secret_anywhere_after_a_whole_run(db_url, admin_key):
    url = _with_password(db_url, DB_PASSWORD)
    outputs: list[str] = []
    with DevSmtpServer(auth=("evq", SMTP_PASSWORD)) as good, DevSmtpServer(auth=("evq", "another-one")) as bad:
        evq = Evq(url, api_key=admin_key)
        for step, to in (("ok", "ok@example.com"), ("lost", "lose-reply@example.com")):
            request = {
                "run_id": "secrets",
                "step_id": step,
                "to": [to],
                "from": "a@example.org",
                "subject": step,
                "text": "t",
            }
            done = evq.run("enqueue", "--file", "-", "-o", "json", input=json.dumps(request))
            outputs += [done.stdout, done.stderr]
        # The loopback test server has no TLS: plain AUTH must be allowed explicitly.
        env = smtp_env(
            good,
            EVQ_SMTP_USERNAME="evq",
            EVQ_SMTP_PASSWORD=SMTP_PASSWORD,
            EVQ_LOG_LEVEL="debug",
            EVQ_SMTP_ALLOW_PLAIN_AUTH="true",
        )
        done = evq.run("worker", "run", "--drain", "-o", "json", **env)
        outputs += [done.stdout, done.stderr]
        assert done.returncode == 0
        # The same password against a server that refuses it: the error path.
        request = {
            "run_id": "secrets",
            "step_id": "refused-login",
            "to": ["ok@example.com"],
            "from": "a@example.org",
            "subject": "s",
            "text": "t",
        }
        outputs.append(evq.run("enqueue", "--file", "-", input=json.dumps(request)).stdout)
        env = smtp_env(
            bad,
            EVQ_SMTP_USERNAME="evq",
            EVQ_SMTP_PASSWORD=SMTP_PASSWORD,
            EVQ_LOG_LEVEL="debug",
            EVQ_MAX_ATTEMPTS="1",
            EVQ_SMTP_ALLOW_PLAIN_AUTH="true",
        )
        done = evq.run("worker", "run", "--drain", **env)
        outputs += [done.stdout, done.stderr]
        for args in (
            ("steps", "list"),
            ("steps", "list", "-o", "json"),
            ("steps", "show", "1", "-o", "json"),
            ("steps", "show", "3", "-o", "json"),
            ("worker", "run", "--concurrency", "x", "-o", "json"),
        ):
            done = evq.run(*args, **env)
            outputs += [done.stdout, done.stderr]
        # Through the HTTP provider too: an accepted send, a lost reply, a refused key.
        with DevHttpServer(api_key=HTTP_API_KEY) as api, DevHttpServer(api_key="not-the-one") as wrong:
            for step, to, server in (
                ("http-ok", "ok@example.com", api),
                ("http-lost", "lose-reply@example.com", api),
                ("http-refused-key", "ok@example.com", wrong),
            ):
                request = {
                    "run_id": "secrets",
                    "step_id": step,
                    "to": [to],
                    "from": "a@example.org",
                    "subject": step,
                    "text": "t",
                    "provider": "http",
                }
                outputs.append(evq.run("enqueue", "--file", "-", "-o", "json", input=json.dumps(request)).stdout)
                http_env = {
                    "EVQ_ADAPTER": "http",
                    "EVQ_HTTP_BASE_URL": server.url,
                    "EVQ_HTTP_API_KEY": HTTP_API_KEY,
                    "EVQ_HTTP_TIMEOUT": "2",
                    "EVQ_LEASE_SECONDS": "8",
                    "EVQ_MAX_ATTEMPTS": "1",
                    "EVQ_RETRY_BASE": "0",
                    "EVQ_RETRY_MAX": "0",
                    "EVQ_LOG_LEVEL": "debug",
                }
                done = evq.run("worker", "run", "--drain", **http_env)
                outputs += [done.stdout, done.stderr]
            assert api.messages, "the HTTP send went through"
        # A bad URL's error message must not echo the password either.
        done = Evq(_with_password(db_url.replace("port=5432", "port=1"), DB_PASSWORD)).run(
            "steps", "list", "-o", "json"
        )
        outputs += [done.stdout, done.stderr]
        assert good.messages, "the authenticated send went through"
    everything = "\n".join(outputs) + _all_rows_text(db_url)
    assert "smtp authentication failed" in everything  # the refused login is on record...
    # The API key's secret part is never stored or echoed either (only its salted hash is kept).
    # (The secret follows the key id's underscore and may hold underscores itself: split_key, not rsplit.)
    for secret in (SMTP_PASSWORD, HTTP_API_KEY, DB_PASSWORD, admin_key, split_key(admin_key)[1]):
        assert secret not in everything  # ...but no secret is, anywhere
    import base64

    for blob in (SMTP_PASSWORD.encode(), b"\0evq\0" + SMTP_PASSWORD.encode()):
        assert base64.b64encode(blob).decode() not in everything


def test_no_api_key_in_what_evq_serve_logs_or_answers(db_url, admin_key):
    """`evq serve` at debug level, used with a good key, a wrong one, a key pasted where it does not
    belong (a query parameter, a body field, the page's sign-in form): no answer and no log line
    holds the key or its secret part."""
    import re

    import httpx

    from tests.acceptance.conftest import make_key
    from tests.support import serve_process

    operator = make_key(db_url, "alice", "operator")
    answers: list[str] = []

    def keep(response: httpx.Response) -> httpx.Response:
        answers.append(f"{response.status_code} {dict(response.headers)} {response.text}")
        return response

    with serve_process(db_url, EVQ_LOG_LEVEL="debug") as served:
        with httpx.Client(base_url=served.url, timeout=30) as web:
            request = {
                "run_id": "secrets",
                "step_id": "http",
                "to": ["ok@example.com"],
                "from": "a@example.org",
                "subject": "s",
                "text": "t",
            }
            for key in (admin_key, admin_key + "x", admin_key[:-1], "evq_000000000000_" + admin_key[-43:]):
                auth = {"Authorization": f"Bearer {key}"}
                keep(web.post("/v1/steps", json=request, headers=auth))
                keep(web.get("/v1/steps", params={"api_key": key}, headers=auth))
                keep(web.post("/v1/steps", json={**request, "api_key": key}, headers=auth))
                keep(web.get("/v1/steps/1", headers={"Authorization": key}))  # no scheme
            for key in (operator + "x", operator):
                login = keep(web.get("/ops/login"))
                csrf = re.search(r'name="csrf" value="([^"]+)"', login.text)[1]
                keep(web.post("/ops/login", data={"csrf": csrf, "key": key}))
            keep(web.get("/ops"))
    err = served.stderr
    assert "serve_listening" in err, err[-2000:]  # its log was captured
    everything = "\n".join(answers) + err
    assert "E_AUTH_FAILED" in everything and "201" in everything  # both paths were taken
    for key in (admin_key, operator):
        for secret in (key, split_key(key)[1], split_key(key)[1][:-1]):
            assert secret not in everything


ECHOED_KEY = "re_echo+Secret/Key=7c41aa"


class _EchoingProvider:
    """A real HTTP provider on loopback that refuses every send with 401 and echoes the
    Authorization header back in its error, in the encodings real servers use (raw,
    base64 as in Basic auth, URL-encoded, JSON-escaped with ``\\/``). It accepts the
    failure notices (subject ``[delivery ...``) so their body can be read."""

    def __init__(self) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.notices: list[dict] = []
        self.refused = 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep the test's stderr for evq
                pass

            def do_POST(self):
                import base64
                from urllib.parse import quote

                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if str(body.get("subject", "")).startswith("[delivery"):
                    owner.notices.append(body)
                    self._answer(200, json.dumps({"id": f"notice-{len(owner.notices)}"}))
                    return
                owner.refused += 1
                auth = self.headers["Authorization"]
                key = auth.split(" ", 1)[1]
                # Hand-written JSON: PHP-style "\/" escaping, so the raw body never holds the key as sent.
                message = json.dumps(f"bad credentials: {auth}").replace("/", "\\/")
                text = (
                    f'{{"statusCode": 401, "name": "invalid_api_key", "message": {message}, '
                    f'"basic": "{base64.b64encode((":" + key).encode()).decode()}", '
                    f'"header_b64": "{base64.b64encode(auth.encode()).decode()}", '
                    f'"url": "https://api.example/keys?k={quote(key, safe="")}"}}'
                )
                self._answer(401, text)

            def _answer(self, code: int, text: str) -> None:
                data = text.encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> _EchoingProvider:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


def _key_forms(key: str) -> list[str]:
    import base64
    from urllib.parse import quote

    return [
        key,
        key.replace("/", "\\/"),
        quote(key, safe=""),
        base64.b64encode((":" + key).encode()).decode(),
        base64.b64encode(f"Bearer {key}".encode()).decode(),
        base64.b64encode(key.encode()).decode(),
    ]


def test_a_provider_echoing_its_key_leaks_it_nowhere(db_url, admin_key, tmp_path):
    """Issue 13: a provider that echoes the Authorization header in its 401 put the key in the step's
    reason, -o json, /v1/steps/ID, the ops page and the failure notice. Every copy is searched for:
    a pg_dump of the database, every CLI output, the HTTP API, the ops page HTML, the notice the
    provider received, and every log line."""
    import re
    import subprocess

    from tests.acceptance.conftest import make_key
    from tests.web.support import serving

    evq = Evq(db_url, api_key=admin_key)
    outputs: list[str] = []
    with _EchoingProvider() as provider:
        request = {
            "run_id": "echo",
            "step_id": "s1",
            "to": ["ok@example.com"],
            "from": "a@example.org",
            "subject": "hello",
            "text": "t",
            "provider": "http",
            "notify": "owner@example.org",
        }
        done = evq.run("enqueue", "--file", "-", "-o", "json", input=json.dumps(request))
        assert done.returncode == 0, done.stderr[-2000:]
        env = {
            "EVQ_ADAPTER": "http",
            "EVQ_HTTP_BASE_URL": provider.url,
            "EVQ_HTTP_API_KEY": ECHOED_KEY,
            "EVQ_HTTP_TIMEOUT": "5",
            "EVQ_MAX_ATTEMPTS": "1",
            "EVQ_LOG_LEVEL": "debug",
            # A 401 would open the provider's circuit and cost the step nothing (issue 12); here
            # it must end the step so the refusal reaches every output and the failure notice.
            "EVQ_CIRCUIT_FAULTS": "none",
            "EVQ_CIRCUIT_FAILURES": "0",
        }
        for _ in range(2):  # the refusal, then the notice it owes
            done = evq.run("worker", "run", "--drain", "-o", "json", **env)
            outputs += [done.stdout, done.stderr]
            assert done.returncode == 0, done.stderr[-2000:]
        assert provider.refused == 1 and len(provider.notices) == 1, (provider.refused, provider.notices)
        outputs.append(json.dumps(provider.notices))
    for args in (("steps", "list"), ("steps", "show", "1"), ("runs", "show", "echo")):
        outputs.append(json.dumps(evq.json(*args)))
        done = evq.run(*args)
        outputs += [done.stdout, done.stderr]
    operator = make_key(db_url, "olga", "operator")
    with serving(db_url) as served:
        api = served.client(admin_key)
        outputs.append(api.get("/v1/steps/1").text)
        outputs.append(api.get("/v1/runs/echo").text)
        web = served.client()
        login = web.get("/ops/login")
        csrf = re.search(r'name="csrf" value="([^"]+)"', login.text)[1]
        assert web.post("/ops/login", data={"csrf": csrf, "key": operator}).status_code == 303
        page = web.get("/ops/steps/1")
        assert page.status_code == 200
        outputs.append(page.text)
    info = psycopg.conninfo.conninfo_to_dict(db_url)
    dump = subprocess.run(
        ["/usr/lib/postgresql/15/bin/pg_dump", "--data-only", "-d", db_url], capture_output=True, text=True, timeout=120
    )
    assert dump.returncode == 0, (info.get("dbname"), dump.stderr)
    everything = "\n".join(outputs) + dump.stdout
    # The refusal itself is on record, everywhere it should be...
    assert "invalid_api_key" in dump.stdout and "invalid_api_key" in page.text
    assert "invalid_api_key" in provider.notices[0]["text"] or "401" in provider.notices[0]["text"]
    # ...but not the key, in any of the forms the provider sent it back in.
    for form in _key_forms(ECHOED_KEY):
        assert form not in everything, form


def test_a_provider_echoing_its_key_leaks_it_nowhere_when_its_circuit_opens(db_url, admin_key):
    """The 401 opens the provider's circuit (issue 12): its answer becomes the circuit's reason, in
    provider_circuits, provider_circuit_events, `evq providers list`, the ops page and the log;
    the key is in none of them, in any form."""
    import subprocess

    evq = Evq(db_url, api_key=admin_key)
    outputs: list[str] = []
    with _EchoingProvider() as provider:
        request = {
            "run_id": "echo",
            "step_id": "s1",
            "to": ["ok@example.com"],
            "from": "a@example.org",
            "subject": "hello",
            "text": "t",
            "provider": "http",
        }
        assert evq.run("enqueue", "--file", "-", "-o", "json", input=json.dumps(request)).returncode == 0
        env = {
            "EVQ_ADAPTER": "http",
            "EVQ_HTTP_BASE_URL": provider.url,
            "EVQ_HTTP_API_KEY": ECHOED_KEY,
            "EVQ_HTTP_TIMEOUT": "5",
            "EVQ_LOG_LEVEL": "debug",
        }
        done = evq.run("worker", "run", "--drain", "-o", "json", **env)  # drained: held by the open circuit
        outputs += [done.stdout, done.stderr]
        # Exit 6: every attempt failed (the provider refused the key), said in the drain's summary.
        assert done.returncode == 6 and provider.refused == 1, done.stderr[-2000:]
    listed = evq.json("providers", "list")
    outputs.append(json.dumps(listed))
    http = next(p for p in listed["data"] if p["provider"] == "http")
    assert http["state"] == "open" and http["reason"] == "auth_failed" and "invalid_api_key" in http["detail"]
    outputs += [evq.run("providers", "list").stdout]
    from tests.web.support import serving

    with serving(db_url) as served:
        outputs.append(served.client(admin_key).get("/v1/steps/1").text)
    dump = subprocess.run(
        ["/usr/lib/postgresql/15/bin/pg_dump", "--data-only", "-d", db_url], capture_output=True, text=True, timeout=120
    )
    assert dump.returncode == 0, dump.stderr
    assert "auth_failed" in dump.stdout
    everything = "\n".join(outputs) + dump.stdout
    for form in _key_forms(ECHOED_KEY):
        assert form not in everything, form


URL_PASSWORD = "url-Secret-Pa55word-3e8b"


def _bad_urls(db_url: str) -> list[tuple[str, str]]:
    info = psycopg.conninfo.conninfo_to_dict(db_url)
    host, port, dbname = info.get("host", "127.0.0.1"), info.get("port", "5432"), info["dbname"]
    return [
        # Not libpq's spelling: accepted once normalised (trust auth ignores the password).
        (f"postgresql+psycopg://postgres:{URL_PASSWORD}@{host}:{port}/{dbname}", "ok"),
        (f"postgresq://postgres:{URL_PASSWORD}@{host}:{port}/{dbname}", "E_INVALID_ARG"),  # a typo
        (f"host={host} port={port} password={URL_PASSWORD} dbname", "E_INVALID_ARG"),  # a broken key=value
        (f"postgresql://postgres:{URL_PASSWORD}@{host}:{port}/no_such_db_here", "E_DB_UNAVAILABLE"),
    ]


def test_a_database_url_that_cannot_be_used_fails_fast_and_never_shows_its_password(db_url):
    """Issue 13: an unparseable URL printed its password four times on stderr (psycopg_pool's own
    logging) and failed only after 15 s. Now: refused at once, password nowhere, a clear code."""
    import time

    for url, expect in _bad_urls(db_url):
        for args in (("steps", "list", "-o", "json"), ("worker", "run", "--drain", "-o", "json")):
            started = time.monotonic()
            done = Evq(url).run(*args, EVQ_ADAPTER="null", EVQ_LOG_LEVEL="debug", timeout=60)
            elapsed = time.monotonic() - started
            assert URL_PASSWORD not in done.stdout + done.stderr, (url, args, done.stdout, done.stderr[-2000:])
            # A generous bound (the interpreter's start on a loaded machine), far below the old 15 s wait.
            assert elapsed < 8, (url, args, elapsed)
            out = json.loads(done.stdout)
            if expect == "ok":
                assert done.returncode == 0 and out["status"] == "success", (url, done.stdout, done.stderr[-2000:])
            else:
                assert out["status"] == "error" and out["error"]["code"] == expect, (url, out)
                assert "EVQ_DATABASE_URL" in out["error"]["message"] + out["error"].get("hint", "")


def test_a_database_url_whose_password_holds_a_raw_at_sign_is_refused_without_showing_it(db_url):
    """A password with an "@" the operator did not percent-encode (``user:Pass@word@host``):
    libpq takes the password to end at the first "@" and the rest for the host, and the error
    ("failed to resolve host 'word@host'") showed the password's tail. Refused before any
    connection, naming the setting and the fix, with no part of the password anywhere."""
    info = psycopg.conninfo.conninfo_to_dict(db_url)
    host, port, dbname = info.get("host", "127.0.0.1"), info.get("port", "5432"), info["dbname"]
    head, tail = "url-Secret", "Pa55word-3e8b"
    url = f"postgresql://postgres:{head}@{tail}@{host}:{port}/{dbname}"
    for args in (("steps", "list", "-o", "json"), ("worker", "run", "--drain", "-o", "json")):
        done = Evq(url).run(*args, EVQ_ADAPTER="null", EVQ_LOG_LEVEL="debug", timeout=60)
        for part in (head, tail):
            assert part not in done.stdout + done.stderr, (args, done.stdout, done.stderr[-2000:])
        out = json.loads(done.stdout)
        assert out["status"] == "error" and out["error"]["code"] == "E_INVALID_ARG", out
        assert "EVQ_DATABASE_URL" in out["error"]["message"] and "%40" in out["error"]["message"] + out["error"].get(
            "hint", ""
        )


BASE_URL_PASSWORD = "S3cretX-base-url-77c1"


def test_a_password_in_the_http_base_url_is_shown_nowhere(db_url, admin_key):
    """A base URL with basic-auth userinfo that does not answer: the drain's fix hint, its
    warning and the log name the URL with ``***`` for the userinfo, never the password."""
    import socket

    with socket.socket() as probe:  # a port nothing listens on: the send is refused
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    evq = Evq(db_url, api_key=admin_key)
    request = {"run_id": "u", "step_id": "s1", "to": ["ok@example.com"], "from": "a@example.org"}
    request |= {"subject": "s", "text": "t", "provider": "http"}
    assert evq.run("enqueue", "--file", "-", "-o", "json", input=json.dumps(request)).returncode == 0
    env = {
        "EVQ_ADAPTER": "http",
        "EVQ_HTTP_API_KEY": "k-not-the-secret-here",
        "EVQ_HTTP_BASE_URL": f"http://u:{BASE_URL_PASSWORD}@127.0.0.1:{port}",
        "EVQ_LOG_LEVEL": "debug",
    }
    outputs = []
    for args in (("worker", "run", "--drain"), ("worker", "run", "--drain", "-o", "json")):
        done = evq.run(*args, **env)
        outputs += [done.stdout, done.stderr]
    everything = "\n".join(outputs) + _all_rows_text(db_url)
    assert f"http://***@127.0.0.1:{port}" in everything, everything[-3000:]  # the hint names the URL
    assert BASE_URL_PASSWORD not in everything
