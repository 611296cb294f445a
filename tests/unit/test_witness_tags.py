"""The journal copy's witness tag (adapters/smtp/witness.py): only a delivery agent's trace line,
above the first Received:, carries it. The real servers' tests are tests/realservers/test_journal.py."""

from __future__ import annotations

from evq.adapters.smtp.witness import WitnessTags

TAGS = WitnessTags(b"pepper-" * 8)
MID = "<evq.a1@example.org>"


def header(*lines: str) -> bytes:
    return "".join(line + "\r\n" for line in lines).encode()


def test_the_tag_counts_only_in_the_delivery_agents_trace_lines_whatever_the_case() -> None:
    tagged = TAGS.address("journal@evq.test", MID)
    received = "Received: from relay.example.org\r\n\tby mx.evq.test (Postfix) with ESMTP id 1"
    assert TAGS.delivered_with_tag(header(f"Delivered-To: {tagged}", received, f"Message-ID: {MID}"), MID)
    assert TAGS.delivered_with_tag(header("Return-Path: <a@b.c>", f"X-Original-To: <{tagged.upper()}>", received), MID)
    # Below the receiving MTA's Received: line, anything is the sender's.
    assert not TAGS.delivered_with_tag(
        header("Delivered-To: journal@evq.test", received, f"Delivered-To: {tagged}"), MID
    )
    # No Received: within what was read: no trace to trust; another header, another step's tag.
    assert not TAGS.delivered_with_tag(header(f"Delivered-To: {tagged}", f"Message-ID: {MID}"), MID)
    assert not TAGS.delivered_with_tag(header(f"To: {tagged}", received), MID)
    assert not TAGS.delivered_with_tag(header(f"Delivered-To: {tagged}", received), "<evq.b2@example.org>")


def test_the_tag_is_the_installations_and_the_steps() -> None:
    other = WitnessTags(b"another-pepper-" * 4)
    assert TAGS.tag(MID) != other.tag(MID) and TAGS.tag(MID) != TAGS.tag("<evq.b2@example.org>")
    assert len(TAGS.address(f"{'j' * 31}@evq.test", MID).split("@")[0]) == 64
    assert "pepper" not in repr(TAGS)
