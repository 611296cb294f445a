"""`evq serve` under attack, for real: a flood of wrong keys from another address, guessed
key ids, a stolen session cookie after sign-out, clients that trickle their headers or
body, and a client that holds more sockets than the server has file descriptors. Each
against the real server (`evq serve` in a subprocess, or its app under uvicorn in a
thread, configured as `evq serve` configures it), over real sockets."""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import socket
import statistics
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest

from tests.acceptance.conftest import make_key
from tests.database_roles import migrated
from tests.support import execute, request, rows, serve_process, wait_until
from tests.web.support import checked, serving

ATTACKER = "127.0.0.2"  # the whole of 127/8 is loopback: a second client address on this machine


@contextmanager
def evq_serve(db_url: str, *, nofile: int | None = None, **env: str) -> Iterator[str]:
    """`evq serve` in a process of its own, optionally with a lower open-file limit; its URL."""
    with serve_process(db_url, nofile=nofile, EVQ_LOG_LEVEL="warning", **env) as served:
        yield served.url


def from_address(url: str, address: str, key: str | None = None, *, timeout: float = 60) -> httpx.Client:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.Client(
        base_url=url, headers=headers, timeout=timeout, transport=httpx.HTTPTransport(local_address=address)
    )


def latencies(client: httpx.Client, path: str, n: int, statuses: list[int] | None = None) -> list[float]:
    """Seconds per request; each answer's status goes to ``statuses`` (or must be 200)."""
    out = []
    for _ in range(n):
        started = time.perf_counter()
        try:
            status = client.get(path).status_code
        except httpx.TimeoutException:
            status = 0  # no answer within the client's timeout
        out.append(time.perf_counter() - started)
        if statuses is None:
            assert status == 200
        else:
            statuses.append(status)
    return out


def refusals(url: str, reason: str) -> float:
    """evq_serve_refused_total{reason} on the server's /metrics."""
    body = httpx.get(url + "/metrics", timeout=30).text
    found = re.search(rf'^evq_serve_refused_total\{{reason="{reason}"\}} (\S+)$', body, flags=re.M)
    assert found, body[:2000]
    return float(found[1])


def wrong_key(key: str) -> str:
    """The same key id with another secret of the same length."""
    prefix, _, secret = key.rpartition("_")
    return f"{prefix}_{'x' * len(secret)}"


# -- wrong keys --------------------------------------------------------------------


class Flood:
    """Wrong keys from another address at a fixed pace, whatever the answers take (an
    attacker does not wait for them): one request every 1/rate s, each on its own."""

    def __init__(self, url: str, guesses: list[str], rate: float):
        self.url, self.guesses, self.rate = url, guesses, rate
        self.sent = self.refused = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    def __enter__(self) -> Flood:
        self.started = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.elapsed = time.monotonic() - self.started
        self._stop.set()
        self._thread.join(timeout=60)

    async def _run(self) -> None:
        limits = httpx.Limits(max_connections=500, max_keepalive_connections=50)
        transport = httpx.AsyncHTTPTransport(local_address=ATTACKER, limits=limits)
        async with httpx.AsyncClient(base_url=self.url, timeout=60, transport=transport) as client:
            tasks: set[asyncio.Task] = set()
            start = time.monotonic()
            while not self._stop.is_set():
                guess = self.guesses[self.sent % len(self.guesses)]
                task = asyncio.create_task(self._one(client, guess))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                self.sent += 1
                await asyncio.sleep(max(0.0, start + self.sent / self.rate - time.monotonic()))
            for task in list(tasks):
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _one(self, client: httpx.AsyncClient, guess: str) -> None:
        try:
            answer = await client.get("/v1/steps?limit=1", headers={"Authorization": f"Bearer {guess}"})
        except httpx.HTTPError:
            return
        self.refused += answer.status_code == 401


