"""The core's behaviour tests: the worker, recorder, rescuer, reconciler and circuit breaker
against the in-memory store (tests/memstore.py), which tests/conformance holds to PostgreSQL's
behaviour. No database: with tests/unit this is the fast suite (`pytest tests/core tests/unit`)."""

from __future__ import annotations

import pytest

from tests.memstore import MemoryStore


@pytest.fixture
def mem() -> MemoryStore:
    return MemoryStore()
