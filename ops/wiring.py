"""The composition root: the one place that turns the loaded settings (ops/settings.py)
into the core's config (WorkerConfig), each adapter's config and the real adapters, and
wires them into the core. Tests build the core with fakes through the same
constructors instead of patching anything.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Collection, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from evq.adapters.postgres.conninfo import passwords
from evq.ops.option_catalogue import OPTION_BY_NAME
from evq.ops.settings import Settings
from evq.worker.errors import ConfigError, DatabaseUnavailable, EvqError
from evq.worker.extras import needs
from evq.worker.logs import configure, get_logger, register_secrets

# Every `evq` command imports this module, most only to set up logging: the database, the store,
# the worker, the providers and /metrics (psycopg, psycopg_pool, prometheus_client, the core's
# runner) are imported by the function that builds them, so `evq --help` does not pay for them.
if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from evq.adapters.postgres.database import Migrated
    from evq.adapters.postgres.store import PostgresStore
    from evq.adapters.smtp.journal import ImapJournal
    from evq.adapters.smtp.witness import WitnessTags
    from evq.ops.app.metrics import MetricsServer
    from evq.ops.web.state import AppState
    from evq.worker.ports import Provider, ProviderProfile
    from evq.worker.runner import Worker

log = get_logger("evq.wiring")


def setup_logging(settings: Settings) -> None:
    register_secrets(settings.secrets())
    # The password of a URL that does not even parse is a secret too (libpq would echo it).
    register_secrets(passwords(settings.database_url))
    configure(settings.log_format, settings.log_level)


# The database this process resolved (host, port, name; never a password): every command's
# `-o json` meta names it (ops/cli/output.py), so nobody is unsure which one they talked to.
_used: dict[str, Any] | None = None


def database_url(settings: Settings, *, embedded_default: bool = False) -> str:
    """EVQ_DATABASE_URL, or the embedded server's when it says ``embedded`` (``embedded_default``:
    also when it is unset, for the demo alone); unset otherwise: E_INVALID_ARG saying how to set one."""
    global _used
    from evq.adapters.postgres.database import describe, resolve_url

    url = resolve_url(settings.database_url, settings.data_dir, embedded_default=embedded_default)
    _used = describe(url)
    return url


def database_used() -> dict[str, Any] | None:
    """The database :func:`database_url` last resolved in this process, as meta names it."""
    return _used


def forget_database() -> None:
    """A new command begins (tests run several in one process): it names only what it resolves."""
    global _used
    _used = None


def check_database(url: str) -> None:
    """E_SCHEMA_MISMATCH unless the database is at this evq's head revision; E_INVALID_ARG
    unless its transactions start READ COMMITTED (adapters/postgres/isolation.py)."""
    from evq.adapters.postgres.database import check_at_start

    check_at_start(url)


# The backoff of a starting process waiting for its database: short at first (a restart takes
# seconds), never longer than this between tries, so it starts soon after the database is back.
STARTUP_RETRY_FIRST = 0.5
STARTUP_RETRY_MAX = 5.0


async def wait_for_database(settings: Settings, url: str) -> Settings:
    """The start-up checks of a long-running process (the worker, `evq serve`): the schema and
    isolation checks and the pooler probe (EVQ_POOLER=auto; the settings it returns say what
    was found), retried while the database does not answer, as the running worker retries its
    claims: a worker started while PostgreSQL restarts waits for it (logging each try) instead
    of exiting.
    After EVQ_STARTUP_WAIT seconds it gives up: E_DB_UNAVAILABLE (exit 9). A database that
    answers and is wrong (another schema revision, no such database, a refused login) is
    refused at once: waiting would not change it."""
    import asyncio
    import time

    from evq.adapters.postgres.database import unreachable

    started = time.monotonic()
    delay = STARTUP_RETRY_FIRST
    tries = 0
    while True:
        tries += 1
        try:
            await asyncio.to_thread(check_database, url)
            resolved = await resolve_pooler(settings, url)
        except DatabaseUnavailable as exc:
            waited = time.monotonic() - started
            if not unreachable(exc):
                raise
            if waited + delay > settings.startup_wait:
                option = OPTION_BY_NAME["startup_wait"]
                raise DatabaseUnavailable(
                    f"{exc.message} (still, after {tries} tries in {waited:.0f}s at start-up)",
                    hint=f"check EVQ_DATABASE_URL and that PostgreSQL is running; {option.env} "
                    f"({settings.startup_wait:g}s) is how long a starting process waits for it",
                    context={"tries": tries, "waited_ms": round(waited * 1000), "startup_wait": settings.startup_wait},
                ) from exc
            # The cause once, at the first try, with how long this process waits; the later
            # tries say nothing new (debug), and giving up says it again as the error.
            (log.warning if tries == 1 else log.debug)(
                "database_unavailable_at_start",
                error=exc.message,
                hint=exc.hint,
                tries=tries,
                retry_in=round(delay, 3),
                waited=round(waited, 3),
                startup_wait=settings.startup_wait,
                note=f"waiting up to {settings.startup_wait:g}s for it "
                f"({OPTION_BY_NAME['startup_wait'].env}), as for a database that is restarting",
            )
            await asyncio.sleep(delay)
            delay = min(delay * 2, STARTUP_RETRY_MAX)
        else:
            if tries > 1:
                log.info("database_available", tries=tries, waited=round(time.monotonic() - started, 3))
            return resolved


def provider_profiles(
    settings: Settings, webhooks_configured: Collection[str] | None = None
) -> dict[str, ProviderProfile]:
    """Every provider's profile from the settings, no connection opened (the enqueue side has no
    provider objects): each adapter's ``profile(config, webhooks)`` (adapters/*/config.py,
    adapters/null.py), joined by Settings.provider_profiles. ``webhooks_configured``: the
    webhook providers whose secret is set (default: Settings.webhooks_configured)."""
    return settings.provider_profiles(webhooks_configured)


def needs_pepper(settings: Settings) -> bool:
    """Whether the providers need the server's pepper: the SMTP journal's witness tags
    (adapters/smtp/witness.py) are derived from it, for the sends and for the lookups, and
    the HTTP adapter's idempotency keys (adapters/http/provider.py, WireKeys)."""
    return "http" in settings.adapter or settings.smtp_journal is not None or settings.journal_imap_url is not None


