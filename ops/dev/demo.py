"""The first-run demo: a real database, a real SMTP server and a real Resend-style
HTTP API on loopback, a handful of sends, the worker, and what to do about the result.

Three stories side by side:
- a lost SMTP reply: nobody can tell whether it went out, so it waits for an operator;
- a lost HTTP response: the provider's dedupe window is shorter than a lease here, so
  evq does not risk a retry either, but the reconciler asks the provider by the step's
  tag, finds the message, and closes the step as accepted on its own;
- a refused send whose request named an address to tell: a failure notice goes there.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any

import psycopg

# The HTTP step sends through the HTTP adapter: imported here so a missing httpx is said (as the
# `dev` extra, which brings it) before anything starts.
import evq.adapters.http  # noqa: F401
from evq.adapters.postgres.database import connect_kwargs, translated, upgrade
from evq.adapters.postgres.enqueue import enqueue_own
from evq.adapters.postgres.queries import Q
from evq.ops import wiring
from evq.ops.dev.http import DevHttpServer
from evq.ops.dev.smtp import DevSmtpServer
from evq.ops.settings import Settings
from evq.worker.errors import StateConflict
from evq.worker.ports import StepFilter

SENDER = "assistant@example.org"
API_KEY = "demo-key"
# Shorter than the lease: an ambiguous HTTP send cannot be retried safely, so it goes
# to the reconciler (a real provider keeps keys far longer: Resend 24 h).
DEDUPE_WINDOW = 2.0


@dataclass
class DemoResult:
    database: str
    run_id: str
    steps: list[dict[str, Any]]
    delivered: dict[str, int]  # Message-ID -> times received, by the SMTP server and the HTTP API together
    repeat_created: bool
    worker_exit: int


def requests(run_id: str) -> list[dict[str, Any]]:
    base = {
        "run_id": run_id,
        "from": f"Demo Assistant <{SENDER}>",
        "decision": {
            "model": "demo-model",
            "tool": "send_email",
            "instruction_version": "demo-v1",
            "rationale": "the user asked for this",
            "decided_at": "2026-01-01T09:00:00+00:00",
        },
    }
    return [
        {
            **base,
            "step_id": "welcome",
            "to": ["Ada <ada@example.com>"],
            "subject": "Welcome aboard",
            "text": "Hi Ada, welcome!",
            "intent": "welcome a new user",
        },
        {
            **base,
            "step_id": "receipt",
            "to": ["grace@example.com"],
            "subject": "Your receipt",
            "provider": "http",
            "text": "Thanks for your order.",
            "html": "<p>Thanks for your <b>order</b>.</p>",
            "intent": "send a receipt",
        },
        {
            **base,
            "step_id": "team-update",
            "to": ["alan@example.com"],
            "cc": ["edsger@example.com"],
            "subject": "Weekly update",
            "text": "All green.",
            "intent": "weekly status",
        },
        {
            **base,
            "step_id": "report",
            "to": ["lose-reply@example.com"],
            "subject": "Quarterly report",
            "text": "The SMTP server will take this and drop the connection before answering.",
            "intent": "deliver the quarterly report",
        },
        {
            **base,
            "step_id": "statement",
            "to": ["lose-reply@example.com"],
            "subject": "Monthly statement",
            "provider": "http",
            "text": "The HTTP API will take this and reset the connection before answering.",
            "intent": "deliver the monthly statement",
        },
        {
            **base,
            "step_id": "invite",
            "to": ["reject@example.net"],
            "subject": "Invitation",
            "notify": SENDER,
            "text": "The server will refuse this recipient.",
            "intent": "invite a partner",
        },
    ]


async def _run(settings: Settings, url: str, run_id: str) -> tuple[int, list[dict[str, Any]]]:
    code = await wiring.run_worker(settings, drain=True, install_signals=False)
    async with wiring.open_store(settings, url=url, max_size=1) as store:
        rows, _ = await store.list_steps(StepFilter(run_id=run_id, limit=100))
        steps = []
        for r in sorted(rows, key=lambda r: r.id):
            step = (await store.get_step(r.id)).step
            steps.append(
                {
                    "id": r.id,
                    "step_id": r.step_id,
                    "provider": r.provider,
                    "status": str(r.status),
                    "reason": r.reason,
                    "to": r.recipients,
                    "subject": r.subject,
                    "provider_message_id": step["provider_message_id"],
                    "notice_of": step["notice_of"],
                }
            )
    return code, steps


def _refuse_a_shared_database(url: str) -> None:
    with translated(url), psycopg.connect(url, **connect_kwargs()) as conn:
        n, example = conn.execute(Q["demo_foreign_steps"]).fetchone()
    if n:
        raise StateConflict(
            f"this database holds {n} step(s) that are not the demo's (run {example!r}, ...): the demo's worker "
            "would send them to its loopback servers, and this database's workers would send the demo's",
            hint="run the demo on the embedded database (unset EVQ_DATABASE_URL or set it to `embedded`, "
            "with --data-dir a new folder) or on a database of its own",
            context={"foreign_steps": n},
        )


def run_demo(settings: Settings) -> DemoResult:
    import asyncio

    embedded = settings.database_url in (None, "", "embedded")
    url = wiring.database_url(settings, embedded_default=True)
    # The worker and every reader below use this database (not a second resolution of an unset URL).
    settings = replace(settings, database_url=url)
    upgrade(url)
    _refuse_a_shared_database(url)
    run_id = time.strftime("demo-%Y%m%d-%H%M%S")
    with DevSmtpServer() as sink, DevHttpServer(api_key=API_KEY, dedupe_window=DEDUPE_WINDOW) as api:
        settings = replace(
            settings,
            adapter=("smtp", "http"),
            smtp_host=sink.host,
            smtp_port=sink.port,
            smtp_tls="none",
            smtp_timeout=5.0,
            http_base_url=api.url,
            http_api_key=API_KEY,
            http_timeout=5.0,
            http_dedupe_window=DEDUPE_WINDOW,
            lease_seconds=30.0,
            poll_interval=0.2,
            listen="off",
        )
        settings.validate()
        policy = settings.policy()
        reqs = requests(run_id)
        for req in reqs:
            enqueue_own(url, req, policy=policy)
        repeat = enqueue_own(url, reqs[0], policy=policy)  # an agent retrying its call
        code, steps = asyncio.run(_run(settings, url, run_id))
        delivered = {**sink.by_message_id(), **api.by_message_id()}
    return DemoResult(
        database="embedded" if embedded else "EVQ_DATABASE_URL",
        run_id=run_id,
        steps=steps,
        delivered=delivered,
        repeat_created=repeat.created,
        worker_exit=code,
    )
