"""Domains as a message is sent to them (IDNA 2008, email_validator's forms), and the
installation's allowed and blocked domains (EVQ_ALLOWED_DOMAINS, EVQ_BLOCKED_DOMAINS)."""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING

from email_validator import EmailNotValidError, validate_email

if TYPE_CHECKING:
    from evq.worker.request import Policy


@lru_cache(maxsize=8192)
def checked_domain(domain: str) -> tuple[str, str] | None:
    """email_validator's (normalized, ASCII) forms of a domain, or None if it refuses it."""
    try:
        checked = validate_email(f"a@{domain}", check_deliverability=False)
    except (EmailNotValidError, UnicodeError, ValueError):
        return None
    return checked.domain, checked.ascii_domain


def ascii_domain(email: str) -> str:
    return ascii_form(email.rsplit("@", 1)[1])


@lru_cache(maxsize=8192)
def ascii_form(domain: str) -> str:
    """The domain as a message is sent to it: email_validator's IDNA 2008 form, as the
    adapters use. Python's own "idna" codec is IDNA 2003, which maps ß, ς and joiners
    differently (straße.example -> strasse.example, not xn--strae-oqa.example): a domain
    rule checked in that form could be dodged, or could admit a different domain."""
    names = checked_domain(domain)
    return names[1].lower() if names else domain.lower()


def unicode_domain(domain: str) -> str:
    """A domain as stored in a normalized address (Unicode, lower case), whichever form it is
    given in: ``xn--bcher-kva.example`` and ``BÜCHER.example`` are both ``bücher.example``.
    It is email_validator's normalized form, the one that normalized the stored addresses."""
    names = checked_domain(domain)
    return names[0] if names else domain.lower()


def _domain_matches(domain: str, rule: str) -> bool:
    rule = ascii_form(rule.strip().lstrip("."))  # a rule may be written in either form
    return domain == rule or domain.endswith("." + rule)


def domain_refusal(email: str, policy: Policy) -> str | None:
    domain = ascii_domain(email)
    if any(_domain_matches(domain, rule) for rule in policy.blocked_domains):
        return f"recipient domain {domain} is blocked"
    if policy.allowed_domains and not any(_domain_matches(domain, rule) for rule in policy.allowed_domains):
        return f"recipient domain {domain} is not in the allowed domains"
    return None