def build_providers(
    settings: Settings, *, pepper: bytes | None = None, wire_keys_from: int | None = None
) -> dict[str, Provider]:
    """The providers EVQ_ADAPTER names; ``pepper``: the server's (PostgresKeys.server_pepper),
    required when :func:`needs_pepper`; ``wire_keys_from``: the first step id whose HTTP
    idempotency key is keyed by it (PostgresKeys.wire_keys_from), required
    with the HTTP adapter."""
    providers: dict[str, Provider] = {}
    profiles = provider_profiles(settings)
    for name in settings.adapter:
        if name == "smtp":
            from evq.adapters.smtp import SmtpProvider, tls_context

            smtp = settings.smtp_config()
            tags = witness_tags(settings, pepper)
            providers[name] = SmtpProvider(
                host=smtp.host,
                port=smtp.port,
                username=smtp.username,
                password=smtp.password,
                tls=smtp.tls,
                timeout=smtp.timeout,
                policy=settings.policy(),
                max_workers=settings.concurrency,
                helo_name=smtp.helo_name,
                ssl_context=tls_context(smtp.ca_file, smtp.client_cert, smtp.client_key),
                allow_plain_auth=smtp.allow_plain_auth,
                journal=smtp.journal,
                witness_tags=tags,
                witness=build_journal(settings, pepper=pepper),
                relay=smtp.relay,
                profile=profiles[name],
            )
        elif name == "http":
            with needs("http", "EVQ_ADAPTER=http"):
                from evq.adapters.http import HttpProvider, WireKeys

            http = settings.http_config()
            assert http.api_key  # HttpConfig.validate insists
            if pepper is None or wire_keys_from is None:
                raise ValueError(
                    "the HTTP adapter's idempotency keys need the server's pepper: "
                    "build_providers(settings, pepper=..., wire_keys_from=...)"
                )
            providers[name] = HttpProvider(
                base_url=http.base_url,
                api_key=http.api_key,
                timeout=http.timeout,
                dedupe_window=http.dedupe_window,
                policy=settings.policy(),
                max_connections=settings.concurrency,
                profile=profiles[name],
                wire_keys=WireKeys.from_pepper(pepper, wire_keys_from),
            )
        elif name == "ses":
            with needs("ses", "EVQ_ADAPTER=ses"):
                from evq.adapters.ses.provider import SesProvider

            ses = settings.ses_config()
            providers[name] = SesProvider(
                region=ses.region,
                endpoint_url=ses.endpoint_url,
                configuration_set=ses.configuration_set,
                timeout=ses.timeout,
                access_key_id=ses.access_key_id,
                secret_access_key=ses.secret_access_key,
                policy=settings.policy(),
                max_workers=settings.concurrency,
                profile=profiles[name],
            )
        elif name == "null":
            from evq.adapters.null import NullProvider

            providers[name] = NullProvider(delay=settings.null_delay)
    return providers


