"""What evq exports to Prometheus, and how any HTTP server serves it.

- :class:`QueueCollector`: gauges read from the database at scrape time (rows per
  status, how long unknown rows have aged, queue lag and every claimable row's wait,
  expired leases, refused enqueues counted across processes), through one
  bounded query (adapters/postgres/queue_stats.py). ``describe()`` names its metrics
  without reading anything, so registering it runs no query.
- :func:`build_registry`: the in-process catalogue (worker/metrics.py) plus the
  collectors given: one registry per HTTP server, so no global state is shared.
- :func:`render` (for any web framework: body and content type), :func:`wsgi_app`
  (``/metrics`` and ``/healthz``) and :class:`MetricsServer` (the worker's own
  thread) all serve the same registry.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeHistogramMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import ThreadingWSGIServer, choose_encoder, make_wsgi_app
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from evq.ops.option_catalogue import ADAPTERS
from evq.worker.circuit import STATE_VALUES, CircuitState
from evq.worker.logs import get_logger
from evq.worker.metrics import UNKNOWN_AGE_BUCKETS
from evq.worker.records import QueueStats
from evq.worker.states import Status

log = get_logger("evq.metrics")

PENDING_AGE_HELP = (
    "Rows claimable now by how long each has waited since it became due (a gauge histogram; "
    "the oldest is evq_pending_oldest_age_seconds). Rows waiting for their retry backoff do not count."
)

ReadStats = Callable[[Sequence[float]], QueueStats]


class QueueCollector(Collector):
    """Queue gauges read from the database at each scrape.

    When the read fails (database away, statement timeout) the scrape still succeeds
    with ``evq_collector_up 0`` and without the database gauges: a stale or zero
    value would read as "nothing is unknown", which is the one lie this must not tell.
    """

    def __init__(self, read: ReadStats, *, buckets: Sequence[float] = UNKNOWN_AGE_BUCKETS):
        self.read = read
        self.buckets = tuple(sorted(buckets))
        self._was_up: bool | None = None

    def describe(self) -> Iterable[Metric]:
        return [*self._families(None), *self._health(0.0, 0.0)]

    def collect(self) -> Iterable[Metric]:
        started = time.perf_counter()
        stats: QueueStats | None = None
        try:
            stats = self.read(self.buckets)
        except Exception as exc:
            # Any failure, a bug included, costs only these gauges; the in-process
            # counters on the same page stay readable.
            if self._was_up is not False:
                log.warning("queue_stats_failed", error_class=type(exc).__name__, error=_first_line(exc))
        else:
            if self._was_up is False:
                log.info("queue_stats_recovered")
        self._was_up = stats is not None
        duration = time.perf_counter() - started
        if stats is not None:
            yield from self._families(stats)
        yield from self._health(1.0 if stats is not None else 0.0, duration)

    def _families(self, stats: QueueStats | None) -> Iterator[Metric]:
        steps = GaugeMetricFamily(
            "evq_steps",
            "Rows per status now. Accepted and rejected are the planner's estimate above 50,000 rows each.",
            labels=["status"],
        )
        oldest_unknown = GaugeMetricFamily(
            "evq_unknown_oldest_age_seconds", "How long the oldest unknown row has waited for a verdict (0: none)."
        )
        pending = GaugeMetricFamily(
            "evq_pending_oldest_age_seconds",
            "Queue lag: how long the oldest row claimable now has waited since it became due (0: none). "
            "Rows waiting for their retry backoff do not count.",
        )
        held = GaugeMetricFamily(
            "evq_held_oldest_age_seconds",
            "How long the oldest held send has waited for a person's approval (0: none). How many wait: "
            'evq_steps{status="held"}.',
        )
        expired = GaugeMetricFamily(
            "evq_in_flight_expired", "In-flight rows whose lease has expired and that no rescuer has taken yet."
        )
        circuits = GaugeMetricFamily(
            "evq_provider_circuit_state",
            "Each provider's circuit (worker/circuit.py): 0 closed (sending), 1 half-open (one probe out), "
            "2 open (down or misconfigured: nothing is sent).",
            labels=["provider"],
        )
        refusals = CounterMetricFamily(
            "evq_enqueue_refusals",
            "Refused enqueues recorded by every process (the CLI, evq serve, evq mcp, evq.enqueue_own), by "
            "interface and failing field (a refusal naming two fields counts in both); read from the database "
            "(enqueue_refusals, whose counts pruning keeps). The scraped process's own refusals are "
            "evq_validation_errors_total.",
            labels=["interface", "field"],
        )
        partitions_ahead = GaugeMetricFamily(
            "evq_evidence_partitions_ahead",
            "Evidence partitions starting above the newest step id (PostgreSQL). Every worker keeps four, "
            "once a minute; at 0, new evidence lands in the overflow partition, which retention cannot drop whole.",
        )
        overflow_rows = GaugeMetricFamily(
            "evq_evidence_overflow_rows",
            "Evidence rows in the overflow partition (written when no partition covered their step), from "
            "PostgreSQL's statistics. They are pruned row by row, never dropped with a partition.",
        )
        if stats is None:
            yield from (steps, oldest_unknown, pending, held, expired, circuits, partitions_ahead, overflow_rows)
            yield GaugeHistogramMetricFamily(
                "evq_unknown_age_seconds", "Unknown rows by how long they have waited (a gauge histogram)."
            )
            yield GaugeHistogramMetricFamily("evq_pending_age_seconds", PENDING_AGE_HELP)
            yield refusals
            return
        for status in Status:
            steps.add_metric([str(status)], stats.steps[str(status)])
        oldest_unknown.add_metric([], stats.unknown_oldest_age)
        pending.add_metric([], stats.pending_oldest_age)
        held.add_metric([], stats.held_oldest_age)
        expired.add_metric([], stats.in_flight_expired)
        for provider in sorted(set(ADAPTERS) | set(stats.circuits)):
            state = CircuitState(stats.circuits.get(provider, CircuitState.CLOSED))
            circuits.add_metric([provider], STATE_VALUES[state])
        if stats.evidence_partitions_ahead is not None:
            partitions_ahead.add_metric([], stats.evidence_partitions_ahead)
        if stats.evidence_overflow_rows is not None:
            overflow_rows.add_metric([], stats.evidence_overflow_rows)
        yield from (steps, oldest_unknown, pending, held, expired, circuits, partitions_ahead, overflow_rows)
        buckets = [(floatToGoString(le), float(n)) for le, n in stats.unknown_buckets]
        buckets.append(("+Inf", float(stats.steps[str(Status.UNKNOWN)])))
        yield GaugeHistogramMetricFamily(
            "evq_unknown_age_seconds",
            "Unknown rows by how long they have waited (a gauge histogram).",
            buckets=buckets,
            gsum_value=stats.unknown_age_sum,
        )
        due = [(floatToGoString(le), float(n)) for le, n in stats.pending_buckets]
        due.append(("+Inf", float(stats.pending_due)))
        yield GaugeHistogramMetricFamily(
            "evq_pending_age_seconds", PENDING_AGE_HELP, buckets=due, gsum_value=stats.pending_age_sum
        )
        for (interface, field), total in sorted(stats.refusals.items()):
            refusals.add_metric([interface, field], float(total))
        yield refusals

    def _health(self, up: float, duration: float) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "evq_collector_up", "1 if the last scrape could read the queue gauges from the database, else 0.", value=up
        )
        yield GaugeMetricFamily(
            "evq_collector_duration_seconds", "Time the last scrape spent reading the queue gauges.", value=duration
        )


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def build_registry(*collectors: Collector | None) -> CollectorRegistry:
    """The in-process catalogue plus the given collectors, in a registry of its own."""
    registry = CollectorRegistry()
    registry.register(REGISTRY)
    for collector in collectors:
        if collector is not None:
            registry.register(collector)
    return registry


def exported_names(*collectors: Collector) -> set[str]:
    """Every series name the collectors can export (with _total, _bucket, ... suffixes), read
    through ``describe()`` where they have one, so a QueueCollector runs no query."""
    names: set[str] = set()
    suffixes = {
        "counter": ("_total", "_created"),
        "histogram": ("_bucket", "_count", "_sum", "_created"),
        "gaugehistogram": ("_bucket", "_gcount", "_gsum"),
        "summary": ("", "_count", "_sum", "_created"),
    }
    families: list[Metric] = []
    for collector in collectors:
        describe = getattr(collector, "describe", None)
        families += list(describe() if describe is not None else collector.collect())
    for family in families:
        names.add(family.name)
        names.update(family.name + suffix for suffix in suffixes.get(family.type, ()))
    return names


def render(registry: CollectorRegistry, accept: str | None = None) -> tuple[bytes, str]:
    """A scrape's body and content type (OpenMetrics when the scraper asks for it)."""
    encoder, content_type = choose_encoder(accept or "")
    return encoder(registry), content_type


def wsgi_app(registry: CollectorRegistry) -> Callable[..., Iterable[bytes]]:
    """``/metrics`` (the registry) and ``/healthz`` (200 while the process serves)."""
    metrics = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == "/metrics":
            return metrics(environ, start_response)
        if path == "/healthz":
            start_response("200 OK", [("Content-Type", "text/plain; charset=utf-8")])
            return [b"ok\n"]
        start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
        return [b"not found: try /metrics or /healthz\n"]

    return app


class _QuietHandler(WSGIRequestHandler):
    # Scrapes every few seconds would otherwise write an access line each to stderr.
    def log_message(self, format: str, *args: Any) -> None:
        return None


class MetricsServer:
    """A WSGI app served on a thread of its own; ``port`` is the bound port (for port 0)."""

    def __init__(self, app: Callable[..., Iterable[bytes]], host: str, port: int):
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        server_class = type("_Server", (ThreadingWSGIServer,), {"address_family": family})
        self._httpd = make_server(host, port, app, server_class, handler_class=_QuietHandler)
        self.host = host
        self.port: int = self._httpd.server_port
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="evq-metrics", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()
