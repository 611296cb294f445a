"""The worker and the SES adapter together, in this process: real PostgreSQL, real HTTP.

A suspended SES account (SES's documented answer, from a real HTTP server: moto cannot
suspend one) opens the provider's circuit on its first answer: nothing is charged, no
message is rejected, and most are never tried; throttling pauses only the pace.
"""

from __future__ import annotations

from dataclasses import replace

from evq.adapters.ses import SesProvider
from evq.ops.settings import Settings
from evq.worker.request import Policy, parse
from evq.worker.runner import Worker
from tests.integration.test_circuit import charged, failed_probes, run_until, statuses
from tests.sesserver import ACCESS_KEY, REGION, SECRET_KEY, SesErrorPeer
from tests.support import request, rows

SETTINGS = Settings(
    adapter=("ses",),
    concurrency=2,
    batch_size=2,
    lease_seconds=30,
    poll_interval=0.05,
    retry_base=0.05,
    retry_max=0.2,
    rescue_interval=0.5,
    shutdown_grace=5,
    ses_timeout=2,
    max_attempts=3,
    retry_for=3600,
    circuit_probe_base=0.2,
    circuit_probe_max=0.4,
    reconcile_checks=0,
)
POLICY = Policy(providers=("ses",), default_provider="ses")


async def enqueue(store, n: int) -> list[int]:
    return [(await store.enqueue(parse(request(step_id=f"s{i}", provider="ses"), POLICY))).id for i in range(n)]


def provider(url: str) -> SesProvider:
    return SesProvider(
        region=REGION, endpoint_url=url, timeout=2.0, access_key_id=ACCESS_KEY, secret_access_key=SECRET_KEY
    )


async def test_a_suspended_account_opens_the_circuit_at_once_and_charges_nothing(store, db_url):
    suspended = (400, "AccountSuspendedException", "Your account's ability to send email has been restricted.")
    ids = await enqueue(store, 8)
    with SesErrorPeer(default=suspended) as peer:
        ses = provider(peer.url)
        try:
            await run_until(
                Worker(store, {"ses": ses}, SETTINGS.worker_config()),
                lambda: statuses(db_url).get("rejected", 0) > 0 or failed_probes(db_url, "ses") >= 3,
            )
        finally:
            await ses.close()
        tried = len(peer.requests)
    assert statuses(db_url).get("rejected", 0) == 0 and sum(charged(db_url)) == 0
    [circuit] = rows(db_url, "SELECT * FROM provider_circuits")
    assert (circuit["provider"], circuit["reason"]) == ("ses", "forbidden")
    assert "AccountSuspendedException" in circuit["detail"]
    # The first answers (one batch in flight) and the probes; not every message three times.
    assert tried < 3 * len(ids)
    assert SECRET_KEY not in str(rows(db_url, "SELECT * FROM provider_circuit_events"))


async def test_throttling_leaves_the_step_retryable_and_opens_no_circuit(store, db_url):
    [step] = await enqueue(store, 1)
    throttled = (429, "TooManyRequestsException", "Maximum sending rate exceeded.")
    with SesErrorPeer([throttled]) as peer:
        ses = provider(peer.url)
        try:
            settings = replace(SETTINGS, retry_base=3600, retry_max=3600)
            assert (
                await Worker(store, {"ses": ses}, settings.worker_config()).run(drain=True, install_signals=False) == 0
            )
        finally:
            await ses.close()
        assert len(peer.requests) == 1
    [row] = rows(db_url, "SELECT * FROM steps_now WHERE id = %s", (step,))
    assert (row["status"], row["reason"], row["maybe_delivered"]) == ("retryable", "provider_temporary", False), row
    assert rows(db_url, "SELECT count(*) AS n FROM provider_circuits")[0]["n"] == 0
