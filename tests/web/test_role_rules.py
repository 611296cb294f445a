"""Invariant 13 (docs/design.md, "Invariants"): every interface builds the caller's identity the
same way, and each role rule is tested through all of them at once.

ROWS is the table: who asks (a key's role, and whether the step is the key's own), what it asks
(approve, deny, cancel, close an unknown row, retry a rejected one, manage keys) and the one
outcome every interface must give (done, or the error code). Each row runs through every
interface that offers its action, each on a step of its own in the row's state:

- the CLI, `python -m evq.ops.cli ... -o json` with EVQ_API_KEY (in this process, as
  tests/inprocess.py runs it; the admin's self-approval as a real child);
- the HTTP API and the ops page of one real `evq serve`: the page's own forms (each checked to
  be drawn exactly when its action is allowed), the step list's bulk preview and apply, and
  the unknown queue's bulk close, with a session signed in by that key and its CSRF token;
- MCP through the SDK's client (in process; the admin's over real stdio, `evq mcp`), with
  EVQ_MCP_TOOLS=approve,resolve;
- for approve, the store's own statement (step_approve), which refuses the enqueuing key too.

A refusal must change nothing; what is done must be recorded under the caller's key name, so
each interface acted as the same identity. Bulk actions are an operator's and admin's tool: an
agent's session is refused every one of them (docs/design.md, "Lists and bulk actions").
"""

from __future__ import annotations

import asyncio
import html
import json
import os
import re
import sys
import threading
from collections.abc import Callable, Coroutine, Iterator
from contextlib import AsyncExitStack
from dataclasses import dataclass, field, replace
from typing import Any

import httpx
import psycopg
import pytest

from evq.ops.app.contract import EXIT_CODES
from tests import contract
from tests.acceptance.conftest import Evq
from tests.support import rows, serve_process, valid
from tests.web.support import checked, form_fields

OK, AUTH, CONFLICT = "done", "E_AUTH_FAILED", "E_CONFLICT"
Said = tuple[str, str]  # an interface's outcome (OK or the error code) and its message
NO_FORM = "no form"  # the step's page does not draw the action's form
SECOND_PERSON = "someone other than who asked"  # the self-approval refusal's words, on every interface
KEYS = {"bot": "agent", "bea": "agent", "olga": "operator", "ada": "admin", "gone": "operator"}
OTHER = "bea"  # enqueued every step a row does not call the caller's own; it asks nothing itself
REVOKED = "gone"  # signed in to the page (and MCP) before its key was revoked
CHILD = "ada"  # the admin's MCP calls go to a real `evq mcp` child, and its CLI self-approval is a child
TO = {"approve": "pending", "deny": "rejected", "cancel": "rejected", "close": "rejected", "retry": "retryable"}
EVIDENCE = {"approve": "approved", "deny": "denied", "cancel": "cancelled"}
EVIDENCE |= {"close": "operator_resolved", "retry": "operator_resolved"}


@dataclass(frozen=True)
class Row:
    caller: str
    action: str  # approve, deny, cancel, close, retry (a step's); keys.create, keys.revoke, keys.update
    state: str | None  # the step's state when asked (None: key management)
    expected: str  # OK, or the error code
    own: bool = False  # the caller's key enqueued the step (else OTHER's did)
    says: str = ""  # words every interface's refusal holds

    @property
    def id(self) -> str:
        whose = "" if self.state is None else f"-{'own' if self.own else 'other'}-{self.state}"
        return f"{self.caller}({KEYS[self.caller]})-{self.action}{whose}"


