"""The metric names a PromQL expression reads (enough PromQL for our dashboards and rules)."""

from __future__ import annotations

import re

_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGES = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_IDENT = re.compile(r"(?<![\w.$])[A-Za-z_:][A-Za-z0-9_:]*")
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan"}


def metric_names(expr: str) -> set[str]:
    text = _GROUPING.sub(" ", _RANGES.sub(" ", _MATCHERS.sub(" ", _STRINGS.sub('""', expr))))
    names = set()
    for match in _IDENT.finditer(text):
        followed_by = text[match.end() :].lstrip()[:1]
        if followed_by == "(" or match.group().lower() in _KEYWORDS:
            continue  # a function, an aggregation, or an operator
        names.add(match.group())
    return names
