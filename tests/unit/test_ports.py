"""The ports stay one place and one shape: every Protocol lives in worker/ports/, the full
Store is the union of the roles, and the PostgreSQL store has every method a port names."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from evq.adapters.postgres.store import PostgresStore
from evq.worker import ports

ROOT = Path(__file__).resolve().parents[2]


def _members(protocol: type) -> set[str]:
    """The methods and attributes a protocol (with the protocols it extends) declares."""
    names: set[str] = set()
    for cls in protocol.__mro__:
        if cls is object or not getattr(cls, "_is_protocol", False) or cls.__module__ == "typing":
            continue
        names |= {n for n in vars(cls) if not n.startswith("_")}
        names |= set(getattr(cls, "__annotations__", {}))
    return names


def _roles() -> list[type]:
    """The store's roles: the port modules' protocols that a store implements."""
    return [
        ports.ClaimStore,
        ports.RecordStore,
        ports.RescueStore,
        ports.CircuitReader,
        ports.CircuitStore,
        ports.RateStore,
        ports.ReconcileStore,
        ports.PruneStore,
        ports.RedactStore,
        ports.EnqueueStore,
        ports.StepReader,
        ports.ResolveStore,
        ports.ApprovalStore,
        ports.ExpireStore,
        ports.KeyLookup,
        ports.RefusalStore,
        ports.EventFeed,
        ports.DeliveryStore,
        ports.SampleStore,
        ports.ChartReader,
    ]


def test_store_is_the_union_of_the_roles_and_so_are_its_parts():
    union = set().union(*(_members(role) for role in _roles()))
    assert _members(ports.Store) == union
    assert _members(ports.WorkerStore) | _members(ports.AppStore) | _members(ports.PruneStore) == union
    assert "find_by_key" in _members(ports.AppStore) and "key_by_id" in _members(ports.AppStore)
    assert "claim" in _members(ports.WorkerStore) and "claim" not in _members(ports.AppStore)


@pytest.mark.parametrize("name", sorted(_members(ports.Store)))
def test_the_postgres_store_has_each_store_method_with_its_parameters(name):
    port = inspect.signature(getattr(ports.Store, name))
    real = inspect.signature(getattr(PostgresStore, name))
    for param in port.parameters.values():
        assert param.name in real.parameters, f"PostgresStore.{name} lacks {param.name}"
        other = real.parameters[param.name]
        assert other.kind == param.kind, f"PostgresStore.{name}({param.name}) is {other.kind}, the port's {param.kind}"
        if param.default is not inspect.Parameter.empty:
            assert other.default is not inspect.Parameter.empty, f"PostgresStore.{name}({param.name}) has no default"
    extra = [
        p.name
        for p in real.parameters.values()
        if p.name not in port.parameters and p.default is inspect.Parameter.empty
    ]
    assert not extra, f"PostgresStore.{name} requires {extra}, which the port never passes"
    assert inspect.iscoroutinefunction(getattr(PostgresStore, name))


def _protocols(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ClassDef):
            for base in node.bases:
                name = base.id if isinstance(base, ast.Name) else getattr(base, "attr", None)
                if name == "Protocol":
                    found.append(node.name)
    return found


def test_every_protocol_is_a_port():
    """A second Store, or a role's protocol beside its consumer, is how the ports drifted apart before."""
    outside = {
        str(path.relative_to(ROOT)): names
        for top in ("worker", "adapters", "ops", "evq")
        for path in sorted((ROOT / top).rglob("*.py"))
        if "ports" not in path.relative_to(ROOT).parts and (names := _protocols(path))
    }
    assert outside == {}
    exported = set(ports.__all__)
    for path in sorted((ROOT / "worker" / "ports").glob("*.py")):
        assert set(_protocols(path)) <= exported, f"{path.name} has a protocol evq.worker.ports does not export"


def test_the_wheel_lists_every_subpackage():
    """setuptools takes the explicit package list as it is: a subpackage missing from it (the
    ports were one module once) is missing from the wheel while a checkout still imports it."""
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    for package, folder in config["package-dir"].items():
        for init in (ROOT / folder).rglob("__init__.py"):
            parts = init.parent.relative_to(ROOT / folder).parts
            assert ".".join((package, *parts)) in listed, f"{init.parent.relative_to(ROOT)} is not in the wheel"