def test_a_flood_of_wrong_keys_leaves_a_legitimate_requests_latency_alone(db_url):
    """Wrong keys from another address at 60 a second (ids that do not exist, and a wrong
    secret for one that does), sent whatever the answers take: a legitimate client's median
    latency stays within a few times its unflooded median. (With scrypt on the event loop,
    each wrong key blocked every request for tens of milliseconds: the loop fell behind and
    a legitimate request waited seconds.)"""
    good = make_key(db_url, "bot", "agent", created_by=None)
    guesses = [f"evq_{i:012x}_{'y' * 43}" for i in range(5)] + [wrong_key(good)]
    # The throttle is set out of the way: what is measured is the cost of checking a wrong key.
    with evq_serve(db_url, EVQ_SERVE_AUTH_FAILURES="1000000") as url:
        legit = from_address(url, "127.0.0.1", good, timeout=8)
        latencies(legit, "/v1/steps?limit=1", 3)  # warm: pool connections, first imports
        quiet = statistics.median(latencies(legit, "/v1/steps?limit=1", 15))
        with Flood(url, guesses, rate=60) as flood:
            time.sleep(2)  # the flood is under way
            statuses: list[int] = []
            flooded = statistics.median(latencies(legit, "/v1/steps?limit=1", 7, statuses))
        legit.close()
    rate = flood.sent / flood.elapsed
    print(
        f"\nlegitimate p50: {quiet * 1000:.1f} ms quiet, {flooded * 1000:.1f} ms under {rate:.1f} wrong keys/s "
        f"(its answers {statuses}; {flood.refused} of {flood.sent} wrong keys answered 401 meanwhile)"
    )
    assert statuses == [200] * 7 and flooded < 5 * quiet + 0.25, (quiet, flooded, rate, statuses)
    assert rate >= 14 and flood.refused >= 0.8 * flood.sent, (rate, flood.refused, flood.sent)


def test_a_wrong_secret_for_a_known_key_id_costs_what_an_unknown_id_costs(db_url):
    """Interleaved, over HTTP: a wrong secret for a key id that exists (and was just used
    successfully) and a key id that does not exist take the same time, so the answer's
    timing does not tell an attacker which key ids exist."""
    good = make_key(db_url, "bot", "agent", created_by=None)
    with evq_serve(db_url, EVQ_SERVE_AUTH_FAILURES="1000000") as url:
        with httpx.Client(base_url=url, timeout=60) as client:
            assert client.get("/v1/steps", headers={"Authorization": f"Bearer {good}"}).status_code == 200
            timings: dict[str, list[float]] = {"known": [], "unknown": []}
            for i in range(60):
                for kind, key in (("known", wrong_key(good)), ("unknown", f"evq_{i:012x}_{'x' * 43}")):
                    started = time.perf_counter()
                    assert client.get("/v1/steps", headers={"Authorization": f"Bearer {key}"}).status_code == 401
                    timings[kind].append(time.perf_counter() - started)
    known, unknown = statistics.median(timings["known"]), statistics.median(timings["unknown"])
    print(f"\nwrong secret for a known id: {known * 1000:.2f} ms; unknown id: {unknown * 1000:.2f} ms (medians)")
    assert 1 / 3 < known / unknown < 3, (known, unknown)


def test_an_address_that_keeps_presenting_wrong_keys_is_refused_with_429_and_others_are_not(db_url):
    good = make_key(db_url, "bot", "agent", created_by=None)
    with evq_serve(db_url, EVQ_SERVE_AUTH_FAILURES="5", EVQ_SERVE_AUTH_WINDOW="60") as url:
        with from_address(url, ATTACKER) as attacker:
            for _ in range(5):
                answer = attacker.get("/v1/steps", headers={"Authorization": f"Bearer {wrong_key(good)}"})
                assert answer.status_code == 401
            refused = attacker.get("/v1/steps", headers={"Authorization": f"Bearer {wrong_key(good)}"})
            assert refused.status_code == 429, refused.text
            assert 1 <= int(refused.headers["retry-after"]) <= 60
            body = checked(refused)
            assert body["error"]["code"] == "E_AUTH_FAILED" and body["error"]["context"]["retry_after"] >= 1
            # Not even looked at: a good key from that address is refused as well, until the window passes.
            assert attacker.get("/v1/steps", headers={"Authorization": f"Bearer {good}"}).status_code == 429
            # The sign-in form counts the same failures.
            login = attacker.get("/ops/login")
            csrf = re.search(r'name="csrf" value="([^"]+)"', login.text)[1]
            page = attacker.post("/ops/login", data={"csrf": csrf, "key": good})
            assert page.status_code == 429 and "Retry-After" in page.headers
        assert refusals(url, "throttled") == 3
        # Another address is not affected, and a request without a key counts as no guess.
        with from_address(url, "127.0.0.1") as other:
            for _ in range(10):
                assert other.get("/v1/steps").status_code == 401
            assert other.get("/v1/steps", headers={"Authorization": f"Bearer {good}"}).status_code == 200


