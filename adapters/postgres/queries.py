"""Named SQL from queries.sql, looked up by name (``Q["step_claim"]``)."""

from __future__ import annotations

import re
from importlib import resources

_NAME = re.compile(r"^--\s*name:\s*(\w+)\s*$", re.MULTILINE)
# A line `-- include: other` stands for the named query's whole text, so a statement built
# on another (the queue sampler on the collector's queue_stats) reuses it instead of a copy.
_INCLUDE = re.compile(r"^--\s*include:\s*(\w+)\s*$", re.MULTILINE)


def _load() -> dict[str, str]:
    text = resources.files(__package__).joinpath("queries.sql").read_text(encoding="utf-8")
    parts = _NAME.split(text)
    queries: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in queries:
            raise RuntimeError(f"queries.sql names {name!r} twice")
        queries[name] = body.strip().rstrip(";").strip()
    return {name: _INCLUDE.sub(lambda m: queries[m.group(1)], body) for name, body in queries.items()}


Q: dict[str, str] = _load()
