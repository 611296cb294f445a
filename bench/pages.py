"""The ops-pages mode: every page of /ops read against a database of a million steps
(bench/pagefill.py), its server time taken from the page's own Server-Timing header.

The real `evq serve` runs in a process of its own (the same evq, child_environment); an
operator signs in as in a browser (the login form's CSRF token, the session cookie), and each
page is asked for twice to warm up, then ``repeat`` times. A page whose route this revision does
not have (404 at the warm-up: a list or chart not built yet) is left out with a note; any other
answer that is not the page (a redirect to the sign-in, an error), and any figure that cannot be
right (no header, zero or negative), stops the run: a figure never scores as met by accident.
"""

from __future__ import annotations

import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import httpx
import psycopg

from bench import pagefill
from bench.children import child_environment
from bench.config import Figure, ImpossibleFigure
from evq.worker.errors import EvqError

if TYPE_CHECKING:
    from bench.harness import Bench

TARGET_MS = 200.0
WARMUPS = 2
_TIMING = re.compile(r"(?:^|,)\s*app;dur=([^,;\s]+)")
_CSRF = re.compile(r'name="csrf" value="([^"]+)"')


@dataclass(frozen=True)
class Page:
    name: str
    path: str
    form: dict[str, str] | None = None  # a POST (with the session's CSRF token added)
    # Text the overview must link for this page to exist (a chart window is a query parameter
    # that an overview without charts ignores: it would time the plain overview again).
    linked: str | None = None


@dataclass
class Measured:
    page: Page
    ms: list[float] = field(default_factory=list)

    def row(self) -> dict[str, Any]:
        p95 = percentile(self.ms, 95)
        return {
            "page": self.page.name,
            "path": self.page.path,
            "p50": round(statistics.median(self.ms), 2),
            "p95": round(p95, 2),
            "max": round(max(self.ms), 2),
            "target_ms": TARGET_MS,
            "met": p95 < TARGET_MS,
        }


def percentile(values: list[float], pct: float) -> float:
    """The nearest-rank percentile (of 20 values, p95 is the 19th): no interpolation between runs."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * pct // 100))
    return ordered[int(rank) - 1]


def server_ms(headers: httpx.Headers, what: str) -> float:
    """The ``app`` duration of a Server-Timing header, in ms; ImpossibleFigure when there is none
    or it is not a positive number."""
    header = headers.get("server-timing")
    match = _TIMING.search(header or "")
    if match is None:
        raise ImpossibleFigure(f"{what}: no Server-Timing app;dur in the answer (got {header!r})")
    try:
        ms = float(match[1])
    except ValueError:
        raise ImpossibleFigure(f"{what}: Server-Timing duration {match[1]!r} is not a number") from None
    if not ms > 0 or ms != ms or ms == float("inf"):
        raise ImpossibleFigure(f"{what}: Server-Timing duration {ms} ms cannot be right")
    return ms


def pages_to_read(url: str) -> list[Page]:
    """The pages, with real ids and names picked from the filled database."""
    with psycopg.connect(url) as conn:

        def one(sql: str) -> Any:
            row = conn.execute(sql).fetchone()
            if row is None:
                raise EvqError(f"ops-pages: the filled database has no row for {sql!r}")
            return row[0]

        step = one("SELECT id FROM email_steps WHERE status = 'accepted' AND attempts = 2 ORDER BY id DESC LIMIT 1")
        run = one(f"SELECT run_id FROM email_steps WHERE id = {int(step)}")
        address = one("SELECT payload -> 'to' -> 0 ->> 'email' FROM email_steps ORDER BY id DESC LIMIT 1")
        message_id = one("SELECT message_id FROM email_steps WHERE status = 'rejected' ORDER BY id LIMIT 1")
        pmid = one("SELECT provider_message_id FROM email_steps WHERE status = 'accepted' ORDER BY id LIMIT 1")
    pages = [Page("overview", "/ops")]
    pages += [Page(f"overview, last {h} h", f"/ops?hours={h}", linked=f"hours={h}") for h in (1, 6, 24)]
    statuses = ("all", "held", "pending", "in_flight", "retryable", "unknown", "accepted", "rejected")
    pages += [Page(f"list: {s}", f"/ops/steps?status={s}") for s in statuses]
    for what, text in (
        ("address", address),
        ("domain", "@" + pagefill.BIG_DOMAIN),
        ("Message-ID", message_id),
        ("provider message id", pmid),
        ("key name", "agent-07"),
    ):
        pages.append(Page(f"search by {what}", f"/ops/steps?q={quote(text, safe='')}"))
    pages += [
        Page("step", f"/ops/steps/{step}"),
        Page("trace", f"/ops/runs/{quote(run, safe='')}"),
        Page("held", "/ops/held"),
        Page("unknown, provider smtp", "/ops/unknown?provider=smtp"),
        Page(
            "bulk preview (unknown, smtp)",
            "/ops/unknown/preview",
            {"provider": "smtp", "verdict": "accepted", "note": "ops-pages benchmark preview"},
        ),
    ]
    return pages


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def serving(url: str) -> Iterator[str]:
    """`evq serve` on the filled database, until the block ends; its base URL."""
    port = free_port()
    cwd, env = child_environment()
    env = {**env, "EVQ_DATABASE_URL": url, "EVQ_LOG_LEVEL": "warning"}
    env.pop("EVQ_API_KEY", None)
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "evq.ops.cli", "serve", "--port", str(port)],
            cwd=cwd,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while True:
                if proc.poll() is not None:
                    log.seek(0)
                    raise EvqError(f"evq serve exited {proc.returncode}: {log.read()[-2000:].decode(errors='replace')}")
                try:
                    if httpx.get(base + "/healthz", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise EvqError("evq serve did not answer /healthz within 60 s")
                time.sleep(0.2)
            yield base
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def sign_in(web: httpx.Client, key: str) -> str:
    """Sign in as a browser does; the session's CSRF token (the POSTs need it)."""
    login = web.get("/ops/login")
    token = _CSRF.search(login.text)
    if token is None:
        raise EvqError("ops-pages: the sign-in page has no CSRF token")
    signed = web.post("/ops/login", data={"csrf": token[1], "key": key})
    if signed.status_code != 303 or signed.headers.get("location") != "/ops":
        raise EvqError(f"ops-pages: signing in answered {signed.status_code}, not the redirect to /ops")
    page = _CSRF.search(web.get("/ops/unknown").text)
    if page is None:
        raise EvqError("ops-pages: the signed-in page has no CSRF token")
    return page[1]