def test_a_forged_x_forwarded_for_does_not_reset_the_count(db_url):
    """A client on the loopback address (a local process, or any client behind a TLS terminator
    in TCP mode or an nginx that forwards the client's own X-Forwarded-For) sends a new
    X-Forwarded-For with every wrong key: it is still one address, refused after the limit."""
    good = make_key(db_url, "bot", "agent", created_by=None)
    with evq_serve(db_url, EVQ_SERVE_AUTH_FAILURES="5", EVQ_SERVE_AUTH_WINDOW="60") as url:
        with from_address(url, "127.0.0.1") as attacker:
            answers = [
                attacker.get(
                    "/v1/steps",
                    headers={"Authorization": f"Bearer {wrong_key(good)}", "X-Forwarded-For": f"203.0.113.{n}"},
                ).status_code
                for n in range(1, 9)
            ]
        assert answers == [401] * 5 + [429] * 3, answers
        # The address the server counted is the socket's, so another address is still served.
        with from_address(url, ATTACKER, good) as other:
            assert other.get("/v1/steps").status_code == 200


def test_behind_a_tls_proxy_the_session_cookie_stays_secure(db_url):
    """X-Forwarded-For is not trusted (above), so uvicorn no longer rewrites the scheme from
    X-Forwarded-Proto either; the page still marks its cookie Secure when a TLS proxy says
    the browser came over https, and not when nothing says so."""
    with evq_serve(db_url) as url:
        with from_address(url, "127.0.0.1") as browser:
            proxied = browser.get("/ops/login", headers={"X-Forwarded-Proto": "https"})
            direct = browser.get("/ops/login")
    assert "secure" in proxied.headers["set-cookie"].lower()
    assert "secure" not in direct.headers["set-cookie"].lower()


def test_a_key_hashed_with_scrypt_before_the_upgrade_works_and_is_rehashed_at_first_use(empty_db_url):
    """A 0.2.0 database holding a key made by an evq before keys were HMACs (a scrypt hash, as
    0.1 stored them and 0.2 kept them until their first use), upgraded to 1.0: the key still
    works over HTTP, its row now holds an HMAC, and it keeps working."""
    from evq.adapters.postgres.database import upgrade
    from evq.worker.keys import generate
    from tests.v0_2 import database_0_2

    database_0_2(empty_db_url)
    key = generate()
    salt = os.urandom(16)
    digest = hashlib.scrypt(key.secret.encode(), salt=salt, n=2**14, r=8, p=1, dklen=32)
    legacy = f"scrypt${2**14}$8$1${salt.hex()}${digest.hex()}"  # as evq 0.1 stored keys
    execute(
        empty_db_url,
        "INSERT INTO api_keys (name, role, key_id, secret_hash) VALUES ('old', 'operator', %s, %s)",
        (key.key_id, legacy),
    )
    upgrade(empty_db_url)
    with serving(empty_db_url) as api:
        assert api.client(key.text).get("/v1/steps").status_code == 200
        [row] = rows(empty_db_url, "SELECT secret_hash FROM api_keys WHERE name = 'old'")
        assert row["secret_hash"].startswith("hmac-sha256$") and key.secret not in row["secret_hash"]
        assert api.client(key.text).get("/v1/steps").status_code == 200
        assert api.client(wrong_key(key.text)).get("/v1/steps").status_code == 401


# -- the ops page's session ------------------------------------------------------------


