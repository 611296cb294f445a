"""One address of a request, parsed strictly: ``addr@domain``, ``Name <addr@domain>`` or
``{"email": ..., "name": ...}``, checked by email_validator (with a shortcut for the plain
shape that gives its answer from its cached verdict on the domain), the operator's internal
domains allowed (EVQ_INTERNAL_DOMAINS). A display name is kept as data, never as header text."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any, TypedDict

from email_validator import EmailNotValidError, validate_email
from email_validator.rfc_constants import CASE_INSENSITIVE_MAILBOX_NAMES, DOT_ATOM_TEXT

from evq.worker.domains import checked_domain, domain_refusal
from evq.worker.errors import InvalidRequest
from evq.worker.field_checks import FieldErrors, encodable, type_name
from evq.worker.header_text import CONTROL_OR_TAB, encoded_word_refusal

if TYPE_CHECKING:
    from evq.worker.request import Policy

MAX_NAME = 200
_ANGLE_FORM = re.compile(r"^(?P<name>[^<>]*)<(?P<addr>[^<>]+)>$")


class Address(TypedDict):
    """One address of a request's payload, as it is stored: normalized, with its display name."""

    email: str
    name: str | None


def _address(raw: Any, where: str, errors: FieldErrors, internal: tuple[str, ...] = ()) -> Address | None:
    name: Any = None
    if isinstance(raw, Mapping):
        extra = set(raw) - {"email", "name"}
        if extra:
            errors.add(where, f"unknown field(s) {sorted(map(str, extra))}")
            return None
        addr, name = raw.get("email"), raw.get("name")
        if not isinstance(addr, str):
            errors.add(where, "email must be a string")
            return None
        if name is not None and not isinstance(name, str):
            errors.add(where, "name must be a string")
            return None
    elif isinstance(raw, str):
        match = _ANGLE_FORM.match(raw.strip())
        if match:
            name = match["name"].strip()
            if len(name) >= 2 and name[0] == name[-1] == '"':
                name = name[1:-1].replace('\\"', '"').replace("\\\\", "\\")
            addr = match["addr"].strip()
        else:
            addr = raw.strip()
    else:
        errors.add(where, f"must be an address string or {{email, name}} object, got {type_name(raw)}")
        return None
    if name is not None:
        if CONTROL_OR_TAB.search(name) or not encodable(name):
            errors.add(where, "display name contains control characters or unpaired surrogates")
            return None
        if refusal := encoded_word_refusal(name):
            errors.add(where, f"display name: {refusal}")
            return None
        if len(name) > MAX_NAME:
            errors.add(where, f"display name longer than {MAX_NAME} characters")
            return None
        name = unicodedata.normalize("NFC", name.strip()) or None
    if refusal := encoded_word_refusal(addr):
        # Valid atext ("=?utf-8?q?=0D=0A?=@example.com"), and lenient decoders decode it anyway.
        errors.add(where, f"address: {refusal}")
        return None
    normalized, problem = _checked_address(addr, internal)
    if problem is not None:
        errors.add(where, f"not a valid address: {problem}")
        return None
    return {"email": normalized, "name": name}


@lru_cache(maxsize=8192)
def _checked_address(addr: str, internal: tuple[str, ...] = ()) -> tuple[str, str | None]:
    """email_validator's verdict on one address (normalized form, or why not).

    A pure function of the string, and most of a request's validation time (IDNA
    tables): senders and recipients repeat, so each is checked once per process.
    Recipients often do not repeat while their domains do; :func:`_plain_address`
    then gives email_validator's answer from its cached verdict on the domain.
    """
    plain = _plain_address(addr)
    if plain is not None:
        return plain, None
    try:
        return validate_address(addr, internal).normalized, None
    except (EmailNotValidError, UnicodeError, ValueError) as exc:
        return "", str(exc)


# Appended to an internal domain for email_validator's syntax checks, then removed:
# its special-use list cannot be narrowed per call (and a module-wide change would
# open every special-use domain to every caller). "example" is not special to it.
_INTERNAL_SUFFIX = ".example"


@dataclass(frozen=True, slots=True)
class CheckedAddress:
    normalized: str
    local_part: str
    domain: str
    ascii_domain: str


