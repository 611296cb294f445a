"""Issue 29: `GET /v1/runs/{id}` had no page size: an agent key made a 5,000-step run answer
10 MB, growing with the run. A run of 3,000 steps (one enqueue_many) is read a page at a time
over HTTP (an agent's key), MCP, the CLI (a child process) and the ops page, with the run's
total, and every step is reached once by walking the pages."""

from __future__ import annotations

import asyncio
import re

from tests import contract
from tests.acceptance.conftest import Evq, make_key
from tests.support import valid, with_store
from tests.web.support import checked, serving
from tests.web.test_mcp import call, client

RUN = "big-run"
STEPS = 3000
# The run's steps in the order a page takes them: by step id (text order: s0, s1, s10, s100, ...).
BY_STEP_ID = sorted(f"s{i}" for i in range(STEPS))


def big_run(db_url: str) -> None:
    requests = [valid(run_id=RUN, step_id=f"s{i}", to=[f"u{i}@example.com"]) for i in range(STEPS)]
    with_store(db_url, lambda store: store.enqueue_many(requests))


def page_meta(body: dict, *, count: int, limit: int, offset: int) -> None:
    meta = body["meta"]
    assert (meta["count"], meta["total"], meta["total_exact"], meta["limit"], meta["offset"]) == (
        count,
        STEPS,
        True,
        limit,
        offset,
    ), meta
    # Each step of the page has its decision and its enqueue in the chain, and no other step does.
    assert meta["events"] == 2 * count == len(body["data"]["events"])
    assert {e["step_id"] for e in body["data"]["events"]} == {s["step_id"] for s in body["data"]["steps"]}


def trace_rows(html: str) -> list[str]:
    """The step ids the trace's step table shows."""
    table = html.split('id="run-steps"', 1)[1].split("</table>", 1)[0]
    return re.findall(r"</a></td><td>(s\d+)</td>", table)


def test_a_big_run_is_read_a_page_at_a_time_over_http_the_cli_and_the_ops_page(db_url):
    big_run(db_url)
    agent = make_key(db_url, "bot", "agent")
    operator = make_key(db_url, "alice", "operator")
    with serving(db_url) as served:
        http = served.client(agent)
        first = http.get(f"/v1/runs/{RUN}")
        body = checked(first)
        # A page, not the run: the whole run's answer was several megabytes.
        assert len(first.content) < 150_000, len(first.content)
        assert [s["step_id"] for s in body["data"]["steps"]] == BY_STEP_ID[:50]
        page_meta(body, count=50, limit=50, offset=0)

        # Walking the pages at the largest size reaches every step once.
        seen: list[str] = []
        offset = 0
        while True:
            got = http.get(f"/v1/runs/{RUN}", params={"limit": 1000, "offset": offset})
            # The schema is checked on the first (a whole page of a thousand takes seconds to check).
            page = checked(got) if offset == 0 else got.json()
            assert got.status_code == 200
            page_meta(page, count=len(page["data"]["steps"]), limit=1000, offset=offset)
            seen += [s["step_id"] for s in page["data"]["steps"]]
            if len(page["data"]["steps"]) < 1000:
                break
            offset += 1000
        assert seen == BY_STEP_ID

        middle = checked(http.get(f"/v1/runs/{RUN}", params={"limit": 7, "offset": 1234}))
        assert [s["step_id"] for s in middle["data"]["steps"]] == BY_STEP_ID[1234:1241]
        past = checked(http.get(f"/v1/runs/{RUN}", params={"offset": STEPS}))
        assert past["data"]["steps"] == [] and past["data"]["events"] == []
        page_meta(past, count=0, limit=50, offset=STEPS)
        for bad in ({"limit": 1001}, {"limit": 0}, {"offset": -1}, {"limit": "all"}):
            refused = http.get(f"/v1/runs/{RUN}", params=bad)
            assert refused.status_code == 400 and checked(refused)["error"]["code"] == "E_INVALID_ARG", bad
        missing = http.get("/v1/runs/no-such-run")
        assert missing.status_code == 404 and checked(missing)["error"]["code"] == "E_NOT_FOUND"

        # The ops page's trace: pages of 100 with Next and Previous.
        web = served.client()
        token = re.search(r'name="csrf" value="([^"]+)"', web.get("/ops/login").text)
        assert token and web.post("/ops/login", data={"csrf": token[1], "key": operator}).status_code == 303
        trace = web.get("/ops/runs", params={"run_id": RUN})
        assert trace.status_code == 200 and trace_rows(trace.text) == BY_STEP_ID[:100]
        assert 'id="prev"' not in trace.text and "Steps 1–100 of 3,000" in trace.text
        following = re.search(r'<a rel="next" id="next" href="([^"]+)"', trace.text)
        assert following, trace.text[-2000:]
        second = web.get(following[1].replace("&amp;", "&"))
        assert trace_rows(second.text) == BY_STEP_ID[100:200]
        back = re.search(r'<a rel="prev" id="prev" href="([^"]+)"', second.text)
        assert back and trace_rows(web.get(back[1].replace("&amp;", "&")).text) == BY_STEP_ID[:100]
        last = web.get("/ops/runs", params={"run_id": RUN, "offset": STEPS - 100})
        assert trace_rows(last.text) == BY_STEP_ID[-100:] and 'id="next"' not in last.text

    # The command line, in a child process.
    cli = Evq(db_url, process=True)
    tail = cli.json("runs", "show", RUN, "--limit", "20", "--offset", str(STEPS - 10))
    assert [s["step_id"] for s in tail["data"]["steps"]] == BY_STEP_ID[-10:]
    page_meta(tail, count=10, limit=20, offset=STEPS - 10)
    human = cli.run("runs", "show", RUN, "--limit", "5")
    assert human.returncode == 0 and f"run {RUN}: steps 1-5 of 3,000 (next: --offset 5)" in human.stdout
    too_many = cli.run("runs", "show", RUN, "--limit", "1001", "-o", "json")
    assert too_many.returncode == 2 and '"E_INVALID_ARG"' in too_many.stdout


async def test_a_big_run_is_read_a_page_at_a_time_over_mcp(db_url):
    await asyncio.to_thread(big_run, db_url)
    agent = await asyncio.to_thread(make_key, db_url, "bot", "agent")
    async with client(db_url, agent) as c:
        first = await call(c, "evq_runs_show", {"run_id": RUN}, "runs.show")
        assert [s["step_id"] for s in first["data"]["steps"]] == BY_STEP_ID[:50]
        page_meta(first, count=50, limit=50, offset=0)
        later = await call(c, "evq_runs_show", {"run_id": RUN, "limit": 25, "offset": 2990}, "runs.show")
        assert [s["step_id"] for s in later["data"]["steps"]] == BY_STEP_ID[2990:]
        page_meta(later, count=10, limit=25, offset=2990)
        refused = await call(c, "evq_runs_show", {"run_id": RUN, "limit": 5000}, "runs.show")
        assert refused["status"] == "error" and refused["error"]["code"] == "E_INVALID_ARG"
    contract.check(("runs", "show"), first)