def witness_tags(settings: Settings, pepper: bytes | None) -> WitnessTags | None:
    """The SMTP journal's witness tags (adapters/smtp/witness.py), when a journal is configured."""
    if not needs_pepper(settings):
        return None
    if pepper is None:
        raise ValueError("the SMTP journal needs the server's pepper: build_providers(settings, pepper=...)")
    from evq.adapters.smtp.witness import WitnessTags

    return WitnessTags(pepper)


def build_journal(settings: Settings, *, pepper: bytes | None = None) -> ImapJournal | None:
    """The SMTP adapter's witness (adapters/smtp/journal.py) when EVQ_JOURNAL_IMAP_URL is set, else None."""
    journal = settings.journal_config()
    if journal.url is None:
        return None
    from evq.adapters.smtp.journal import ImapJournal, imap_tls_context

    tags = witness_tags(settings, pepper)
    assert journal.password and tags  # JournalConfig.validate insists; a URL needs the pepper
    return ImapJournal(
        journal.where(),
        password=journal.password,
        tags=tags,
        timeout=journal.timeout,
        ssl_context=imap_tls_context(journal.ca_file),
    )


async def resolve_pooler(settings: Settings, url: str) -> Settings:
    """EVQ_POOLER=auto made definite: probe the database (adapters/postgres/pooler.py) and,
    when a pooler answers, behave as EVQ_POOLER=transaction. A forgotten EVQ_POOLER must not
    leave prepared statements and LISTEN on behind a pooler that cannot keep them."""
    if settings.pooler != "auto":
        return settings
    from evq.adapters.postgres.pooler import probe

    found = await probe(url)
    if not found.pooled:
        return replace(settings, pooler="none")
    if settings.listen == "on":
        option = OPTION_BY_NAME["listen"]
        raise ConfigError(
            f"{option.env}=on, but a connection pooler answers for PostgreSQL: notifications would never arrive",
            hint="set EVQ_LISTEN=auto or off (evq then polls), or point LISTEN-capable evq at PostgreSQL directly",
            field=option.env,
        )
    log.warning(
        "pooler_detected",
        shares_backends=found.shares_backends,
        note="a connection pooler answers for PostgreSQL (the backend key it gave is not the server's): "
        "behaving as EVQ_POOLER=transaction: no prepared statements, no LISTEN (polling every second); "
        "set EVQ_POOLER=transaction to say so and skip this probe",
    )
    return replace(settings, pooler="transaction")


@asynccontextmanager
async def open_store(
    settings: Settings, *, url: str | None = None, max_size: int = 4, patient: bool = False
) -> AsyncIterator[PostgresStore]:
    """The store. A one-shot command (the default) fails at once when nothing answers at the
    database's address, rather than waiting 15 s to say so; the long-running processes (the
    worker, `evq serve`, `evq mcp`) pass ``patient=True`` and wait for a database that is
    restarting, as they keep reconnecting to one that goes away while they run."""
    from evq.adapters.postgres.store import PostgresStore

    url = url or database_url(settings)
    settings = await resolve_pooler(settings, url)
    # Behind a transaction-mode pooler a server-side prepared statement may be gone
    # (another client's connection) by the next execution, or have another client's name.
    store = await PostgresStore.open(
        url,
        max_size=max_size,
        notices=settings.notices(),
        prepare=settings.pooler == "none",
        patient=patient,
    )
    try:
        yield store
    finally:
        await store.close()