def test_signing_out_ends_the_session_on_the_server(db_url):
    """A copy of the session cookie taken before sign-out (another tab, a proxy's log, a
    stolen cookie) is refused afterwards; signing in again works."""
    alice = make_key(db_url, "alice", "operator", created_by=None)
    with serving(db_url) as api, httpx.Client(base_url=api.url, timeout=30) as web:
        csrf = re.search(r'name="csrf" value="([^"]+)"', web.get("/ops/login").text)[1]
        assert web.post("/ops/login", data={"csrf": csrf, "key": alice}).status_code == 303
        stolen = web.cookies.get("evq_session", path="/ops")
        assert web.get("/ops").status_code == 200
        page = web.get("/ops")
        token = re.search(r'name="csrf" value="([^"]+)"', page.text)[1]
        assert web.post("/ops/logout", data={"csrf": token}).status_code == 303
        with httpx.Client(base_url=api.url, timeout=30, cookies={"evq_session": stolen}) as thief:
            after = thief.get("/ops")
            assert after.status_code == 303 and after.headers["location"] == "/ops/login?ended=signed-out"
            assert thief.get("/ops/unknown").status_code == 303
        csrf = re.search(r'name="csrf" value="([^"]+)"', web.get("/ops/login").text)[1]
        assert web.post("/ops/login", data={"csrf": csrf, "key": alice}).status_code == 303
        assert web.get("/ops").status_code == 200


# -- run ids with a slash ----------------------------------------------------------------


def test_run_ids_with_a_slash_are_reachable_over_http_and_on_the_page(db_url):
    agent = make_key(db_url, "bot", "agent", created_by=None)
    alice = make_key(db_url, "alice", "operator")
    run_id = "team-a/2026/run-7"
    with serving(db_url) as api:
        made = api.client(agent).post("/v1/steps", json=request(run_id=run_id, step_id="welcome"))
        assert made.status_code == 201, made.text
        for path in ("/v1/runs/team-a%2F2026%2Frun-7", "/v1/runs/team-a/2026/run-7"):
            answer = api.client(agent).get(path)
            assert answer.status_code == 200, (path, answer.text[:300])
            assert answer.json()["data"]["run_id"] == run_id
        assert api.client(agent).get("/v1/runs/team-a/2026").status_code == 404  # a prefix is another run
        with httpx.Client(base_url=api.url, timeout=30) as web:
            csrf = re.search(r'name="csrf" value="([^"]+)"', web.get("/ops/login").text)[1]
            assert web.post("/ops/login", data={"csrf": csrf, "key": alice}).status_code == 303
            step_page = web.get(f"/ops/steps/{made.json()['data']['id']}")
            link = re.search(r'href="(/ops/runs[^"]+)"', step_page.text)[1].replace("&amp;", "&")
            for path in (link, "/ops/runs/team-a%2F2026%2Frun-7", "/ops/runs/team-a/2026/run-7"):
                trace = web.get(path)
                assert trace.status_code == 200 and run_id in trace.text, (path, trace.status_code)
            found = web.get("/ops/runs", params={"run_id": run_id})
            assert found.status_code == 200 and "welcome" in found.text


def test_run_ids_with_dot_segments_are_reachable_on_the_page_and_over_http(db_url):
    """A browser (and httpx) resolves "." and ".." path segments, even as %2E%2E, before it
    sends the request: a page link /ops/runs/.. led to the overview, /ops/runs/a/../b to a
    404. The page links to runs by a query parameter; the API takes the encoded form."""
    agent = make_key(db_url, "bot", "agent", created_by=None)
    alice = make_key(db_url, "alice", "operator")
    run_ids = ["..", ".", "a/../b", "./x", "x/.."]
    with serving(db_url) as api:
        made = {}
        for run_id in run_ids:
            answer = api.client(agent).post("/v1/steps", json=request(run_id=run_id, step_id=f"s-{len(made)}"))
            assert answer.status_code == 201, answer.text
            made[run_id] = answer.json()["data"]["id"]
        with httpx.Client(base_url=api.url, timeout=30) as web:
            csrf = re.search(r'name="csrf" value="([^"]+)"', web.get("/ops/login").text)[1]
            assert web.post("/ops/login", data={"csrf": csrf, "key": alice}).status_code == 303
            for run_id, step in made.items():
                page = web.get(f"/ops/steps/{step}")
                link = re.search(r'href="(/ops/runs[^"]+)"', page.text)[1].replace("&amp;", "&")
                trace = web.get(link)
                assert trace.status_code == 200 and f"s-{list(made).index(run_id)}" in trace.text, (run_id, link)
                found = web.get("/ops/runs", params={"run_id": run_id})
                assert found.status_code == 200 and f"/ops/steps/{step}" in found.text, run_id
        for run_id in made:
            # The raw request target, as a client that does not normalise sends it.
            raw = "/v1/runs/" + "".join(f"%{b:02X}" for b in run_id.encode())
            with httpx.Client(base_url=api.url, timeout=30) as plain:
                answer = plain.send(
                    plain.build_request(
                        "GET",
                        api.url,
                        headers={"Authorization": f"Bearer {agent}"},
                        extensions={"target": raw.encode()},
                    )
                )
            assert answer.status_code == 200 and answer.json()["data"]["run_id"] == run_id, (run_id, answer.text[:200])


