"""Issue 16's "done when", for the webhooks: a real `evq serve` process configured for every
provider from its EVQ_WEBHOOK_* environment; five sends whose replies were lost (``unknown``),
one per provider, are each settled by that provider's real signed webhook, and `evq runs show`
gives the evidence chain; a forged event is refused and changes nothing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import httpx

from tests.support import serve_process, step_row, unknown_steps, with_store
from tests.web.test_webhooks import CASES, post


def env_of(settings: dict) -> dict[str, str]:
    return {
        "EVQ_" + name.upper(): ",".join(value) if isinstance(value, tuple) else str(value)
        for name, value in settings.items()
    }


def test_every_providers_signed_webhook_settles_its_lost_send_in_a_real_evq_serve(db_url, sns, evq):
    # One `evq serve` per provider: a webhook reports only its own sender's steps (the http
    # adapter's for Resend, smtp's through the one relay EVQ_SMTP_RELAY names), and one
    # process has one relay.
    cases = [make(sns) for make in CASES]
    at = datetime.now(UTC) - timedelta(hours=1)
    steps = [
        with_store(
            db_url, lambda store, c=case: unknown_steps(store, 1, now=at, run_id="hooked", provider=c.step_provider)
        )[0]
        for case in cases
    ]
    log = ""
    for n, (case, step) in enumerate(zip(cases, steps, strict=True)):
        with serve_process(db_url, **env_of(case.settings)) as served:
            with httpx.Client(base_url=served.url, timeout=30) as client:
                if n == 0:
                    forged = post(client, case.name, case.forge(step))
                    assert forged.status_code == 401, forged.text
                    assert step_row(db_url, step.id)["status"] == "unknown"
                answer = post(client, case.name, case.sign(step))
                assert answer.status_code == 200, (case.name, answer.text)
                assert answer.json()["data"][0]["closed"] is True, case.name
            log += served.log()
    assert "webhook_refused" in log and "webhook_received" in log
    for step in steps:
        row = step_row(db_url, step.id)
        assert (row["status"], row["reason"]) == ("accepted", "webhook")
    run = evq.json("runs", "show", "hooked")["data"]
    assert {s["delivery"]["state"] for s in run["steps"]} == {"delivered"}
    kinds = [e["kind"] for e in run["events"]]
    assert kinds.count("delivery_event") == len(cases)
    actors = {e["actor"] for e in run["events"] if e["kind"] == "delivery_event"}
    assert actors == {f"webhook:{case.name}" for case in cases}