ROWS = (
    # approve: an operator or admin key, and never the key that enqueued the send, whatever its role
    Row("bot", "approve", "held", AUTH, own=True),
    Row("bot", "approve", "held", AUTH),
    Row("olga", "approve", "held", OK),
    Row("ada", "approve", "held", OK),
    Row("ada", "approve", "held", AUTH, own=True, says=SECOND_PERSON),  # issue 29: the page approved it
    # An operator key cannot enqueue: its "own" step is written with its key id, as any key's would be.
    Row("olga", "approve", "held", AUTH, own=True, says=SECOND_PERSON),
    Row("olga", "approve", "pending", CONFLICT),
    # deny: an operator or admin key; the key that asked may deny its own send (as it may cancel it)
    Row("bot", "deny", "held", AUTH, own=True),
    Row("olga", "deny", "held", OK),
    Row("ada", "deny", "held", OK, own=True),
    # cancel: the key that asked, or an operator or admin key; never what may have gone out
    Row("bot", "cancel", "held", OK, own=True),  # issue 29: the page refused it
    Row("bot", "cancel", "pending", OK, own=True),
    Row("bot", "cancel", "pending", AUTH),
    Row("olga", "cancel", "held", OK),
    Row("ada", "cancel", "pending", OK, own=True),
    Row("olga", "cancel", "unknown", CONFLICT),
    # resolve: close an unknown row, or retry a requeueable rejected one: an operator or admin key
    Row("bot", "close", "unknown", AUTH),
    Row("olga", "close", "unknown", OK),
    Row("ada", "close", "unknown", OK),
    Row("olga", "close", "held", CONFLICT),
    Row("bot", "retry", "rejected", AUTH),
    Row("olga", "retry", "rejected", OK),
    # a revoked key, whatever it asks (its page session was signed in before the revoke)
    Row("gone", "approve", "held", AUTH, says="revoked"),
    Row("gone", "cancel", "pending", AUTH, says="revoked"),
    Row("gone", "close", "unknown", AUTH, says="revoked"),
    # keys: an admin key (the command line alone manages keys)
    Row("bot", "keys.create", None, AUTH),
    Row("olga", "keys.create", None, AUTH),
    Row("ada", "keys.create", None, OK),
    Row("olga", "keys.revoke", None, AUTH),
    Row("ada", "keys.revoke", None, OK),
    Row("bot", "keys.update", None, AUTH),
    Row("ada", "keys.update", None, OK),
)


def interfaces(row: Row) -> dict[str, str]:
    """Each interface that offers the row's action to its caller, and the outcome it must give."""
    if row.state is None:
        return {"cli": row.expected}  # test_only_the_command_line_manages_keys: nowhere else
    out = dict.fromkeys(("cli", "http", "mcp"), row.expected)
    # The page draws the action's form exactly when it is allowed (and refuses a forged post all the
    # same): looked at on the step "page" then posts to.
    out["page_form"] = OK if row.expected == OK else AUTH if row.caller == REVOKED else NO_FORM
    out["page"] = row.expected
    # Bulk is for operators and admins: an agent's session is refused it, whatever the row.
    out["page_bulk"] = AUTH if KEYS[row.caller] == "agent" else row.expected
    if row.action == "close":
        out["page_unknown"] = out["page_bulk"]
    if row.action == "approve" and KEYS[row.caller] != "agent" and row.caller != REVOKED:
        out["store"] = row.expected  # the statement knows no roles and no revocation, only the key id
    return out


# -- the world the rows share: one database, one `evq serve`, a key and a session per name ---------


