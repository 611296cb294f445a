"""The search box's one string, read once into the forms each field is matched in.

Both stores (adapters/postgres's step_list and the tests' in-memory fake) match with these
forms, so what a search finds cannot differ between them. See docs/design.md, "Search".
"""

from __future__ import annotations

from dataclasses import dataclass

from evq.worker.domains import unicode_domain

SEARCH_MAX = 320  # an address's length limit (254) with room to spare; longer finds nothing
# A subject filter's longest string: a subject is a line of text (RFC 5322's 998 characters, a
# person's search is a few words of it); longer finds nothing worth the read.
SUBJECT_MAX = 200
MAX_ID = 2**63 - 1  # a step id is a bigint


@dataclass(frozen=True, slots=True)
class SearchTerms:
    """``text``: the trimmed string, matched as it is against the provider message id, the
    idempotency key, the run id and the enqueuing key's name. ``step_id``: the string as a step
    id, when it is all digits and fits a bigint. ``recipient``: the recipient key it names (as
    ``evq_recipient_keys`` spells them: an address lower-cased, a domain as ``@domain``), when
    it looks like one. ``message_id``: the Message-ID in its stored form (``<...>``), when it
    could be one."""

    text: str
    step_id: int | None
    recipient: str | None
    message_id: str | None


def search_terms(raw: str) -> SearchTerms:
    text = raw.strip()
    step_id = int(text) if text.isascii() and text.isdigit() and int(text) <= MAX_ID else None
    return SearchTerms(text=text, step_id=step_id, recipient=_recipient(text), message_id=_message_id(text))


def _recipient(text: str) -> str | None:
    """``bob@example.com``, ``@example.com`` and a bare ``example.com`` (a dot, no ``@``: a
    domain); the domain in the stored form (Unicode, lower case), so an ``xn--`` form pasted
    from a log finds the address it stands for."""
    if any(c.isspace() or c in "<>" for c in text) or text.count("@") > 1:
        return None
    local, at, domain = text.rpartition("@")
    if not at:
        local, domain = "", text
        if "." not in domain:
            return None
    if not domain or domain.startswith(".") or domain.endswith("."):
        return None
    return f"{local.lower()}@{unicode_domain(domain)}"


def _message_id(text: str) -> str | None:
    """With or without its angle brackets: ``<a@b>`` and ``a@b`` are the same Message-ID."""
    inner = text[1:-1] if text.startswith("<") and text.endswith(">") else text
    local, _, domain = inner.partition("@")
    if not local or not domain or "@" in domain or any(c in "<>" or c.isspace() for c in inner):
        return None
    return f"<{inner}>"
