"""The application layer: what every interface does, in one place.

The CLI (ops/cli), the HTTP API and the ops page (ops/web) and the MCP server
(ops/mcp/server.py) all call these functions with a store and plain parameters, and
get back a :class:`Reply` (the contract's ``data``, ``meta`` and ``status``) or an
:class:`~worker.errors.EvqError`. Which key role an operation needs is decided here,
so no interface can grant more than another.

One module per command group: common.py (the caller, the answer, the field tables and
filters), enqueue.py (steps enqueue), steps.py (steps list/show, runs show), operators.py
(steps resolve), feeds.py (refusals, events, deliveries), providers.py (providers list),
policy.py (policy show). This package re-exports what the interfaces call, so they keep
writing ``service.list_steps``.
"""

from __future__ import annotations

from evq.ops.app.service.common import (
    DECISION_FIELDS,
    FILTER_MAX_LENGTH,
    FILTER_NAMES,
    FILTERS,
    HEADERS_HELP,
    LIST_LIMIT_MAX,
    MAX_ATTEMPTS_HELP,
    MAX_ID,
    PRIORITY_HELP,
    REQUEST_FIELDS,
    REQUIRE_APPROVAL_HELP,
    SEND_AT_HELP,
    Caller,
    Reply,
    json_field_names,
    total_meta,
    verdict_view,
)
from evq.ops.app.service.enqueue import WAIT_MAX, enqueue, record_refusal, validate_requests
from evq.ops.app.service.feeds import EVENTS_LIMIT_MAX, list_deliveries, list_events, list_refusals, receive_deliveries
from evq.ops.app.service.operators import Selection, resolve
from evq.ops.app.service.policy import show_policy
from evq.ops.app.service.providers import circuit_view, list_providers
from evq.ops.app.service.steps import count_by_status, list_steps, search_text, show_run, show_step, show_steps

__all__ = [
    "DECISION_FIELDS",
    "EVENTS_LIMIT_MAX",
    "FILTERS",
    "FILTER_MAX_LENGTH",
    "FILTER_NAMES",
    "HEADERS_HELP",
    "LIST_LIMIT_MAX",
    "MAX_ATTEMPTS_HELP",
    "MAX_ID",
    "PRIORITY_HELP",
    "REQUEST_FIELDS",
    "REQUIRE_APPROVAL_HELP",
    "SEND_AT_HELP",
    "WAIT_MAX",
    "Caller",
    "Reply",
    "Selection",
    "circuit_view",
    "count_by_status",
    "enqueue",
    "json_field_names",
    "list_deliveries",
    "list_events",
    "list_providers",
    "list_refusals",
    "list_steps",
    "receive_deliveries",
    "record_refusal",
    "resolve",
    "search_text",
    "show_policy",
    "show_run",
    "show_step",
    "show_steps",
    "total_meta",
    "validate_requests",
    "verdict_view",
]