class Loop:
    """An event loop on a thread of its own, for the async clients (MCP, the store) the sync rows use."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, work: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(work, self.loop).result(timeout=120)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)
        self.loop.close()


@dataclass
class World:
    db: str
    url: str
    loop: Loop
    store: Any
    keys: dict[str, str]  # name -> the key's text
    key_ids: dict[str, str]
    pages: dict[str, httpx.Client] = field(default_factory=dict)  # name -> a signed-in session
    tokens: dict[str, str] = field(default_factory=dict)  # name -> the session's CSRF token
    http: dict[str, httpx.Client] = field(default_factory=dict)
    mcp: Any = None  # McpClients
    steps: dict[tuple[str, str], int] = field(default_factory=dict)  # (row id, interface) -> step id
    runs: dict[int, str] = field(default_factory=dict)  # step id -> its run (one step each)
    targets: dict[str, str] = field(default_factory=dict)  # row id -> the key a key row acts on


def csrf(page: str) -> str:
    match = re.search(r'name="csrf" value="([^"]+)"', page)
    assert match, page[-1500:]
    return match[1]


def sign_in(url: str, key: str) -> tuple[httpx.Client, str]:
    web = httpx.Client(base_url=url, timeout=30)
    signed = web.post("/ops/login", data={"csrf": csrf(web.get("/ops/login").text), "key": key})
    assert signed.status_code == 303, signed.text[-800:]
    return web, csrf(web.get("/ops").text)


async def make_steps(store: Any, world: World) -> None:
    """A step per row and interface, in the row's state, enqueued as its owner's key (the decision's
    actor_key_id, as every interface records it); each in a run of its own, which the bulk forms
    select by. The claimed ones first: the one claim takes exactly them."""
    from evq.worker.backoff import Backoff
    from evq.worker.outcomes import Retryable, Unknown
    from evq.worker.request import Actor
    from evq.worker.transitions import decide

    wanted = [(row, name) for row in ROWS if row.state for name in interfaces(row) if name != "page_form"]
    wanted.sort(key=lambda pair: pair[0].state not in ("unknown", "rejected"))
    made: dict[int, str] = {}
    for row, name in wanted:
        owner = row.caller if row.own else OTHER
        run = f"rr-{ROWS.index(row)}-{name}"
        asked = valid(
            run_id=run,
            step_id="s",
            require_approval=row.state == "held",
            max_attempts=1 if row.state == "rejected" else None,
        )
        asked = replace(asked, actor=Actor("http", world.key_ids[owner], owner, approval="policy"))
        step = (await store.enqueue(asked)).id
        world.steps[(row.id, name)] = step
        world.runs[step] = run
        made[step] = row.state or ""
    claimed = [s for s in made.values() if s in ("unknown", "rejected")]
    taken = await store.claim(owner="w-t", providers=["smtp"], limit=len(claimed), lease_seconds=60, dedupe_windows={})
    assert sorted(c.id for c in taken) == sorted(i for i, s in made.items() if s in ("unknown", "rejected"))
    answer = {"unknown": Unknown("connection lost after the final dot"), "rejected": Retryable("451 try later")}
    settled = [
        decide(c, answer[made[c.id]], default_max_attempts=3, backoff=Backoff(1, 1), dedupe_window_open=False)
        for c in taken
    ]
    await store.record(settled, actor="w-t")


class McpClients:
    """An MCP client per key, opened, used and closed by one task on the loop (the SDK's clients
    hold anyio cancel scopes, which only the task that entered them may leave)."""

    def __init__(self, world: World):
        self.world = world
        self.asks: asyncio.Queue[Any] = asyncio.Queue()
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.task = asyncio.create_task(self.serve())

    async def serve(self) -> None:
        try:
            async with AsyncExitStack() as stack:
                clients = {name: await self.open(stack, name) for name in KEYS}
                self.ready.set_result(None)
                while (ask := await self.asks.get()) is not None:
                    name, tool, arguments, answer = ask
                    try:
                        answer.set_result(await clients[name].call_tool(tool, arguments))
                    except Exception as exc:
                        answer.set_exception(exc)
        except Exception as exc:
            if not self.ready.done():
                self.ready.set_exception(exc)
            raise

    async def open(self, stack: AsyncExitStack, name: str) -> Any:
        from mcp import Client, StdioServerParameters

        from evq.adapters.postgres.health import PostgresHealth
        from evq.ops.mcp.server import build_server
        from evq.ops.settings import Settings

        w, switches = self.world, {"EVQ_MCP_TOOLS": "approve,resolve"}
        if name == CHILD:
            env = {**os.environ, "EVQ_DATABASE_URL": w.db, "EVQ_API_KEY": w.keys[name], "EVQ_LOG_FORMAT": "json"}
            child = StdioServerParameters(command=sys.executable, args=["-m", "tests.child", "mcp"], env=env | switches)
            return await stack.enter_async_context(Client(child))
        settings = Settings.load(env=switches, database_url=w.db)
        server = build_server(w.store, settings, w.keys[name], health=PostgresHealth(w.db))
        return await stack.enter_async_context(Client(server))

    async def call(self, name: str, tool: str, arguments: dict[str, Any]) -> Any:
        answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        await self.asks.put((name, tool, arguments, answer))
        return await answer

    async def close(self) -> None:
        await self.asks.put(None)
        await self.task


@pytest.fixture(scope="module")
def world(pg_server: str, _clones: Any) -> Iterator[World]:
    """One database, `evq serve`, every key of KEYS with a page session, an HTTP client and an MCP
    client each, a step per row and interface, and the key rows' targets; then REVOKED's key is
    revoked, after its session and clients began."""
    from evq.adapters.postgres.store import PostgresStore
    from evq.worker.keys import Role, generate

    database = _clones.take()
    db = psycopg.conninfo.make_conninfo(**{**psycopg.conninfo.conninfo_to_dict(pg_server), "dbname": database})
    loop = Loop()
    opened: list[Any] = []
    try:
        store = loop.run(PostgresStore.open(db, max_size=4))
        opened.append(store)

        async def key(name: str, role: str) -> str:
            made = generate()
            await store.create_key(name=name, role=Role(role), key=made, created_by=None if name == "ada" else "ada")
            return made.text

        keys = {n: loop.run(key(n, role)) for n, role in KEYS.items()}
        with serve_process(db) as served:
            w = World(db, served.url, loop, store, keys, {n: k.split("_")[1] for n, k in keys.items()})
            for i, row in enumerate(ROWS):
                if row.action == "keys.create":
                    w.targets[row.id] = f"new-{i}"
                elif row.action in ("keys.revoke", "keys.update"):
                    w.targets[row.id] = f"t-{i}"
                    loop.run(key(w.targets[row.id], "agent"))
            loop.run(make_steps(store, w))
            for n in KEYS:
                w.pages[n], w.tokens[n] = sign_in(served.url, keys[n])
                w.http[n] = httpx.Client(
                    base_url=served.url, timeout=30, headers={"Authorization": f"Bearer {keys[n]}"}
                )

            async def start() -> McpClients:
                clients = McpClients(w)
                await clients.ready
                return clients

            w.mcp = loop.run(start())
            opened.append(w.mcp)
            loop.run(store.revoke_key(REVOKED, actor="ada"))
            try:
                yield w
            finally:
                for client in (*w.pages.values(), *w.http.values()):
                    client.close()
    finally:
        for thing in reversed(opened):
            loop.run(thing.close())
        loop.close()
        _clones.give_back(database)


# -- each interface: the row's action on its step, and the outcome it gave ----------------------

NOTE = "checked by the role table"


def via_cli(w: World, row: Row, step: int | None) -> Said:
    target = w.targets.get(row.id, "")
    args = {
        "approve": ("steps", "approve", str(step), "--note", NOTE),
        "deny": ("steps", "deny", str(step), "--note", NOTE),
        "cancel": ("steps", "cancel", str(step), "--note", NOTE),
        "close": ("steps", "resolve", str(step), "--as", "rejected", "--note", NOTE),
        "retry": ("steps", "resolve", str(step), "--as", "retry", "--note", NOTE),
        "keys.create": ("keys", "create", "--name", target, "--role", "agent"),
        "keys.revoke": ("keys", "revoke", target),
        "keys.update": ("keys", "update", target, "--notify-email", "owner@example.com"),
    }[row.action]
    child = row.caller == CHILD and row.action == "approve" and row.own  # the case, as a real process
    done = Evq(w.db, api_key=w.keys[row.caller], process=child).run(*args, "-o", "json")
    out = json.loads(done.stdout)
    contract.check(args, out)
    code = out["error"]["code"] if out["status"] == "error" else OK
    assert done.returncode == EXIT_CODES.get(code, 0), (done.returncode, out)
    return code, out["error"]["message"] if code != OK else ""


def via_http(w: World, row: Row, step: int | None) -> Said:
    verb = {"close": "resolve", "retry": "resolve"}.get(row.action, row.action)
    body: dict[str, Any] = {"note": NOTE}
    if verb == "resolve":
        body["as"] = "rejected" if row.action == "close" else "retry"
    answer = w.http[row.caller].post(f"/v1/steps/{step}/{verb}", json=body)
    out = checked(answer) if verb == "resolve" else answer.json()
    code = OK if out["status"] == "success" else str(out["error"]["code"])
    statuses = {OK: (200,), AUTH: (401, 403), CONFLICT: (409,)}
    assert answer.status_code in statuses.get(code, (answer.status_code,)), (answer.status_code, out)
    return code, out["error"]["message"] if code != OK else ""


def via_mcp(w: World, row: Row, step: int | None) -> Said:
    tool = {"close": "evq_steps_resolve", "retry": "evq_steps_resolve"}.get(row.action, f"evq_steps_{row.action}")
    arguments: dict[str, Any] = {"step_id": step, "note": NOTE, "dry_run": False}
    if tool == "evq_steps_resolve":
        arguments["as"] = "rejected" if row.action == "close" else "retry"
    result = w.loop.run(w.mcp.call(row.caller, tool, arguments))
    body = result.structured_content
    assert body is not None and result.is_error == (body["status"] == "error"), result
    contract.check(("steps", tool.removeprefix("evq_steps_")), body)
    return (OK, "") if body["status"] == "success" else (str(body["error"]["code"]), body["error"]["message"])


FORMS = {"approve": "approve-form", "deny": "deny-form", "cancel": "cancel-form"}
FORMS |= {"close": "close-form", "retry": "requeue-form"}


def page_outcome(answer: httpx.Response) -> Said:
    """What a page's answer to a form says: a redirect to sign in is a refused key (the sign-in
    page says why: ``ended=revoked``), an error is shown in place with its code and message."""
    if answer.status_code == 303:
        where = answer.headers["location"]
        return (AUTH, where) if where.startswith("/ops/login") else (OK, "")
    code = {403: AUTH, 409: CONFLICT}.get(answer.status_code)
    shown = re.search(
        r'<div class="error" role="alert" id="error">\s*<strong>(E_[A-Z_]+)</strong>: ([^<]*)', answer.text
    )
    assert code is not None and shown and shown[1] == code, (answer.status_code, answer.text[-1500:])
    return code, html.unescape(shown[2])


def via_page_form(w: World, row: Row, step: int | None) -> Said:
    """Whether the step's page draws the action's form (it must exactly when the action is allowed)."""
    shown = w.pages[row.caller].get(f"/ops/steps/{step}")
    if shown.status_code == 303:  # the session ended: no page at all
        return page_outcome(shown)
    assert shown.status_code == 200, shown.text[-1500:]
    return (OK, "") if f'id="{FORMS[row.action]}"' in shown.text else (NO_FORM, "")


def via_page(w: World, row: Row, step: int | None) -> Said:
    web, token = w.pages[row.caller], w.tokens[row.caller]
    form = {"csrf": token, "note": NOTE}
    if row.action in ("close", "retry"):
        form |= {"verdict": "rejected"} if row.action == "close" else {"verdict": "retry", "action": "requeue"}
    verb = "close" if row.action in ("close", "retry") else row.action
    return page_outcome(web.post(f"/ops/steps/{step}/{verb}", data=form))


def bulk_result(page: str, step: int) -> Said:
    """A row's result on a bulk result page (bulk_done.html, closed.html)."""
    match = re.search(rf'<tr class="(succeeded|failed)"[^>]*><td><a href="/ops/steps/{step}">.*?</tr>', page, re.S)
    assert match, page[-2000:]
    if match[1] == "succeeded":
        return OK, ""
    code = re.search(r"<strong>(E_[A-Z_]+)</strong>: ([^<]*)", match[0])
    assert code, match[0]
    return code[1], html.unescape(code[2])


