"""An approver's correction (worker/approval_actions.py ``edited``): only the words, validated as an
enqueue is, a new hash; nothing changed is no correction."""

from __future__ import annotations

import pytest

from evq.worker.approval_actions import edited
from evq.worker.errors import InvalidRequest
from tests.support import POLICY, valid


def test_a_correction_is_a_new_validated_payload_with_its_own_hash():
    v = valid(subject="Helo", text="Body", html="<p>Body</p>")
    edit = edited(v.payload, v.provider, {"subject": "Hello", "html": ""}, POLICY, from_sha256=v.payload_sha256)
    assert edit is not None and edit.fields == ("subject", "html")
    assert edit.payload["subject"] == "Hello" and edit.payload["html"] is None and edit.payload["to"] == v.payload["to"]
    assert edit.from_sha256 == v.payload_sha256 != edit.payload_sha256


def test_the_same_words_are_no_correction():
    v = valid()
    assert edited(v.payload, v.provider, {"subject": v.payload["subject"]}, POLICY, from_sha256="x") is None


@pytest.mark.parametrize(
    ("edits", "field"),
    [
        ({"to": "else@example.com"}, "to"),
        ({"from": "boss@example.org"}, "from"),
        ({"subject": "two\nlines"}, "subject"),
        ({"text": "", "html": ""}, "text"),  # no body left
    ],
)
def test_what_an_enqueue_refuses_and_anything_but_the_words_is_refused(edits, field):
    v = valid()
    with pytest.raises(InvalidRequest) as refused:
        edited(v.payload, v.provider, edits, POLICY, from_sha256=v.payload_sha256)
    assert refused.value.errors[0]["field"] == field


def test_a_corrected_text_must_say_what_becomes_of_the_html_part():
    """Issue 29: most mail clients show the HTML part, so a corrected text beside the agent's
    HTML is a correction nobody sees: refused unless html is given (corrected, or the same to
    keep it) or dropped (drop_html, or an empty html)."""
    v = valid(text="Meet on Tuesday", html="<p>Meet on Tuesday</p>")
    fix = {"text": "Meet on Wednesday"}
    with pytest.raises(InvalidRequest) as refused:
        edited(v.payload, v.provider, fix, POLICY, from_sha256=v.payload_sha256)
    assert [e["field"] for e in refused.value.errors] == ["html"]
    corrected = edited(v.payload, v.provider, {**fix, "html": "<p>Wednesday</p>"}, POLICY, from_sha256="x")
    assert corrected is not None and corrected.fields == ("text", "html")
    for drop in ({"drop_html": True}, {"html": ""}):
        dropped = edited(v.payload, v.provider, {**fix, **drop}, POLICY, from_sha256="x")
        assert dropped is not None and dropped.fields == ("text", "html") and dropped.payload["html"] is None
    kept = edited(v.payload, v.provider, {**fix, "html": v.payload["html"]}, POLICY, from_sha256="x")
    assert kept is not None and kept.fields == ("text",) and kept.payload["html"] == v.payload["html"]
    # Without an HTML part, or correcting only the subject, there is nothing to say.
    plain = valid(text="Meet on Tuesday")
    assert edited(plain.payload, plain.provider, fix, POLICY, from_sha256="x") is not None
    assert edited(v.payload, v.provider, {"subject": "Moved"}, POLICY, from_sha256="x") is not None


def test_drop_html_and_a_corrected_html_contradict_and_drop_html_is_a_boolean():
    v = valid(text="t", html="<p>t</p>")
    for edits, field in (({"drop_html": True, "html": "<p>new</p>"}, "html"), ({"drop_html": "yes"}, "drop_html")):
        with pytest.raises(InvalidRequest) as refused:
            edited(v.payload, v.provider, edits, POLICY, from_sha256="x")
        assert refused.value.errors[0]["field"] == field
    assert edited(v.payload, v.provider, {"drop_html": False}, POLICY, from_sha256="x") is None
