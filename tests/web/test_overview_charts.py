"""The overview's pictures through a real `evq serve` (issue 18): sends written through the store
across the last hours are drawn with the totals made here (read back from the SVG's aria-label
and the table beside it), the window switch changes what is counted, a provider whose answers
are mostly failures is flagged in words, and serve's own sampler writes the minute and deletes
samples older than 7 days."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from html import unescape

import httpx

from evq.worker.backoff import Backoff
from evq.worker.outcomes import Accepted, Rejected, Retryable
from evq.worker.transitions import decide
from tests.acceptance.conftest import make_key
from tests.support import execute, rows, serve_process, valid, wait_until, with_store
from tests.web.test_ops_page import _signed_in


async def _send(store, at: datetime, outcomes: list, *, lost: int = 0) -> None:
    """Enqueue and claim len(outcomes) + lost steps at ``at``, record the outcomes a second later
    (10 ms of latency each), and let the lost ones' leases run out into unknown (the rescuer)."""
    for _ in range(len(outcomes) + lost):
        await store.enqueue(valid(), now=at)
    claimed = await store.claim(
        owner="w-test", providers=["smtp"], limit=len(outcomes) + lost, lease_seconds=60, dedupe_windows={}, now=at
    )
    claimed.sort(key=lambda c: c.id)
    settled = [
        decide(c, o, default_max_attempts=3, backoff=Backoff(3600, 3600), dedupe_window_open=False, latency_ms=10.0)
        for c, o in zip(claimed, outcomes, strict=False)
    ]
    await store.record(settled, actor="w-test", now=at + timedelta(seconds=1))
    if lost:
        await store.rescue(
            limit=100, lease_seconds=60, default_max_attempts=3, actor="rescuer", now=at + timedelta(seconds=61)
        )


async def _history(store, now: datetime) -> None:
    ok = [Accepted(f"m{i}") for i in range(3)]
    await _send(store, now - timedelta(hours=5), ok)
    await _send(store, now - timedelta(hours=2), [Rejected("550 no such user")])
    await _send(store, now - timedelta(minutes=41), [Accepted("m9"), Rejected("550 no such user")], lost=1)
    await _send(store, now - timedelta(minutes=10), [Retryable("421 try later")])


def _label(html: str, name: str) -> str:
    svg = re.search(rf'<svg [^>]*id="{name}-svg"[^>]*aria-label="([^"]*)"', html)
    assert svg, f"no {name} on the page"
    return unescape(svg[1])


def _figure(html: str, name: str) -> tuple[str, list[list[str]]]:
    """A figure's aria-label (or none, for a table alone) and its table's rows, as the page has them."""
    said = _label(html, name) if name != "chart-providers" else ""
    table = re.search(rf'<table id="{name}-table">(.*?)</table>', html, flags=re.S)
    assert table
    cells = [
        [unescape(c) for c in re.findall(r"<td>(.*?)</td>", tr)]
        for tr in re.findall(r"<tr>(.*?)</tr>", table[1], flags=re.S)
    ]
    return said, [c for c in cells if c]


def test_the_overview_draws_the_sends_of_the_window_with_the_totals_written(db_url):
    # The history is placed against the clock when the test runs, not when the module was
    # imported: a slow suite ran this test 20 minutes after collection and the sends of
    # "41 minutes ago" fell out of the last hour.
    now = datetime.now(UTC)
    with_store(db_url, lambda store: _history(store, now))
    # A sample older than the kept 7 days, and one the chart must show from 20 minutes ago.
    old = (now - timedelta(days=8)).replace(second=0, microsecond=0)
    recent = (now - timedelta(minutes=20)).replace(second=0, microsecond=0)
    for at, lag in ((old, 1.0), (recent, 125.0)):
        execute(
            db_url,
            "INSERT INTO queue_samples (at, pending, claimable, lag_seconds, in_flight, retryable, unknown, held, sampled_by)"
            " VALUES (%s, 1, 1, %s, 0, 0, 1, 0, 'test')",
            (at, lag),
        )
    with serve_process(db_url) as served, httpx.Client(base_url=served.url, timeout=30) as web:
        # serve samples at once: this minute is written and the 8-day-old minute is gone.
        wait_until(
            lambda: any(r["sampled_by"].startswith("serve@") for r in rows(db_url, "SELECT * FROM queue_samples"))
        )
        assert [
            r["at"] for r in rows(db_url, "SELECT at FROM queue_samples WHERE at < now() - interval '7 days'")
        ] == []
        _signed_in(web, make_key(db_url, "bot", "agent"))
        six = web.get("/ops").text  # six hours unless told
        hour = web.get("/ops?hours=1").text
        day = web.get("/ops?hours=24").text
        refused = web.get("/ops?hours=2")
    said, table = _figure(six, "chart-sends")
    assert said == "8 sends in the last 6 h: 4 accepted, 2 rejected, 1 retryable, 1 no answer"
    assert table[-1] == ["total", "4", "2", "1", "0", "1"]
    # Each non-empty five-minute bucket is a row; their sums are the totals.
    assert [sum(int(r[k]) for r in table[:-1]) for k in range(1, 6)] == [4, 2, 1, 0, 1]
    assert all(sum(map(int, r[1:])) for r in table[:-1])  # no empty bucket listed
    said, table = _figure(hour, "chart-sends")
    assert said == "4 sends in the last 1 h: 1 accepted, 1 rejected, 1 retryable, 1 no answer"
    assert (
        _figure(day, "chart-sends")[0] == "8 sends in the last 24 h: 4 accepted, 2 rejected, 1 retryable, 1 no answer"
    )
    assert 'aria-current="page" class="current">1h</a>' in hour
    # The lost one is unknown now, 40 minutes old.
    assert _figure(six, "chart-unknown-ages")[0] == "1 unknown row now: 1 aged 30m-2h"
    # The queue lag line has the sample of 20 minutes ago (2m 5s) and serve's own minute.
    lag, samples = _figure(six, "chart-lag")
    assert lag.startswith("Queue lag over the last 6 h: ") and "at most 2m 5s" in lag
    assert [recent.strftime("%Y-%m-%d %H:%M"), "2m 5s"] in samples
    # The provider: attempts and answers of the window beside its circuit. 3 of 4 answers in the
    # hour were not acceptances (a 550, a 421, a lost reply): the provider judged messages, it did
    # not fail, so no banner says it "may be down"; a banner is for its circuit alone.
    said, [smtp] = _label(hour, "chart-provider-smtp"), _figure(hour, "chart-providers")[1]
    assert said.startswith("smtp: 4 attempts started in the last 1 h, 4 answers (1 accepted, 1 rejected")
    assert smtp[:7] == ["smtp", "4", "1", "1", "1", "0", "1"] and smtp[7:] == ["10", "10"]
    for page in (hour, six, day):
        assert "may be down" not in page and 'id="failing-smtp"' not in page and 'id="circuit-smtp"' not in page
    assert refused.status_code == 422 and "chart-sends" not in refused.text
