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
    return {name: _bare(_INCLUDE.sub(lambda m: queries[m.group(1)], body)) for name, body in queries.items()}


# A query whose text has these is kept as written: dollar quoting and E'' strings (backslash
# escapes) are where a `--` or a line break could sit inside a literal that the scan below
# does not follow.
_OPAQUE = re.compile(r"\$\w*\$|\b[eE]'")


def _bare(sql: str) -> str:
    """``sql`` without its comments (each `--` to the end of its line, outside quotes) and its
    blank lines. The comments say why, for the reader of queries.sql; sent, they cost every call
    twice: the bytes on the wire, and psycopg's parse of the text for its placeholders, which it
    caches only for a text under 4 KB (``step_enqueue``'s comments took it past that, so each
    enqueue parsed 5 KB again). A `%(name)s` in a comment was a placeholder to psycopg too."""
    if _OPAQUE.search(sql):
        return sql
    out: list[str] = []
    quote: str | None = None  # the quote character we are inside, if any
    i, n = 0, len(sql)
    while i < n:
        c = sql[i]
        if quote is not None:
            out.append(c)
            if c == quote:
                quote = None  # a doubled quote ('') closes and reopens: the same text
        elif c in "'\"":
            quote = c
            out.append(c)
        elif c == "-" and sql.startswith("--", i):
            end = sql.find("\n", i)
            i = n if end < 0 else end
            continue
        else:
            out.append(c)
        i += 1
    if quote is not None:
        return sql  # unbalanced: not a text this scan understands
    return "\n".join(line.rstrip() for line in "".join(out).splitlines() if line.strip())


Q: dict[str, str] = _load()