# -- slow clients ------------------------------------------------------------------------


def _connect(url: str, source: str = "127.0.0.1") -> socket.socket:
    port = int(url.rsplit(":", 1)[1])
    sock = socket.create_connection(("127.0.0.1", port), timeout=30, source_address=(source, 0))
    return sock


def _trickle(sock: socket.socket, data: bytes, stop: threading.Event, pace: float = 0.2) -> None:
    for byte in data:
        if stop.is_set():
            return
        try:
            sock.sendall(bytes([byte]))
        except OSError:
            return  # the server closed it
        stop.wait(pace)


def _answer(sock: socket.socket, within: float) -> bytes:
    """What the server sends before it closes the connection (it must close it within ``within``)."""
    sock.settimeout(within)
    got = b""
    try:
        while chunk := sock.recv(65536):
            got += chunk
    except TimeoutError:
        raise AssertionError(f"the server kept the connection open for {within} s; got {got[:200]!r}") from None
    except ConnectionResetError:
        pass
    return got


def _trickled_answer(url: str, sock: socket.socket, data: bytes) -> bytes:
    """Trickle ``data`` on ``sock`` from a thread while a legitimate request is served; then what
    the server answered the trickler before closing its connection."""
    stop = threading.Event()
    sender = threading.Thread(target=_trickle, args=(sock, data, stop), daemon=True)
    sender.start()
    try:
        assert httpx.get(url + "/healthz", timeout=10).status_code == 200
        return _answer(sock, within=15)
    finally:
        stop.set()
        sender.join(timeout=10)
        sock.close()


def test_a_client_trickling_its_headers_gets_408_and_is_closed_while_others_are_served(db_url):
    with evq_serve(db_url, EVQ_SERVE_HEADER_TIMEOUT="1") as url:
        sock = _connect(url, ATTACKER)
        got = _trickled_answer(url, sock, b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"X-Pad: " + b"a" * 500)
        assert refusals(url, "header_timeout") == 1
    assert got.startswith(b"HTTP/1.1 408"), got[:200]
    assert b"EVQ_SERVE_HEADER_TIMEOUT" in got


def test_a_client_trickling_its_body_gets_408_and_is_closed(db_url):
    agent = make_key(db_url, "bot", "agent", created_by=None)
    with evq_serve(db_url, EVQ_SERVE_BODY_TIMEOUT="1") as url:
        sock = _connect(url, ATTACKER)
        head = (
            f"POST /v1/steps HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {agent}\r\n"
            "Content-Type: application/json\r\nContent-Length: 400\r\n\r\n"
        ).encode()
        sock.sendall(head)
        got = _trickled_answer(url, sock, b'{"run_id": "' + b"r" * 380)
        assert rows(db_url, "SELECT count(*)::int AS n FROM steps_now") == [{"n": 0}]
        assert refusals(url, "body_timeout") == 1
    assert got.startswith(b"HTTP/1.1 408"), got[:200]
    assert b"EVQ_SERVE_BODY_TIMEOUT" in got


