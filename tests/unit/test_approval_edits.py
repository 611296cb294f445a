"""An approver's correction (worker/approvals.py ``edited``): only the words, validated as an
enqueue is, a new hash; nothing changed is no correction."""

from __future__ import annotations

import pytest

from evq.worker.approvals import edited
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
