"""``any_store``: every conformance test runs once against the in-memory store (tests/memstore.py)
and once against PostgreSQL (the ``store`` fixture of tests/conftest.py, a fresh database)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.memstore import MemoryStore


@pytest.fixture(params=["memory", "postgres"])
def any_store(request: pytest.FixtureRequest) -> Any:
    # Synchronous: pytest-asyncio sets the async `store` fixture up on its own loop turn.
    if request.param == "memory":
        return MemoryStore()
    return request.getfixturevalue("store")