def via_bulk(w: World, row: Row, step: int | None, *, preview: str, apply: str, form: dict[str, str]) -> Said:
    """A bulk preview selecting the step's run, then its apply form as a browser posts it back. A
    preview that cannot list the step (its state is not the action's) is the bulk form's conflict."""
    web = w.pages[row.caller]
    assert step is not None
    shown = web.post(preview, data={"csrf": w.tokens[row.caller], "note": NOTE, "run_id": w.runs[step], **form})
    if shown.status_code != 200:
        return page_outcome(shown)
    if f'action="{apply}"' not in shown.text:
        assert "nothing to" in shown.text or 'id="preview-count"' not in shown.text, shown.text[-1500:]
        return CONFLICT, "the preview lists no such row"
    done = web.post(apply, data=form_fields(shown.text, apply))
    return bulk_result(done.text, step) if done.status_code == 200 else page_outcome(done)


def via_page_bulk(w: World, row: Row, step: int | None) -> Said:
    form = {"action": row.action, "status": "all"} | ({"verdict": "rejected"} if row.action == "close" else {})
    return via_bulk(w, row, step, preview="/ops/bulk/preview", apply="/ops/bulk/apply", form=form)


def via_page_unknown(w: World, row: Row, step: int | None) -> Said:
    form = {"verdict": "rejected"}
    return via_bulk(w, row, step, preview="/ops/unknown/preview", apply="/ops/unknown/close", form=form)