@contextmanager
def metrics_registry(settings: Settings, url: str) -> Iterator[CollectorRegistry]:
    """Everything evq exports, for any process that serves /metrics (the worker, the ops server).

    The queue gauges come from the database at scrape time unless EVQ_METRICS_QUEUE=off;
    every process that exports them reports the same numbers, so a second one is harmless.
    """
    from evq.adapters.postgres.queue_stats import QueueStatsReader
    from evq.ops.app.metrics import QueueCollector, build_registry

    reader = QueueStatsReader(url) if settings.metrics_queue == "on" else None
    try:
        yield build_registry(QueueCollector(reader.read) if reader is not None else None)
    finally:
        if reader is not None:
            reader.close()


@contextmanager
def metrics_endpoint(settings: Settings, url: str) -> Iterator[MetricsServer | None]:
    """Serve /metrics and /healthz on EVQ_METRICS_PORT for as long as the block runs (unset: nothing)."""
    if settings.metrics_port is None:
        yield None
        return
    from evq.ops.app.metrics import MetricsServer, wsgi_app

    with metrics_registry(settings, url) as registry:
        try:
            server = MetricsServer(wsgi_app(registry), settings.metrics_host, settings.metrics_port)
        except OSError as exc:
            option = OPTION_BY_NAME["metrics_port"]
            raise ConfigError(
                f"{option.env} ({option.flag}): cannot listen on {settings.metrics_host}:{settings.metrics_port}: "
                f"{exc.strerror or exc}",
                hint="choose a free port (or unset EVQ_METRICS_PORT to serve no metrics)",
            ) from None
        log.info("metrics_listening", host=settings.metrics_host, port=server.port, queue_gauges=settings.metrics_queue)
        try:
            yield server
        finally:
            server.close()


@asynccontextmanager
async def serve_state(settings: Settings, *, url: str | None = None) -> AsyncIterator[AppState]:
    """What `evq serve` shares between requests: the store, /metrics' registry, the page's
    queue counts (the collector's own query) and its session signer; while it runs, it samples
    the queue once a minute for the overview's charts."""
    import asyncio

    from evq.adapters.postgres.queue_stats import QueueStatsReader
    from evq.adapters.webhooks import receivers
    from evq.ops.web.session import Sessions
    from evq.ops.web.state import AppState
    from evq.ops.web.throttle import FailureThrottle
    from evq.worker.runner import new_owner
    from evq.worker.sampler import QueueSampler
    from evq.worker.service import run_periodically

    url = url or database_url(settings)
    settings = await wait_for_database(settings, url)
    reader = QueueStatsReader(url)
    stop = asyncio.Event()
    try:
        with metrics_registry(settings, url) as registry:
            async with open_store(settings, url=url, max_size=8, patient=True) as store:
                # `evq serve` samples the queue too, so the charts' history goes on while no
                # worker runs, which is when the lag they should show grows (worker/sampler.py).
                sampler = QueueSampler(store, sampled_by=f"serve@{new_owner()}")
                sampling = asyncio.create_task(run_periodically(sampler, stop), name="evq-queue_sampler")
                try:
                    yield AppState(
                        settings=settings,
                        store=store,
                        registry=registry,
                        sessions=Sessions(settings.serve_secret),
                        # The page shows counts and ages, no histogram: no buckets to count.
                        read_stats=lambda: reader.read((), pending_buckets=()),
                        throttle=FailureThrottle(settings.serve_auth_failures, settings.serve_auth_window),
                        health=health_reader(settings, url=url),
                        webhooks=receivers(settings.webhook_config()),
                        webhook_throttle=FailureThrottle(settings.serve_auth_failures, settings.serve_auth_window),
                    )
                finally:
                    stop.set()
                    await sampling
    finally:
        reader.close()


