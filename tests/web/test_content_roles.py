"""Message content only to the roles that need it, on every interface: `steps show` (CLI),
`GET /v1/steps/{id}`, the MCP tool and the ops page give the text and html to operator and
admin keys only; every other caller gets sizes and SHA-256, and every one says when the
content was redacted by retention. Every JSON body is checked against its schema."""

from __future__ import annotations

import asyncio
import re
from datetime import timedelta

import httpx
import pytest

from evq.worker.backoff import Backoff
from evq.worker.outcomes import Accepted
from evq.worker.transitions import decide
from tests.acceptance.conftest import Evq, make_key
from tests.support import valid, with_store
from tests.web.support import checked, serving
from tests.web.test_mcp import call, client

BODY = "The secret plan: meet at noon."
OLD_BODY = "An old message nobody needs to read again."


async def _close(store, request) -> int:
    made = await store.enqueue(request)
    [step] = await store.claim(owner="w", providers=["smtp"], limit=1, lease_seconds=60, dedupe_windows={})
    outcome = decide(step, Accepted("pm-1"), default_max_attempts=3, backoff=Backoff(1, 1), dedupe_window_open=False)
    await store.record([outcome], actor="w")
    return made.id


@pytest.fixture
def steps(db_url: str) -> dict[str, int]:
    async def go(store) -> dict[str, int]:
        old = await _close(store, valid(run_id="content", step_id="old", text=OLD_BODY))
        assert (await store.redact_content(keep=timedelta(0), limit=10, actor="redactor@test")).redacted == 1
        kept = await _close(store, valid(run_id="content", step_id="kept", text=BODY, html=f"<p>{BODY}</p>"))
        return {"kept": kept, "old": old}

    return with_store(db_url, go)


@pytest.fixture
def keys(db_url: str) -> dict[str, str]:
    return {
        "admin": make_key(db_url, "root", "admin", created_by=None),
        "agent": make_key(db_url, "bot", "agent"),
        "operator": make_key(db_url, "alice", "operator"),
    }


def assert_shown(step: dict) -> None:
    assert step["payload"]["text"] == BODY and step["payload"]["html"] == f"<p>{BODY}</p>"
    c = step["content"]
    assert (c["shown"], c["withheld"], c["redacted"], c["redacted_at"]) == (True, None, False, None)
    assert c["parts"]["text"]["bytes"] == len(BODY.encode())


def assert_withheld(step: dict, why: str) -> None:
    assert (step["payload"]["text"], step["payload"]["html"]) == (None, None)
    c = step["content"]
    assert (c["shown"], c["withheld"], c["redacted"]) == (False, "role", False)
    assert why in c["note"]
    # The proof is there for everyone: sizes, hashes, headers and recipients.
    assert c["parts"]["text"]["bytes"] == len(BODY.encode()) and len(c["parts"]["html"]["sha256"]) == 64
    assert c["payload_sha256"] == step["payload_sha256"] and step["payload"]["to"]


def assert_redacted(step: dict) -> None:
    assert step["payload"]["text"] is None and step["content_redacted_at"] is not None
    c = step["content"]
    assert (c["shown"], c["withheld"], c["redacted"]) == (False, "retention", True)
    assert c["redacted_at"] is not None and c["parts"]["text"]["bytes"] == len(OLD_BODY.encode())


def test_steps_show_on_the_command_line(db_url, steps, keys):
    def show(step_id: int, key: str | None = None, expect: int = 0) -> dict:
        return Evq(db_url, api_key=key).json("steps", "show", str(step_id), expect=expect)

    assert_withheld(show(steps["kept"])["data"]["step"], "no API key")
    assert_withheld(show(steps["kept"], keys["agent"])["data"]["step"], "role (agent)")
    assert_shown(show(steps["kept"], keys["operator"])["data"]["step"])
    assert_shown(show(steps["kept"], keys["admin"])["data"]["step"])
    for key in (None, keys["agent"], keys["operator"]):
        assert_redacted(show(steps["old"], key)["data"]["step"])
    # A key that is not valid is refused, not quietly read as "no content".
    bad = show(steps["kept"], keys["operator"][:-4] + "AAAA", expect=4)
    assert bad["error"]["code"] == "E_AUTH_FAILED"
    human = Evq(db_url, api_key=keys["agent"]).run("steps", "show", str(steps["kept"]))
    assert human.returncode == 0 and BODY not in human.stdout and "not shown" in human.stdout


def test_get_step_over_http(db_url, steps, keys):
    with serving(db_url) as api:
        for role, expect in (("agent", assert_withheld), ("operator", assert_shown), ("admin", assert_shown)):
            step = checked(api.client(keys[role]).get(f"/v1/steps/{steps['kept']}"))["data"]["step"]
            expect(step, "role (agent)") if expect is assert_withheld else expect(step)
            assert_redacted(checked(api.client(keys[role]).get(f"/v1/steps/{steps['old']}"))["data"]["step"])


def test_the_ops_page(db_url, steps, keys):
    with serving(db_url) as api:
        for role, shown in (("agent", False), ("operator", True)):
            with httpx.Client(base_url=api.url, timeout=30) as web:
                csrf = re.search(r'name="csrf" value="([^"]+)"', web.get("/ops/login").text)[1]
                assert web.post("/ops/login", data={"csrf": csrf, "key": keys[role]}).status_code in (200, 303)
                page = web.get(f"/ops/steps/{steps['kept']}")
                assert page.status_code == 200
                assert (BODY in page.text) is shown, role
                assert ('id="content-withheld"' in page.text) is not shown
                assert str(len(BODY.encode())) in page.text  # the size is there for everyone
                old = web.get(f"/ops/steps/{steps['old']}")
                assert OLD_BODY not in old.text and 'data-withheld="retention"' in old.text


def test_the_mcp_tool(db_url, steps, keys):
    async def go() -> None:
        for role in ("agent", "operator"):
            async with client(db_url, keys[role]) as c:
                body = await call(c, "evq_steps_show", {"step_id": steps["kept"]}, "steps.show")
                if role == "agent":
                    assert_withheld(body["data"]["step"], "role (agent)")
                else:
                    assert_shown(body["data"]["step"])
                old = await call(c, "evq_steps_show", {"step_id": steps["old"]}, "steps.show")
                assert_redacted(old["data"]["step"])

    asyncio.run(go())