def via_store(w: World, row: Row, step: int | None) -> Said:
    from evq.worker.errors import EvqError

    async def approve() -> Said:
        try:
            await w.store.approve(step, actor=row.caller, actor_key_id=w.key_ids[row.caller], note=NOTE)
        except EvqError as exc:
            return exc.code, exc.message
        return OK, ""

    return w.loop.run(approve())  # type: ignore[no-any-return]


VIA: dict[str, Callable[[World, Row, int | None], Said]] = {
    "cli": via_cli,
    "http": via_http,
    "mcp": via_mcp,
    "page_form": via_page_form,
    "page": via_page,
    "page_bulk": via_page_bulk,
    "page_unknown": via_page_unknown,
    "store": via_store,
}


# -- what an outcome left behind -------------------------------------------------------------


def step_now(w: World, step: int) -> tuple[str, list[dict[str, Any]]]:
    [s] = rows(w.db, "SELECT status FROM steps_now WHERE id = %s", (step,))
    return s["status"], rows(w.db, "SELECT kind, actor FROM evidence WHERE step_id = %s ORDER BY id", (step,))


def key_now(w: World, name: str) -> dict[str, Any] | None:
    found = rows(w.db, "SELECT created_by, revoked_by, notify_email FROM api_keys WHERE name = %s", (name,))
    return found[0] if found else None


