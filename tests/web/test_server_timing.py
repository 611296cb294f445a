"""Every /ops answer says how long the server took (`Server-Timing: app;dur=<ms>`), the figure
`evq bench --mode ops-pages` reads: pages, redirects, errors and the stylesheet alike, each a
positive duration no longer than the client waited for it. The overview also names its parts
(`read`, every read at once, and `draw`, the charts and the template), each within the whole."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.acceptance.conftest import make_key
from tests.support import serve_process, unknown_steps, with_store

TIMING = re.compile(r"^app;dur=(\d+\.\d{2})((?:, [a-z]+;dur=\d+\.\d{2})*)$")
PART = re.compile(r", ([a-z]+);dur=(\d+\.\d{2})")


@pytest.fixture
def server(db_url: str) -> Iterator[str]:
    with serve_process(db_url) as served:
        yield served.url


def _timed(web: httpx.Client, method: str, path: str, **kwargs: object) -> tuple[httpx.Response, float, float]:
    started = time.perf_counter()
    answer = web.request(method, path, **kwargs)  # type: ignore[arg-type]
    waited_ms = (time.perf_counter() - started) * 1000
    match = TIMING.match(answer.headers.get("server-timing", ""))
    assert match, f"{method} {path}: Server-Timing {answer.headers.get('server-timing')!r}"
    return answer, float(match[1]), waited_ms


def _parts(answer: httpx.Response) -> dict[str, float]:
    match = TIMING.match(answer.headers["server-timing"])
    assert match
    return {name: float(ms) for name, ms in PART.findall(match[2])}


def test_every_ops_answer_carries_its_server_time(server, db_url):
    [step] = with_store(db_url, lambda store: unknown_steps(store, 1))
    key = make_key(db_url, "timer", "operator")
    with httpx.Client(base_url=server, timeout=30) as web:
        login, _, _ = _timed(web, "GET", "/ops/login")
        csrf = re.search(r'name="csrf" value="([^"]+)"', login.text)
        assert csrf
        signed, _, _ = _timed(web, "POST", "/ops/login", data={"csrf": csrf[1], "key": key})
        assert signed.status_code == 303
        seen = {}
        for path in ("/ops", "/ops/unknown", f"/ops/steps/{step.id}", "/ops/steps/999999999", "/ops/static/ops.css"):
            answer, dur, waited = _timed(web, "GET", path)
            assert 0 < dur <= waited, (path, dur, waited)
            seen[path] = answer.status_code
        assert seen["/ops/steps/999999999"] == 404 and seen["/ops"] == 200
        # The overview's parts: its reads and its drawing, each positive and within the whole.
        for path in ("/ops", "/ops?hours=24"):
            answer, dur, _ = _timed(web, "GET", path)
            parts = _parts(answer)
            assert set(parts) == {"read", "draw"}, (path, answer.headers["server-timing"])
            assert all(0 < ms <= dur for ms in parts.values()) and sum(parts.values()) <= dur, (path, parts, dur)
        # A page that times no part says only the whole.
        assert _parts(web.get("/ops/unknown")) == {}
        # The API's own timing is its contract's meta.duration_ms; the header is the page's.
        assert "server-timing" not in web.get("/healthz").headers