def serve_app(settings: Settings, *, url: str | None = None) -> Any:
    """The ASGI app of `evq serve` (HTTP API, ops page, /metrics, /healthz)."""
    from evq.ops.web.app import create_app

    return create_app(lambda: serve_state(settings, url=url), max_body=settings.serve_max_body)


@asynccontextmanager
async def prepared_worker(settings: Settings, *, url: str | None = None) -> AsyncIterator[Worker]:
    """A worker with its schema checked (waiting for a database that does not answer yet) and its store, providers, wakeup and /metrics open, not yet
    running: `run_worker` runs it at once; the benchmark starts its clock only once it is ready."""
    from evq.adapters.postgres.listen import PostgresWakeup
    from evq.worker.runner import Worker

    url = url or database_url(settings)
    settings = await wait_for_database(settings, url)
    providers: dict[str, Provider] = {}  # built once the store is open (the journal needs the pepper)
    wakeup = None
    if settings.pooler == "transaction":
        log.warning(
            "listen_disabled",
            note="EVQ_POOLER=transaction: LISTEN/NOTIFY does not work through a transaction-mode pooler; "
            "polling every second instead",
        )
    elif settings.listen != "off":
        wakeup = await PostgresWakeup.start(url, mode=settings.listen)
    from evq.adapters.http.callback import CallbackPoster
    from evq.worker.callbacks import CallbackConfig, CallbackSender
    from evq.worker.partitions import PartitionKeeper
    from evq.worker.runner import new_owner
    from evq.worker.sampler import QueueSampler

    http = settings.http_config()
    poster = CallbackPoster(timeout=http.callback_timeout, allow_private=http.callback_allow_private)
    try:
        with metrics_endpoint(settings, url), _worker_gc():
            async with open_store(settings, url=url, patient=True) as store:
                pepper = await store.server_pepper() if needs_pepper(settings) else None
                keyed_from = await store.wire_keys_from() if "http" in settings.adapter else None
                providers.update(build_providers(settings, pepper=pepper, wire_keys_from=keyed_from))
                callbacks = CallbackSender(store, poster, CallbackConfig(timeout=http.callback_timeout))
                owner = new_owner()
                # The queue's figures once a minute for the overview's charts (worker/sampler.py).
                sampler = QueueSampler(store, sampled_by=owner)
                config = settings.worker_config()
                # Evidence partitions made ahead of the steps that need them (worker/partitions.py).
                keeper = PartitionKeeper(store, steps=config.evidence_partition_steps)
                yield Worker(
                    store,
                    providers,
                    config,
                    wakeup=wakeup,
                    owner=owner,
                    services=[callbacks, sampler, keeper],
                )
    finally:
        await poster.close()
        for provider in providers.values():
            await provider.close()
        if wakeup is not None:
            await wakeup.close()


# The cyclic collector's young-generation threshold while a worker runs (CPython's default: 700).
WORKER_GC_THRESHOLD = 10_000


@contextmanager
def _worker_gc() -> Iterator[None]:
    """A worker makes a few dozen objects a send (its task, coroutine, records, log line) and
    keeps hundreds of sends in flight: at the default threshold every young collection walks the
    objects of every send in flight again, about a twentieth of a send's CPU in a drain. Collected
    fourteen times less often, the same garbage (nearly none of it cyclic: freed when its last
    reference goes, as ever) goes a little later. The process's setting is given back after."""
    import gc

    saved = gc.get_threshold()
    gc.set_threshold(max(saved[0], WORKER_GC_THRESHOLD), *saved[1:])
    try:
        yield
    finally:
        gc.set_threshold(*saved)


async def run_worker(
    settings: Settings, *, drain: bool = False, install_signals: bool = True, summary: dict[str, Any] | None = None
) -> int:
    """Check the schema, wire store, providers, wakeup and /metrics, run until stopped; the exit code.
    While it runs, its heartbeat tells `evq admin health` that a worker is there. ``summary``,
    when given, is filled with what the run did (Worker.summary) once it stops."""
    import asyncio

    async with prepared_worker(settings) as worker:
        stop = asyncio.Event()
        beat = asyncio.create_task(heartbeats(worker.store, worker.owner, sorted(worker.providers), stop))
        try:
            return await worker.run(drain=drain, install_signals=install_signals)
        finally:
            stop.set()
            await beat
            if summary is not None:
                summary.update(worker.summary())


