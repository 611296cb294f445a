"""`evq serve`'s app on a real loopback port (uvicorn in a thread), and an HTTP client for it."""

from __future__ import annotations

import html
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import uvicorn

from evq.ops.settings import Settings
from tests import contract
from tests.support import free_port, wait_until

# Route -> the command whose output schema (docs/cli-schema) its bodies follow.
COMMAND_OF = {
    ("POST", "/v1/steps"): "steps.enqueue",
    ("GET", "/v1/providers"): "providers.list",
    ("GET", "/v1/policy"): "policy.show",
    ("GET", "/v1/steps"): "steps.list",
    ("GET", "/v1/steps/{id}"): "steps.show",
    ("GET", "/v1/runs/{id}"): "runs.show",
    ("POST", "/v1/steps/{id}/resolve"): "steps.resolve",
    ("POST", "/v1/steps/resolve"): "steps.resolve",
    ("GET", "/v1/refusals"): "refusals.list",
    ("GET", "/v1/events"): "events.list",
    ("GET", "/v1/deliveries"): "deliveries.list",
    ("GET", "/v1/health"): "admin.health",
}


class Served:
    def __init__(self, server: uvicorn.Server, port: int):
        self.server = server
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self._clients: list[httpx.Client] = []

    def client(self, key: str | None = None, **kwargs: Any) -> httpx.Client:
        """A client sending ``key`` as the bearer token; closed when the server stops."""
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        client = httpx.Client(base_url=self.url, headers=headers, timeout=30, **kwargs)
        self._clients.append(client)
        return client

    def close_clients(self) -> None:
        for client in self._clients:
            client.close()


@contextmanager
def serving(db_url: str, **settings: Any) -> Iterator[Served]:
    """The real app (ops.wiring.serve_app) on 127.0.0.1, for as long as the block runs."""
    from evq.ops.web.slowclients import uvicorn_config
    from evq.ops.wiring import serve_app

    config_settings = Settings.load(env={}, database_url=db_url, log_format="json", **settings)
    port = free_port()
    # As `evq serve` configures uvicorn (ops/cli/serve.py): its read deadlines and connection cap.
    config = uvicorn_config(
        serve_app(config_settings, url=db_url),
        config_settings,
        host="127.0.0.1",
        port=port,
        log_config=None,
        access_log=False,
        lifespan="on",
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="evq-serve-test", daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started or not thread.is_alive(), timeout=30, what="evq serve to start")
        assert server.started, "the server did not start (see the log)"
        served = Served(server, port)
        try:
            yield served
        finally:
            served.close_clients()
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def route_of(method: str, path: str) -> tuple[str, str]:
    parts = path.split("?")[0].strip("/").split("/")
    shape = "/" + "/".join("{id}" if i == 2 and p not in ("resolve",) else p for i, p in enumerate(parts))
    return method, shape


def checked(response: httpx.Response) -> dict[str, Any]:
    """The body, checked against the contract: the wrapper, and its command's output schema."""
    body = response.json()
    assert response.headers["content-type"].startswith("application/json")
    assert set(body) == {"status", "schema_version", "data" if body["status"] != "error" else "error", "meta"}
    command = COMMAND_OF.get(route_of(response.request.method, response.request.url.path))
    if command is not None:
        contract.check(tuple(command.split(".")), body)
    return body


# Why each flag: the machine's network is closed, so Chromium's own background calls
# (updates, sync, safe browsing) would fail many at a time; --no-sandbox because CI runs as root.
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)


@contextmanager
def chromium(user_data_dir: Any, *extra: str) -> Iterator[Any]:
    """Debian's headless Chromium through Selenium (chromium + chromium-driver), quit after use;
    ``extra``: more flags (a window size). A missing binary fails under CI, skips elsewhere."""
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    from tests.support import require_binary

    binary = require_binary("chromium", "chromium")
    driver_path = require_binary("chromedriver", "chromium-driver")
    options = Options()
    options.binary_location = binary
    for flag in (*CHROMIUM_FLAGS, *extra, f"--user-data-dir={user_data_dir}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    driver.set_page_load_timeout(30)
    driver.set_script_timeout(30)
    # A click that navigates may return before the next page is there: look for its elements a while.
    driver.implicitly_wait(10)
    try:
        yield driver
    finally:
        driver.quit()


def form_fields(page: str, action: str) -> dict[str, str]:
    """The hidden fields of the form posting to ``action`` on ``page``, as a browser posts them back."""
    form = re.search(rf'<form method="post" action="{re.escape(action)}"[^>]*>(.*?)</form>', page, flags=re.S)
    assert form, f"no form posting to {action}"
    fields = re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', form[1])
    return {name: html.unescape(value) for name, value in fields}
