"""The in-memory store has every method the core's store ports name, with their parameters,
as tests/unit/test_ports.py checks for PostgresStore: a method the fake lacks or names
differently would fail here, not in the middle of a core test."""

from __future__ import annotations

import inspect

import pytest

from evq.worker.keys import KeyLookup
from evq.worker.ports import Store
from evq.worker.ratelimit import RateStore
from evq.worker.reconciler import ReconcileStore
from evq.worker.recorder import RecordStore
from evq.worker.rescuer import RescueStore
from tests.memstore import MemoryStore

ROLES = (Store, RecordStore, RescueStore, ReconcileStore, RateStore, KeyLookup)


def _members(protocol: type) -> set[str]:
    names: set[str] = set()
    for cls in protocol.__mro__:
        if cls is object or not getattr(cls, "_is_protocol", False) or cls.__module__ == "typing":
            continue
        names |= {n for n in vars(cls) if not n.startswith("_") and callable(vars(cls)[n])}
    return names


METHODS = sorted({(role.__name__, name) for role in ROLES for name in _members(role)})


def test_it_is_a_store():
    assert isinstance(MemoryStore(), Store)


@pytest.mark.parametrize(("role", "name"), METHODS)
def test_each_port_method_is_there_with_its_parameters(role, name):
    protocol = next(r for r in ROLES if r.__name__ == role)
    port = inspect.signature(getattr(protocol, name))
    mine = inspect.signature(getattr(MemoryStore, name))
    for param in port.parameters.values():
        assert param.name in mine.parameters, f"MemoryStore.{name} lacks {param.name}"
        other = mine.parameters[param.name]
        assert other.kind == param.kind, f"MemoryStore.{name}({param.name}) is {other.kind}, the port's {param.kind}"
        if param.default is not inspect.Parameter.empty:
            assert other.default is not inspect.Parameter.empty, f"MemoryStore.{name}({param.name}) has no default"
    extra = [p.name for p in mine.parameters.values() if p.name not in port.parameters and p.default is p.empty]
    assert not extra, f"MemoryStore.{name} requires {extra}, which the port never passes"
    assert inspect.iscoroutinefunction(getattr(MemoryStore, name))
