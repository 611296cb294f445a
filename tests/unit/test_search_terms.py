"""The search box's string read into its forms (worker/search.py), its bound, and a capped total
as the contract says it (ops/app/service/)."""

from __future__ import annotations

import pytest

from evq.ops.app.service import search_text, total_meta
from evq.worker.errors import InvalidRequest
from evq.worker.ports import COUNT_CAP
from evq.worker.search import SEARCH_MAX, SearchTerms, search_terms


@pytest.mark.parametrize(
    ("raw", "terms"),
    [
        ("42", SearchTerms("42", 42, None, None)),
        (str(2**63), SearchTerms(str(2**63), None, None, None)),  # past a bigint: no step id
        ("٤٢", SearchTerms("٤٢", None, None, None)),  # digits, but not ASCII ones
        ("Bob@Example.COM", SearchTerms("Bob@Example.COM", None, "bob@example.com", "<Bob@Example.COM>")),
        ("@Example.com", SearchTerms("@Example.com", None, "@example.com", None)),
        ("example.com", SearchTerms("example.com", None, "@example.com", None)),
        ("xn--bcher-kva.example", SearchTerms("xn--bcher-kva.example", None, "@bücher.example", None)),
        ("<a.1@host>", SearchTerms("<a.1@host>", None, None, "<a.1@host>")),
        ("run-7", SearchTerms("run-7", None, None, None)),
        ("two words.com", SearchTerms("two words.com", None, None, None)),
        ("a@b@c", SearchTerms("a@b@c", None, None, None)),
    ],
)
def test_the_string_is_read_into_each_form_it_can_be(raw, terms):
    assert search_terms(raw) == terms


def test_the_search_is_trimmed_and_bounded():
    assert search_text("  bob@example.com\n") == "bob@example.com"
    assert search_text("   ") is None and search_text(None) is None
    assert search_text("x" * SEARCH_MAX) == "x" * SEARCH_MAX
    with pytest.raises(InvalidRequest) as refused:
        search_text("x" * (SEARCH_MAX + 1))
    assert refused.value.errors[0]["field"] == "--search"


def test_a_total_past_the_cap_is_the_cap_and_not_exact():
    assert total_meta(3) == {"total": 3, "total_exact": True}
    assert total_meta(COUNT_CAP) == {"total": COUNT_CAP, "total_exact": True}
    assert total_meta(COUNT_CAP + 1) == {"total": COUNT_CAP, "total_exact": False}