def left_behind(w: World, row: Row, got: str) -> None:
    """A key row's effect: done by the caller's name, or nothing at all."""
    target = w.targets[row.id]
    now = key_now(w, target)
    if row.action == "keys.create":
        assert (now is not None and now["created_by"] == row.caller) if got == OK else now is None, now
    elif row.action == "keys.revoke":
        assert now is not None and now["revoked_by"] == (row.caller if got == OK else None), now
    else:
        assert now is not None and now["notify_email"] == ("owner@example.com" if got == OK else None), now


@pytest.mark.parametrize("row", ROWS, ids=lambda row: row.id)
def test_every_interface_gives_each_role_rule_the_same_answer(world, row):
    outcomes: dict[str, str] = {}
    wrong: list[str] = []
    for name, expected in interfaces(row).items():
        step = world.steps.get((row.id, "page" if name == "page_form" else name))
        before = step_now(world, step) if step else None
        got, said = VIA[name](world, row, step)
        outcomes[name] = got
        if got != expected:
            wrong.append(f"{name}: {got}, expected {expected}")
        elif row.says and row.says not in said and name != "page_form":
            wrong.append(f"{name} said {said!r}, not {row.says!r}")
        elif name == "page_form":
            assert step_now(world, step) == before  # a look changes nothing
        elif step is None:
            left_behind(world, row, got)
        elif got == OK:
            # Done, and recorded under the caller's key name: the same identity as every other interface's.
            status, evidence = step_now(world, step)
            assert status == TO[row.action], (name, status)
            assert (evidence[-1]["kind"], evidence[-1]["actor"]) == (EVIDENCE[row.action], row.caller), name
        else:
            assert step_now(world, step) == before, f"{name} refused it ({got}) yet changed the step"
    assert not wrong, f"{row.id}: " + "; ".join(wrong) + f" (every interface: {outcomes})"