async def heartbeats(store: Any, owner: str, providers: list[str], stop: Any) -> None:
    """Upsert this worker's ``worker_heartbeats`` row every HEARTBEAT_SECONDS until ``stop``
    (an asyncio.Event) is set, then delete it. A beat that fails (the database restarting) is
    logged and the next one tries again: the heartbeat never stops the worker."""
    import asyncio

    from evq.ops.app.health import HEARTBEAT_SECONDS

    while not stop.is_set():
        try:
            await store.heartbeat(owner, providers)
        except EvqError as exc:
            log.warning("heartbeat_failed", error=exc.message)
        try:
            await asyncio.wait_for(stop.wait(), HEARTBEAT_SECONDS)
        except TimeoutError:
            pass
    try:
        await store.heartbeat_end(owner)
    except EvqError as exc:
        log.warning("heartbeat_end_failed", error=exc.message, note="the row ages out of health's window")


def health_reader(settings: Settings, *, url: str | None = None) -> Any:
    """What `evq admin health`, `GET /v1/health` and the MCP tool read (ops/app/health.py's HealthReader)."""
    from evq.adapters.postgres.health import PostgresHealth

    return PostgresHealth(url or database_url(settings))


# -- the commands that start an interface or manage the schema -------------------
# The command line reaches the web app, the MCP server and the migrations only through
# these, so it imports no other interface and no adapter (docs/design.md, "Layout and dependency direction").


def require_serve(settings: Settings) -> None:
    """MissingExtra unless `evq serve`'s libraries are installed (the `serve` extra, and the
    `webhooks` extra when a provider's webhook is configured): said before anything starts."""
    with needs("serve", "evq admin serve"):
        import evq.ops.web.app  # noqa: F401
    if settings.webhooks_configured():
        from evq.adapters.webhooks import libraries

        with needs("webhooks", "a provider webhook (EVQ_WEBHOOK_*)"):
            libraries(settings.webhook_config())


def require_mcp() -> None:
    """MissingExtra unless `evq mcp`'s libraries are installed (the `mcp` extra)."""
    with needs("mcp", "evq admin mcp"):
        import evq.ops.mcp.server
        import evq.ops.mcp.stdio  # noqa: F401


def serve(settings: Settings, sock: Any, *, url: str) -> bool:
    """`evq serve`: the ASGI app on ``sock`` until SIGTERM or Ctrl-C; whether it started."""
    from evq.ops.web.server import run

    return run(serve_app(settings, url=url), settings, sock)


async def run_mcp(settings: Settings, api_key: str | None, *, url: str) -> None:
    """`evq mcp`: the MCP server on stdio until its client goes away."""
    from evq.ops.mcp.server import build_server
    from evq.ops.mcp.stdio import run_stdio

    async with open_store(settings, url=url, max_size=4, patient=True) as store:
        server = build_server(store, settings, api_key, health=health_reader(settings, url=url))
        await run_stdio(server, max_line=settings.max_input_bytes)


def revisions(url: str) -> tuple[str | None, str]:
    """The database's schema revision and the one this evq needs."""
    from evq.adapters.postgres.database import current_revision, head_revision

    return current_revision(url), head_revision()


def pending_revisions(url: str) -> list[str]:
    """The revisions `evq db upgrade` would apply, oldest first."""
    from evq.adapters.postgres.database import pending_revisions as pending

    return pending(url)


def migrate(url: str, *, runtime_role: str | None) -> Migrated:
    """`evq db upgrade`: the revision before and after, the roles granted the runtime privileges,
    and what the one-time upgrade of a 0.2.0 database copied."""
    from evq.adapters.postgres.database import migrate as upgrade

    return upgrade(url, runtime_role=runtime_role)


def upgrade_hint() -> str:
    from evq.adapters.postgres.database import UPGRADE_HINT

    return UPGRADE_HINT