def validate_address(addr: str, internal: tuple[str, ...] = ()) -> CheckedAddress:
    """email_validator's verdict on one address, with the operator's internal domains allowed.

    An address at an internal domain gets every other check (local part, label syntax,
    lengths, which the suffix makes at most a few octets stricter); only the
    special-use refusal is skipped, and only for the domains named."""
    domain = addr.rpartition("@")[2].strip().lower().rstrip(".")
    rules = (rule.strip().lstrip(".").lower() for rule in internal)
    if internal and any(rule and (domain == rule or domain.endswith("." + rule)) for rule in rules):
        valid = validate_email(addr + _INTERNAL_SUFFIX, check_deliverability=False)
        cut = len(_INTERNAL_SUFFIX)
        return CheckedAddress(valid.normalized[:-cut], valid.local_part, valid.domain[:-cut], valid.ascii_domain[:-cut])
    valid = validate_email(addr, check_deliverability=False)
    return CheckedAddress(valid.normalized, valid.local_part, valid.domain, valid.ascii_domain)


# The shape for which email_validator's result is the local part unchanged, "@", and
# its normalized domain: an unquoted ASCII dot-atom before the one @-sign (which it
# returns as given), and after it only hostname characters (so the split is the same
# as for any other local part). Everything else goes to email_validator whole.
_PLAIN_LOCAL = DOT_ATOM_TEXT
_HOSTNAME = re.compile(r"[a-zA-Z0-9.\-\u0080-\U0010FFFF]+\Z")
_MAX_ADDRESS_BYTES = 254  # RFC 3696 errata 1690, as email_validator checks it


def _plain_address(addr: str) -> str | None:
    """The normalized address when it has the plain shape and its domain is valid; else None."""
    local, at, domain = addr.partition("@")
    if not at or not _PLAIN_LOCAL.match(local) or not _HOSTNAME.match(domain):
        return None
    if local.lower() in CASE_INSENSITIVE_MAILBOX_NAMES:
        return None  # email_validator lowercases these: let it
    names = checked_domain(domain)
    if names is None:
        return None  # let email_validator say why
    normalized = f"{local}@{names[0]}"
    # The three lengths email_validator checks; over the limit, it says by how much.
    for form in (addr, normalized, f"{local}@{names[1]}"):
        if len(form.encode()) > _MAX_ADDRESS_BYTES:
            return None
    return normalized


def address_list(
    data: Mapping[str, Any], name: str, errors: FieldErrors, internal: tuple[str, ...] = ()
) -> list[Address]:
    value = data.get(name)
    if value is None:
        return []
    if isinstance(value, (str, Mapping)):
        value = [value]
    if not isinstance(value, list):
        errors.add(name, f"must be a list of addresses, got {type_name(value)}")
        return []
    out = []
    for i, raw in enumerate(value[:1000]):
        addr = _address(raw, f"{name}[{i}]", errors, internal)
        if addr is not None:
            out.append(addr)
    if len(value) > 1000:
        errors.add(name, "too many addresses")
    return out


def notify_address(raw: Any, policy: Policy, field_name: str = "notify") -> str:
    """One address a notice may go to (a key's default target), checked as a request's
    ``notify`` is: one address, under the same domain rules. InvalidRequest otherwise."""
    errors = FieldErrors()
    addr = _address(raw, field_name, errors, policy.internal_domains)
    if addr and (refusal := domain_refusal(addr["email"], policy)):
        errors.add(field_name, refusal)
    if errors.items or addr is None:
        raise InvalidRequest(errors.items or [{"field": field_name, "message": "not an email address"}])
    return addr["email"]


def single_address(
    data: Mapping[str, Any], name: str, errors: FieldErrors, *, default: str | None, internal: tuple[str, ...] = ()
) -> Address | None:
    raw = data.get(name, default)
    if raw is None:
        if name == "from":
            errors.add("from", "required (or configure a default sender with EVQ_DEFAULT_FROM)")
        return None
    return _address(raw, name, errors, internal)


def each_recipient(*lists: list[Address]) -> Iterator[tuple[str, Address]]:
    for list_name, items in zip(("to", "cc", "bcc"), lists, strict=True):
        for i, addr in enumerate(items):
            yield f"{list_name}[{i}]", addr