def test_a_client_holding_more_sockets_than_the_server_has_file_descriptors_cannot_lock_others_out(db_url):
    """`evq serve` with an open-file limit of 160 and EVQ_SERVE_MAX_CONNECTIONS=64; a client
    opens 300 connections and sends each a partial request line, then holds them. The
    server keeps at most its cap, closing the ones that waited longest; a legitimate
    request still gets its answer. (Without the cap the server accepts until it runs out
    of descriptors, then accepts nobody: the legitimate request waits in the backlog.)"""
    good = make_key(db_url, "bot", "agent", created_by=None)
    held: list[socket.socket] = []
    with evq_serve(db_url, nofile=160, EVQ_SERVE_MAX_CONNECTIONS="64") as url:
        try:
            for _ in range(300):
                sock = _connect(url, ATTACKER)
                sock.sendall(b"GET /v1/steps HTTP/1.1\r\n")
                held.append(sock)
            time.sleep(0.5)
            with from_address(url, "127.0.0.1", good, timeout=10) as legit:
                answer = legit.get("/v1/steps?limit=1")
                assert answer.status_code == 200, answer.text[:300]
            open_now = sum(1 for s in held if _still_open(s))
            evicted = refusals(url, "evicted")
        finally:
            for sock in held:
                sock.close()
    print(f"\nof 300 held connections, {open_now} were still open when the legitimate request was answered")
    assert open_now <= 64 and evicted >= 300 - 64, (open_now, evicted)


def _still_open(sock: socket.socket) -> bool:
    """Whether the server still holds ``sock`` (what it sent before closing is read and dropped)."""
    sock.setblocking(False)
    try:
        while sock.recv(65536):
            pass
        return False  # end of stream: the server closed it
    except BlockingIOError:
        return True  # nothing (more) to read, not closed
    except OSError:
        return False
    finally:
        sock.setblocking(True)


# -- the pepper ----------------------------------------------------------------------------


def test_the_runtime_role_reads_the_pepper_and_cannot_change_it(roles):
    """Keys are checked by the runtime role (`evq serve`, `evq mcp`), so it reads the pepper;
    it must not replace it (it could then mint hashes for secrets of its own choosing)."""
    import psycopg

    migrated(roles)
    with psycopg.connect(roles.app_url, autocommit=True) as conn:
        [(pepper,)] = conn.execute("SELECT pepper FROM api_key_pepper").fetchall()
        assert len(pepper) >= 32
        for statement in (
            "UPDATE api_key_pepper SET pepper = '\\x00'::bytea",
            "DELETE FROM api_key_pepper",
            "TRUNCATE api_key_pepper",
            "INSERT INTO api_key_pepper (id, pepper) VALUES (2, '\\x00'::bytea)",
            "DROP TABLE api_key_pepper",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement)
    assert rows(roles.admin_url, "SELECT pepper FROM api_key_pepper") == [{"pepper": pepper}]


def _healthy(url: str) -> bool:
    with from_address(url, "127.0.0.1", timeout=10) as legit:
        return legit.get("/healthz").status_code == 200


def test_a_client_that_never_reads_its_answers_cannot_lock_others_out(db_url):
    """The reverse of slowloris: a client pipelines requests on a socket with a tiny receive
    window and never reads, so the server's answer can never be written out. Such a
    connection is "being answered" for ever, which the cap never closes; a few of them
    filled it and every newcomer got 503. An answer that cannot be written within
    EVQ_SERVE_BODY_TIMEOUT ends its connection."""
    held: list[socket.socket] = []
    pipelined = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" * 2000
    with evq_serve(db_url, EVQ_SERVE_MAX_CONNECTIONS="4", EVQ_SERVE_BODY_TIMEOUT="2") as url:
        try:
            for _ in range(4):
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1)  # the kernel's minimum
                sock.bind((ATTACKER, 0))
                sock.connect(("127.0.0.1", int(url.rsplit(":", 1)[1])))
                sock.setblocking(False)
                try:
                    sock.send(pipelined)
                except BlockingIOError:
                    pass  # the server stopped reading: its answers are stuck, as intended
                held.append(sock)
            wait_until(lambda: not _healthy(url), timeout=10, what="the four held connections filling the cap")
            # Without a write deadline every newcomer got 503 for as long as the sockets were held.
            # With it: once the server's socket buffers are full (a second or two here) and
            # EVQ_SERVE_BODY_TIMEOUT has passed, the stuck connections are closed.
            wait_until(lambda: _healthy(url), timeout=30, what="a newcomer served while the stuck clients hold on")
            wait_until(lambda: refusals(url, "unread") == 4, timeout=30, what="each stuck connection closed")
        finally:
            for sock in held:
                sock.close()
