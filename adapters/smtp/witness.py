"""What makes a copy in the journal mailbox proof: a tag only evq can make, where only the
delivery can write it.

Anyone can mail the journal address a message with a step's Message-ID (both are easy to
learn), so a copy with the right Message-ID proves nothing by itself. evq therefore sends
each step's journal copy to a subaddress of the journal, ``journal+<tag>@domain``, where the
tag is an HMAC of the step's Message-ID under a key derived from the server's pepper (table
``api_key_pepper``, which only evq's roles can read). The tag is in the envelope only (RCPT
TO), never in the message; it reaches the copy when the delivery agent records the envelope
recipient in a trace header of its own, ``Delivered-To`` or ``X-Original-To`` (Postfix's
local, virtual and pipe agents; Dovecot's LMTP for a delivery with one recipient), above the
``Received:`` line the receiving MTA adds. A sender writes only what comes below that line,
so a tag in a header the sender wrote (or in To:, Cc:, the body) never counts.

Nothing here is logged or stored: the tag of a step would let its holder forge that step's
proof, so the adapter scrubs it (and the journal address) from every reply it keeps.
"""

from __future__ import annotations

import email
import hashlib
import hmac
import re

# The HMAC label that makes this key differ from every other derived from the pepper
# (API key hashes, callback signing secrets: worker/keys.py, worker/callbacks.py).
_LABEL = b"evq-smtp-journal-witness:v1"
# 32 lowercase hex digits (128 bits): fits any local part of up to 31 characters (RFC 5321's 64),
# and reads the same whatever case a server folds the address to.
TAG_HEX = 32
MAX_JOURNAL_LOCAL = 64 - 1 - TAG_HEX
_RECEIVED = re.compile(rb"^received[ \t]*:", re.I | re.M)
_TRACE_FIELDS = ("Delivered-To", "X-Original-To")


class WitnessTags:
    """The tags of one installation: ``tag(message_id)`` and the journal address carrying it."""

    def __init__(self, pepper: bytes):
        if len(pepper) < 32:
            raise ValueError("the pepper must be at least 32 bytes")
        self._key = hmac.new(pepper, _LABEL, hashlib.sha256).digest()

    def __repr__(self) -> str:
        return "WitnessTags(...)"

    def tag(self, message_id: str) -> str:
        return hmac.new(self._key, message_id.encode(), hashlib.sha256).hexdigest()[:TAG_HEX]

    def address(self, journal: str, message_id: str) -> str:
        """``local+<tag>@domain``: the journal recipient of the step with this Message-ID."""
        local, domain = journal.rsplit("@", 1)
        return f"{local}+{self.tag(message_id)}@{domain}"

    def delivered_with_tag(self, header: bytes, message_id: str) -> bool:
        """Whether ``header`` (the top of a copy's header) says it was delivered to this step's
        tagged journal address: in a Delivered-To or X-Original-To field above its first
        Received: field, i.e. written by the delivery, never by the sender."""
        match = _RECEIVED.search(header)
        if match is None:
            # No Received: line within what was read: no delivery trace to trust.
            return False
        trace = email.message_from_bytes(header[: match.start()])
        wanted = re.compile(r"^<?[^<>@\s]+\+" + re.escape(self.tag(message_id)) + r"@[^<>@\s]+>?$", re.I)
        return any(wanted.match(str(value).strip()) for name in _TRACE_FIELDS for value in trace.get_all(name, []))
