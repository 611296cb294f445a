"""Reading one field of a request: the errors collected field by field, and the checks every
text field shares (a string, no NUL, one line where it is a header, within its limit, no
unpaired surrogate, NFC), used by worker/request.py and worker/addresses.py."""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from evq.worker.header_text import CONTROL, encoded_word_refusal


class FieldErrors:
    def __init__(self) -> None:
        self.items: list[dict[str, str]] = []

    def add(self, field_name: str, message: str) -> None:
        self.items.append({"field": field_name, "message": message})


class PrefixedErrors(FieldErrors):
    """Adds a prefix to field names so nested objects report ``decision.model``."""

    def __init__(self, inner: FieldErrors, prefix: str):
        self.inner, self.prefix = inner, prefix

    def add(self, field_name: str, message: str) -> None:
        self.inner.add(self.prefix + field_name, message)


def encodable(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def type_name(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), "number" if isinstance(value, (int, float)) else type(value).__name__
    )


def string_field(data: Mapping[str, Any], name: str, errors: FieldErrors, *, required: bool) -> str | None:
    """The field as a string; None (with an error where due) when absent or not a string."""
    value = data.get(name)
    if value is None:
        if required:
            errors.add(name, "required")
        return None
    if not isinstance(value, str):
        errors.add(name, f"must be a string, got {type_name(value)}")
        return None
    return value


def text_field(
    data: Mapping[str, Any], name: str, errors: FieldErrors, *, required: bool, limit: int | None, single_line: bool
) -> str | None:
    value = string_field(data, name, errors, required=required)
    if value is None:
        return None
    if "\x00" in value:
        errors.add(name, "contains a NUL character")
        return None
    if single_line and CONTROL.search(value):
        errors.add(name, "must be one line: CR, LF and control characters are not allowed")
        return None
    if single_line and (refusal := encoded_word_refusal(value)):
        errors.add(name, refusal)
        return None
    if limit is not None and len(value) > limit:
        errors.add(name, f"longer than {limit} characters")
        return None
    if required and not value.strip():
        errors.add(name, "must not be empty")
        return None
    if not encodable(value):
        errors.add(name, "contains an unpaired surrogate")
        return None
    return unicodedata.normalize("NFC", value)


def timestamp(value: Any) -> datetime | None:
    if not isinstance(value, str) or len(value) > 64:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else None
