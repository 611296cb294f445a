"""What may become header text: no CR, LF or control character, and no RFC 2047 encoded word.

The request's validator (worker/request.py) refuses both in every field that becomes header
text (subject, display names, addresses, header values), and the adapters check a header
line once more with :func:`header_text_refusal` before they write it.
"""

from __future__ import annotations

import base64
import binascii
import re

CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]")  # tab allowed
CONTROL_OR_TAB = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")

# -- RFC 2047 encoded words ----------------------------------------------------
# Adapters encode text themselves, so a caller never needs an encoded word of its own; one
# could decode to CR/LF in a recipient's software and become a header (CVE-2024-6923).
# Decoders are more lenient than RFC 2047: Python's email.header and many mail clients
# decode a word with spaces inside, in an address, in any header. So anything that opens
# like one (=?charset?q? or =?charset?b?) is refused wherever it would become header text
# (subject, display names, addresses, header values); each word is decoded only to say why.
_ENCODED_WORD_START = re.compile(r"=\?[^?]*\?[bBqQ]\?")
_LENIENT_WORD = re.compile(r"=\?([^?]*)\?([bBqQ])\?(.*?)\?=", re.DOTALL)
# RFC 2047 section 2: token charset, no space or "?" in the text, at most 75 characters.
_STRICT_WORD = re.compile(r"=\?[!->@-~]+\?[bBqQ]\?[!->@-~]*\?=")
_BREAKS = re.compile(r"[\x00-\x08\x0a-\x1f\x7f\x85\u2028\u2029]")


def encoded_word_refusal(value: str) -> str | None:
    """Why ``value`` may not become header text because of an encoded word, or None."""
    if not _ENCODED_WORD_START.search(value):
        return None
    words = list(_LENIENT_WORD.finditer(value))
    if any(_decodes_to_a_break(word) for word in words):
        return (
            "RFC 2047 encoded words are not allowed, and this one decodes to a line break or control character "
            "(a header injection)"
        )
    if not words or any(len(w[0]) > 75 or not _STRICT_WORD.fullmatch(w[0]) or _decoded(w) is None for w in words):
        return (
            "RFC 2047 encoded words (=?charset?q?...?=) are not allowed, malformed ones neither; send the text itself"
        )
    return "RFC 2047 encoded words (=?charset?q?...?=) are not allowed; send the text itself"


def header_text_refusal(value: str) -> str | None:
    """Why ``value`` may not be written as (part of) a header line, or None: CR, LF and other
    control characters, raw or inside an encoded word. The adapters' last check."""
    if CONTROL.search(value):
        return "holds CR, LF or a control character"
    return encoded_word_refusal(value)


def _decoded(word: re.Match[str]) -> bytes | None:
    """The bytes an encoded word stands for, as a lenient decoder reads them; None if undecodable."""
    text = word[3]
    try:
        if word[2] in "bB":
            return base64.b64decode(re.sub(r"\s", "", text) + "===", validate=False)
        return re.sub(rb"=([0-9A-Fa-f]{2})", lambda m: bytes([int(m[1], 16)]), text.replace("_", " ").encode())
    except (binascii.Error, ValueError, UnicodeEncodeError):
        return None


def _decodes_to_a_break(word: re.Match[str]) -> bool:
    raw = _decoded(word)
    if raw is None:
        return False
    charset = word[1].split("*", 1)[0].strip() or "ascii"
    try:
        text = raw.decode(charset, errors="replace")
    except LookupError:  # an unknown charset: what its ASCII bytes say is what a decoder shows
        text = raw.decode("latin-1")
    return bool(_BREAKS.search(text) or _BREAKS.search(raw.decode("latin-1")))