def test_only_the_command_line_manages_keys(world):
    """The key rows run on the CLI alone because no other interface offers key management: no
    route of the HTTP API or the page, no MCP tool (the command table gives keys.* no route)."""
    from evq.ops.app.commands import command

    assert all(command(path).http == () for path in ("keys.create", "keys.revoke", "keys.update", "keys.list"))
    for path in ("/v1/keys", "/v1/keys/bot/revoke"):
        assert world.http["ada"].post(path, json={"name": "x", "role": "agent"}).status_code in (404, 405)
    assert world.pages["ada"].get("/ops/keys").status_code == 404

    async def tools() -> set[str]:
        async with AsyncExitStack() as stack:
            return {t.name for t in (await (await world.mcp.open(stack, "olga")).list_tools()).tools}

    offered = world.loop.run(tools())
    assert "evq_steps_approve" in offered and not [t for t in offered if t.startswith("evq_keys")], offered


def test_one_key_is_one_identity_on_every_interface(world):
    """The same key enqueues through the CLI, the HTTP API and MCP: each decision records the same
    key id and name (the Python API, which has no key, records neither). The page shows that name
    and role, and its session cookie names the key by its id only: the page rebuilds the identity
    from the key's row on every request, as the others do on every call."""
    import base64

    from tests.support import request

    sent = {
        "http": checked(world.http["bot"].post("/v1/steps", json=request(run_id="rr-same", step_id="http")))["data"],
    }
    cli = Evq(world.db, api_key=world.keys["bot"]).json(
        "enqueue", "--file", "-", input=json.dumps(request(run_id="rr-same", step_id="cli"))
    )
    sent["cli"] = cli["data"]
    mcp = world.loop.run(world.mcp.call("bot", "evq_steps_enqueue", request(run_id="rr-same", step_id="mcp")))
    sent["mcp"] = mcp.structured_content["data"]

    async def python_api() -> int:
        from evq.adapters.postgres.enqueue import enqueue_async

        async with world.store.pool.connection() as conn:
            return (await enqueue_async(conn, request(run_id="rr-same", step_id="python"))).id

    sent["python"] = {"id": world.loop.run(python_api())}
    decisions = {
        name: rows(
            world.db,
            "SELECT d.actor, d.actor_key_id, d.interface FROM steps_now s JOIN decisions d ON d.id = s.decision_id "
            "WHERE s.id = %s",
            (made["id"],),
        )[0]
        for name, made in sent.items()
    }
    bot = {"actor": "bot", "actor_key_id": world.key_ids["bot"]}
    for name in ("cli", "http", "mcp"):
        assert decisions[name] == {**bot, "interface": name}, decisions
    assert decisions["python"]["actor_key_id"] is None, decisions

    page = world.pages["bot"].get("/ops")
    assert '<span id="who">bot (agent, read only)</span>' in page.text
    cookie = world.pages["bot"].cookies.get("evq_session", path="/ops")
    assert cookie is not None
    body = cookie.split(".")[0]
    held = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    # The CSRF token, expiry, key id, session generation and zone: no name, no role to trust.
    assert held["k"] == world.key_ids["bot"] and set(held) == {"c", "e", "k", "g", "z"}, held
