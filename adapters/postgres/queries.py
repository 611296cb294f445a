"""Named SQL from queries.sql, looked up by name (``Q["step_claim"]``)."""

from __future__ import annotations

import re
from importlib import resources

_NAME = re.compile(r"^--\s*name:\s*(\w+)\s*$", re.MULTILINE)


def _load() -> dict[str, str]:
    text = resources.files(__package__).joinpath("queries.sql").read_text(encoding="utf-8")
    parts = _NAME.split(text)
    queries: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in queries:
            raise RuntimeError(f"queries.sql names {name!r} twice")
        queries[name] = body.strip().rstrip(";").strip()
    return queries


Q: dict[str, str] = _load()
