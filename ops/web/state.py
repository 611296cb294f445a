"""What the routes of `evq serve` share, built once at startup."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

from prometheus_client import CollectorRegistry

from evq.ops.app.waiting import WaitSlots
from evq.ops.settings import Settings
from evq.ops.web.session import Sessions
from evq.ops.web.throttle import FailureThrottle
from evq.worker.request import Policy


@dataclass
class AppState:
    settings: Settings
    store: Any  # adapters.postgres.store.PostgresStore (worker.ports.AppStore)
    registry: CollectorRegistry
    sessions: Sessions
    read_stats: Any  # Callable[[], QueueStats] for the page's overview
    throttle: FailureThrottle  # failed key checks per client address (HTTP API and sign-in)
    health: Any = None  # ops.app.health.HealthReader for GET /v1/health (ops/wiring.py's health_reader)
    # Provider name -> its webhook receiver (worker/ports/webhooks.py), only the configured ones.
    webhooks: Any = None
    # Unsigned or badly signed webhook requests per client address (ops/web/webhooks.py): a
    # throttle of its own, so a forger behind a shared proxy cannot lock the API's keys out.
    webhook_throttle: FailureThrottle | None = None

    @cached_property
    def wait_slots(self) -> WaitSlots:
        # A quarter of the connections `evq serve` accepts may wait, eight per key (?wait=).
        return WaitSlots(total=max(8, self.settings.serve_max_connections // 4), per_caller=8)

    @cached_property
    def policy(self) -> Policy:
        # The settings do not change while `evq serve` runs: the policy (with every provider's
        # profile) is worked out once, not on every enqueue.
        return self.settings.policy()