def read(web: httpx.Client, page: Page, csrf: str) -> httpx.Response:
    if page.form is None:
        return web.get(page.path)
    return web.post(page.path, data={**page.form, "csrf": csrf})


def measure(base: str, key: str, pages: list[Page], repeat: int) -> tuple[list[Measured], list[str]]:
    notes: list[str] = []
    measured: list[Measured] = []
    with httpx.Client(base_url=base, timeout=120, follow_redirects=False) as web:
        csrf = sign_in(web, key)
        overview = web.get("/ops").text
        for page in pages:
            if page.linked is not None and page.linked not in overview:
                notes.append(f"ops-pages: {page.name} ({page.path}): the overview links no such view, not measured")
                continue
            warm = read(web, page, csrf)
            if warm.status_code == 404 and "E_NOT_FOUND" in warm.text and "no route" in warm.text:
                notes.append(f"ops-pages: {page.name} ({page.path}): no such route in this revision, not measured")
                continue
            runs = Measured(page)
            for i in range(WARMUPS + repeat):
                answer = warm if i == 0 else read(web, page, csrf)
                if answer.status_code != 200:
                    raise EvqError(
                        f"ops-pages: {page.name} ({page.path}) answered {answer.status_code}, not the page: "
                        f"{answer.text[:300]!r}"
                    )
                ms = server_ms(answer.headers, f"{page.name} ({page.path})")
                if i >= WARMUPS:
                    runs.ms.append(ms)
            measured.append(runs)
    return measured, notes


def mode_ops_pages(bench: Bench) -> None:
    c = bench.config
    name = bench.db.create(bench.db.template)
    url = bench.db.url(name)
    try:
        filled = pagefill.fill(url, c.page_steps, progress=bench.progress)
        bench.progress(
            f"ops-pages: {filled.steps:,} steps filled in {filled.seconds:.0f}s, "
            f"database {filled.database_bytes / 2**20:,.0f} MB; reading the pages"
        )
        pages = pages_to_read(url)
        with serving(url) as base:
            measured, notes = measure(base, filled.operator_key, pages, c.page_repeat)
        bench.notes.extend(notes)
        for m in measured:
            bench.add(Figure("ops-pages", f"ops page: {m.page.name}", "ms", m.ms, note=m.page.path))
        bench.pages = {
            "steps": filled.steps,
            "mix": filled.counts,
            "fill_seconds": round(filled.seconds, 1),
            "database_bytes": filled.database_bytes,
            "repeat": c.page_repeat,
            "warmups": WARMUPS,
            "target_ms": TARGET_MS,
            "rows": [m.row() for m in measured],
        }
    finally:
        bench.db.drop(name, at_once=True)
