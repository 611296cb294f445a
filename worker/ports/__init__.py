"""The core's ports, one module per role. Adapters implement them; the core never imports an adapter.

Each part of the core asks for the role it uses, so a test fake implements only that:

- :mod:`.queue`: claim, record and hand back rows (the runner, the recorder), and rescue them;
- :mod:`.circuits`: the providers' circuits (the worker changes them, the interfaces read them);
- :mod:`.rates`: the shared rate limits; :mod:`.reconcile`: settling unknown rows;
  :mod:`.prune`: retention; :mod:`.redact`: content retention;
  :mod:`.refusals`: refused enqueues, recorded and read;
- :mod:`.approvals`: approve, deny, cancel held sends and expire them;
- :mod:`.steps`: enqueue, read back and resolve steps, what the application layer
  (ops/app/service/) does; :mod:`.keys`: the API keys it checks; :mod:`.events`: each
  key's event feed; :mod:`.callbacks`: the signed callbacks of that feed (the worker's
  callback service, given the store and a poster apart from the Store union);
  :mod:`.deliveries`: providers' delivery events (webhooks), stored, matched and read;
- :mod:`.providers`: an email provider (:class:`Provider`) and its optional :class:`Lookup`;
- :mod:`.wakeup`: LISTEN/NOTIFY for the claim loop; :mod:`.services`: what runs periodically;
- :mod:`.health`: what the health gate reads (``evq admin health``);
- :mod:`.charts`: the queue sampler's write and the overview's windowed reads.

:class:`WorkerStore` is what a worker is given, :class:`AppStore` what every interface is
given, and :class:`Store` is every store role in one: the PostgreSQL store
(adapters/postgres/store.py) satisfies it, and the conformance suite (tests/conformance/)
holds it to these ports.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from evq.worker.ports.approvals import ApprovalStore, Decided, Edit, ExpireStore
from evq.worker.ports.callbacks import CallbackStore, Poster
from evq.worker.ports.charts import ChartReader, SampleStore
from evq.worker.ports.circuits import CircuitReader, CircuitStore
from evq.worker.ports.deliveries import DeliveryRecorded, DeliveryStore
from evq.worker.ports.events import EventFeed
from evq.worker.ports.health import HealthReader
from evq.worker.ports.keys import KeyLookup
from evq.worker.ports.providers import (
    Lookup,
    LookupFailed,
    LookupResult,
    Provider,
    ProviderProfile,
    SendRequest,
    profile_of,
)
from evq.worker.ports.prune import PruneStore
from evq.worker.ports.queue import ClaimStore, RecordStore, RescueStore
from evq.worker.ports.rates import RateStore
from evq.worker.ports.reconcile import ReconcileStore
from evq.worker.ports.redact import RedactStore
from evq.worker.ports.refusals import RefusalStore
from evq.worker.ports.services import Service
from evq.worker.ports.steps import (
    COUNT_CAP,
    SUBJECT_SCAN_CAP,
    EnqueueStore,
    ResolveStore,
    StatusCount,
    StepFilter,
    StepReader,
    SubjectPage,
)
from evq.worker.ports.wakeup import Wakeup

__all__ = [
    "COUNT_CAP",
    "SUBJECT_SCAN_CAP",
    "AppStore",
    "ApprovalStore",
    "CallbackStore",
    "ChartReader",
    "CircuitReader",
    "CircuitStore",
    "ClaimStore",
    "Decided",
    "DeliveryRecorded",
    "DeliveryStore",
    "Edit",
    "EnqueueStore",
    "EventFeed",
    "ExpireStore",
    "HealthReader",
    "KeyLookup",
    "Lookup",
    "LookupFailed",
    "LookupResult",
    "Poster",
    "Provider",
    "ProviderProfile",
    "PruneStore",
    "RateStore",
    "ReconcileStore",
    "RecordStore",
    "RedactStore",
    "RefusalStore",
    "RescueStore",
    "ResolveStore",
    "SampleStore",
    "SendRequest",
    "Service",
    "StatusCount",
    "StepFilter",
    "StepReader",
    "Store",
    "SubjectPage",
    "Wakeup",
    "WorkerStore",
    "profile_of",
]


class WorkerStore(
    ClaimStore,
    RecordStore,
    RescueStore,
    CircuitStore,
    RateStore,
    ReconcileStore,
    RedactStore,
    ExpireStore,
    SampleStore,
    Protocol,
):
    """What worker/runner.py needs: its claim loop and every service it runs (the queue sampler too)."""


class AppStore(
    EnqueueStore,
    StepReader,
    ResolveStore,
    ApprovalStore,
    CircuitReader,
    KeyLookup,
    RefusalStore,
    EventFeed,
    DeliveryStore,
    ChartReader,
    Protocol,
):
    """What the interfaces need, through ops/app/service/."""


@runtime_checkable
class Store(WorkerStore, AppStore, PruneStore, Protocol):
    """Every role of the store in one."""
