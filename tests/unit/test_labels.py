"""The contract's _key/_label pairs and integer durations (ops/app/labels.py, contract.py)."""

from __future__ import annotations

import time

from evq.ops.app.contract import Timer
from evq.ops.app.labels import REASON_LABELS, STATE_LABELS, STATUS_LABELS, with_labels
from evq.ops.app.service import circuit_view
from evq.worker.circuit import CONSECUTIVE_FAILURES, FAULTS, PROBE_INCONCLUSIVE, CircuitState
from evq.worker.states import Reason, Status


def test_every_machine_key_has_a_label():
    assert set(STATUS_LABELS) == set(Status)
    assert set(STATE_LABELS) == set(CircuitState)
    assert {*Reason, *FAULTS, CONSECUTIVE_FAILURES, PROBE_INCONCLUSIVE} == set(REASON_LABELS)
    assert STATUS_LABELS[Status.IN_FLIGHT] == "in flight"


def test_labels_sit_beside_the_keys_and_the_keys_stay():
    row = with_labels({"status": "in_flight", "reason": None, "subject": "hi"})
    assert row == {"status": "in_flight", "status_label": "in flight", "reason": None, "reason_label": None} | {
        "subject": "hi"
    }
    # A key a newer evq wrote is shown as itself, never dropped.
    assert with_labels({"reason": "from_the_future"})["reason_label"] == "from_the_future"


def test_durations_are_whole_numbers():
    timer = Timer()
    time.sleep(0.0021)
    assert type(timer.meta()["duration_ms"]) is int and timer.meta()["duration_ms"] >= 2
    view = circuit_view("smtp", {"state": "open", "reason": "tls_failed", "open_for": 12.7, "probe_in": 0.2})
    assert (view["open_for_seconds"], view["next_probe_in_seconds"]) == (12, 1)
    assert (view["state_label"], view["reason_label"]) == (STATE_LABELS["open"], REASON_LABELS["tls_failed"])
