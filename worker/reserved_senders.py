"""Whether a sender is, or reads as, one reserved for evq's own notices (Policy.reserved_senders):
case, Unicode look-alikes (other scripts' letters, hyphens, fullwidth forms), invisible
characters and a subaddress do not make it another sender, in the address or in a display name."""

from __future__ import annotations

import unicodedata
from functools import lru_cache

from evq.worker.domains import ascii_domain, ascii_form

# Characters that read as a hyphen: every dash (Pd: U+2010 hyphen, U+2011 non-breaking hyphen,
# dashes) and the minus-like signs that are not dashes to Unicode. (A soft hyphen is invisible:
# a format character, dropped with the others.)
_HYPHEN_LIKE = frozenset("\u2212\u02d7\u2043\u2796\ufe63\uff0d")
# Letters of other scripts drawn like Latin ones (a subset of Unicode's confusables, UTS #39:
# Cyrillic, Greek, Armenian, Latin small capitals and IPA), so "\u0435vq-notices" (a Cyrillic
# "e") reads as evq's sender and is compared as it. Case matters here (Greek "\u039d" looks like
# "N", its lower case "\u03bd" like "v"), so they are mapped before case folding.
_LATIN_LOOK_ALIKES = str.maketrans(
    "\u0410\u0412\u0415\u041a\u041c\u041d\u041e\u0420\u0421\u0422\u0423\u0425\u0405\u0406\u0408\u051a\u051c\u04ae\u04c0"
    "\u0430\u0435\u043e\u0440\u0441\u0443\u0445\u0455\u0456\u0458\u04bb\u0501\u051b\u051d\u04af\u04cf\u0475\u0461\u04bd"
    "\u0391\u0392\u0395\u0396\u0397\u0399\u039a\u039c\u039d\u039f\u03a1\u03a4\u03a5\u03a7"
    "\u03b1\u03bf\u03c1\u03bd\u03b9\u03ba\u03c5\u03f2\u03f3"
    "\u0251\u0261\u0131\u0269\u1d04\u1d0f\u1d1c\u1d20\u1d21\u1d22\ua731"
    "\u0585\u0578\u057d\u0566\u0570",
    "ABEKMHOPCTYXSIJQWYIaeopcyxsijhdqwylvweABEZHIKMNOPTYXaopvikucjagiicouvwzsonuqh",
)


def look_alike(text: str) -> str:
    """The form in which two strings that look the same to a reader are equal: NFKC (fullwidth
    letters, compatibility forms), letters of other scripts drawn like Latin ones made Latin, case folded, every hyphen-like character a "-", and the
    invisible (format) characters gone."""
    folded = unicodedata.normalize("NFKC", text).translate(_LATIN_LOOK_ALIKES).casefold()
    out = []
    for ch in folded:
        category = unicodedata.category(ch)
        if category == "Pd" or ch in _HYPHEN_LIKE:
            out.append("-")
        elif category != "Cf":
            out.append(ch)
    return unicodedata.normalize("NFKC", "".join(out))


def _local_matches(local: str, reserved: str) -> bool:
    # A subaddress (RFC 5233: "evq-notices+anything") is the same mailbox, and reads as it.
    # Another local part that merely starts the same ("evq-notices-team") is another sender.
    return local.split("+", 1)[0] == reserved.split("+", 1)[0]


@lru_cache(maxsize=8192)  # senders repeat: a pure function of the strings
def is_reserved(email: str, rules: tuple[str, ...]) -> bool:
    """Whether ``email`` is, or reads as, a reserved sender: case, Unicode look-alikes of the
    hyphen, fullwidth forms and a subaddress (``evq-notices+x@``) do not make it another sender."""
    local = look_alike(email).rpartition("@")[0]
    for rule in rules:
        rule_local, _, rule_domain = look_alike(rule).rpartition("@")
        if not _local_matches(local, rule_local):
            continue
        if not rule_domain or ascii_domain(email) == ascii_form(rule_domain):
            return True
    return False


@lru_cache(maxsize=8192)
def name_impersonates(name: str | None, rules: tuple[str, ...]) -> bool:
    """Whether a display name shows a reserved sender (``"evq-notices@host" <x@y>``): readers see
    the name, not the address. A rule for a local part at every domain is evq's own name, refused
    anywhere in a name; a rule for one address is refused as that local part followed by "@"."""
    if not name:
        return False
    shown = "".join(look_alike(name).split())
    for rule in rules:
        rule_local, _, rule_domain = look_alike(rule).rpartition("@")
        if rule_local and (rule_local + "@" in shown or (not rule_domain and rule_local in shown)):
            return True
    return False
