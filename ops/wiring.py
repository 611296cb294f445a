"""The composition root: the one place that turns settings into real adapters and
wires them into the core. Tests build the core with fakes through the same
constructors instead of patching anything.
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import AsyncIterator

from adapters.null import NullProvider
from adapters.postgres.database import check_at_head, resolve_url
from adapters.postgres.listen import PostgresWakeup
from adapters.postgres.store import PostgresStore
from worker.logs import configure, get_logger, register_secrets
from worker.ports import Provider
from worker.runner import Worker
from worker.settings import Settings

log = get_logger("evq.wiring")


def setup_logging(settings: Settings) -> None:
    register_secrets(settings.secrets())
    configure(settings.log_format, settings.log_level)


def database_url(settings: Settings) -> str:
    return resolve_url(settings.database_url, settings.data_dir)


def build_providers(settings: Settings) -> dict[str, Provider]:
    providers: dict[str, Provider] = {}
    for name in settings.adapter:
        if name == "smtp":
            from adapters.smtp import SmtpProvider

            providers[name] = SmtpProvider(
                host=settings.smtp_host,
                port=settings.smtp_port,
                username=settings.smtp_username,
                password=settings.smtp_password,
                tls=settings.smtp_tls,
                timeout=settings.smtp_timeout,
                policy=settings.policy(),
                max_workers=settings.concurrency,
            )
        elif name == "null":
            providers[name] = NullProvider(delay=settings.null_delay)
    return providers


@asynccontextmanager
async def open_store(settings: Settings, *, url: str | None = None, max_size: int = 4) -> AsyncIterator[PostgresStore]:
    # Behind a transaction-mode pooler a server-side prepared statement may be gone
    # (another client's connection) by the next execution.
    store = await PostgresStore.open(url or database_url(settings), max_size=max_size, prepare=settings.pooler == "none")
    try:
        yield store
    finally:
        await store.close()


async def run_worker(settings: Settings, *, drain: bool = False, install_signals: bool = True) -> int:
    """Check the schema, wire store, providers and wakeup, run until stopped; the exit code."""
    url = database_url(settings)
    check_at_head(url)
    providers = build_providers(settings)
    wakeup = None
    if settings.pooler == "transaction":
        log.warning(
            "listen_disabled",
            note="EVQ_POOLER=transaction: LISTEN/NOTIFY does not work through a transaction-mode pooler; "
            "polling every EVQ_POLL_INTERVAL instead",
        )
    elif settings.listen != "off":
        wakeup = await PostgresWakeup.start(url, mode=settings.listen)
    try:
        async with open_store(settings, url=url) as store:
            worker = Worker(store, providers, settings, wakeup=wakeup)
            return await worker.run(drain=drain, install_signals=install_signals)
    finally:
        for provider in providers.values():
            await provider.close()
        if wakeup is not None:
            await wakeup.close()
