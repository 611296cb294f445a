"""Bad input: every one a clear error, nothing stored, no crash (property-based where it pays)."""

from __future__ import annotations

import json
from email import message_from_bytes
from email.utils import getaddresses

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evq.adapters.postgres.enqueue import enqueue
from evq.adapters.smtp import build_message
from evq.worker.errors import InvalidRequest
from evq.worker.ports import SendRequest
from evq.worker.request import Policy, parse
from tests.support import POLICY, request, rows

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=30),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4),
    max_leaves=20,
)
FIELDS = [
    "run_id",
    "step_id",
    "to",
    "cc",
    "bcc",
    "from",
    "reply_to",
    "subject",
    "text",
    "html",
    "headers",
    "intent",
    "decision",
    "notify",
    "idempotency_key",
    "provider",
    "max_attempts",
]
# Text with the characters that break naive email code: CR/LF, NUL, commas, angle brackets,
# quotes, colons, encoded-word markers, non-ASCII and unpaired surrogates.
nasty_text = st.text(
    alphabet=st.sampled_from(list("ab @.,;:<>\"'\\\r\n\t\x00=?é中\U0001f600")) | st.characters(),
    max_size=40,
)


def parse_or_refuse(data):
    try:
        return parse(data, POLICY)
    except InvalidRequest as exc:
        assert exc.code == "E_INVALID_ARG" and exc.context["fields"]
        assert all(set(e) == {"field", "message"} for e in exc.context["fields"])
        return None


@settings(max_examples=300, deadline=None)
@given(st.one_of(json_values, st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=12)))
def test_arbitrary_json_never_crashes_the_validator(data):
    parse_or_refuse(data)


@settings(max_examples=300, deadline=None)
@given(field=st.sampled_from(["subject", "to", "cc", "from", "name", "header", "run_id", "step_id"]), value=nasty_text)
def test_hostile_text_is_refused_or_rendered_safely(field, value):
    """Whatever the text, a request is either refused, or renders to a message whose
    recipients and headers are exactly the ones asked for: no injection."""
    data = request(run_id="r", step_id="s", to=["ok@example.com"])
    if field == "name":
        data["to"] = [{"email": "ok@example.com", "name": value}]
    elif field == "header":
        data["headers"] = {"In-Reply-To": value}
    elif field in ("to", "cc"):
        data[field] = [value]
    else:
        data[field] = value
    valid = parse_or_refuse(data)
    if valid is None:
        return
    envelope = build_message(
        SendRequest(
            step_id=1,
            run_id="r",
            idempotency_key=valid.idempotency_key,
            message_id="<m@example.org>",
            attempt=1,
            payload=valid.payload,
        )
    )
    message = message_from_bytes(envelope.data)
    expected = sorted(a["email"].lower() for key in ("to", "cc", "bcc") for a in valid.payload[key])
    assert sorted(r.lower() for r in envelope.recipients) == sorted(set(expected))
    assert "Bcc" not in message
    assert sorted(k.lower() for k in message.keys()) == sorted(
        {"from", "to", "subject", "date", "message-id", "mime-version", "content-type", "content-transfer-encoding"}
        | ({"cc"} if valid.payload["cc"] else set())
        | ({"in-reply-to"} if valid.payload["headers"] else set())
    )
    rendered_to = [addr for _, addr in getaddresses(message.get_all("To", []))]
    assert len(rendered_to) == len(valid.payload["to"])


@pytest.mark.parametrize(
    "data",
    [
        {"to": ["bob@example.com, eve@evil.example"]},
        {"to": ["bob@example.com>, <eve@evil.example"]},
        {"to": ["<bob@example.com> <eve@evil.example>"]},
        {"to": ["bob@example.com\r\nBcc: eve@evil.example"]},
        {"subject": "hi\nBcc: eve@evil.example"},
        {"subject": "hi\rX-Injected: yes"},
        {"headers": {"References": "<a@b>\r\nBcc: eve@evil.example"}},
        {"headers": {"Bcc": "eve@evil.example"}},
        {"decision": {"rationale": json.loads("[" * 40 + "]" * 40)}},
        {"text": "x" * (2 * 1024 * 1024)},
        {"to": "not-an-address"},
        {"to": [{"email": "a@example.com", "name": "x", "extra": 1}]},
        {"max_attempts": "3"},
        {"run_id": 42},
        {"unexpected": True},
        {"to": ["someone@blocked.example"]},
    ],
)
def test_each_smuggling_attempt_is_a_clear_error(data):
    policy = Policy(blocked_domains=("blocked.example",), providers=POLICY.providers)
    with pytest.raises(InvalidRequest) as err:
        parse({**request(), **data}, policy)
    assert err.value.context["fields"]


def test_idna_domains_and_utf8_display_names_are_handled():
    valid = parse(request(to=["Zoë Ünïcode <zoe@bücher.example>", "josé@exämple.com"]), POLICY)
    assert valid.payload["to"][0] == {"email": "zoe@bücher.example", "name": "Zoë Ünïcode"}
    envelope = build_message(
        SendRequest(
            step_id=1, run_id="r", idempotency_key="k", message_id="<m@example.org>", attempt=1, payload=valid.payload
        )
    )
    assert "zoe@xn--bcher-kva.example" in envelope.recipients and envelope.smtputf8


@pytest.mark.parametrize(
    ("run_id", "accepted"),
    [
        ("run'; DROP TABLE email_steps; --", True),
        ('run "quoted" \\ back', True),
        ("ünïcödé-运行-🚀", True),
        ("a\x00b", False),
        ("x" * 10_000, False),
        ("line\nbreak", False),
    ],
    ids=["sql", "quotes", "unicode", "nul", "10kb", "line-break"],
)
@pytest.mark.parametrize("field", ["run_id", "step_id", "idempotency_key"])
def test_hostile_identifiers_are_refused_or_stored_safely(db_url, run_id, accepted, field):
    value = run_id
    data = request(**{"run_id": "run", "step_id": "step", field: value})
    with psycopg.connect(db_url) as conn:
        if not accepted:
            with pytest.raises(InvalidRequest) as refused:
                enqueue(conn, data, policy=POLICY)
            assert [f["field"] for f in refused.value.context["fields"]] == [field]
        else:
            step = enqueue(conn, data, policy=POLICY)
            conn.commit()
            assert getattr(step, field) == value
    stored = rows(db_url, f"SELECT {field} AS value FROM steps_now")
    assert stored == ([{"value": value}] if accepted else [])
    assert rows(db_url, "SELECT count(*)::int AS n FROM decisions")[0]["n"] == (1 if accepted else 0)


@pytest.mark.parametrize(
    ("note", "accepted"),
    [
        ("checked'; DELETE FROM evidence; --", True),
        ('"quoted" \\ back, <b>bold</b>', True),
        ("line one\nline two", True),
        ("ünïcödé 🚀", True),
        ("a\x00b", False),
        ("x" * 10_000, False),
        (" ", False),
    ],
    ids=["sql", "quotes-markup", "line-break", "unicode", "nul", "10kb", "blank"],
)
def test_hostile_notes_are_refused_or_stored_safely(db_url, note, accepted):
    """An operator's note (free text, shown on the page) with quotes, SQL, NUL or 10 KB."""
    from evq.worker.resolution import Resolution
    from tests.support import unknown_steps, with_store

    [step] = with_store(db_url, unknown_steps)
    if not accepted:
        with pytest.raises(InvalidRequest) as refused:
            Resolution.parse("rejected", note)
        assert [f["field"] for f in refused.value.context["fields"]] == ["--note"]
    else:
        resolution = Resolution.parse("rejected", note)
        with_store(db_url, lambda store: store.resolve(step.id, resolution, actor="alice", default_max_attempts=3))
    stored = rows(db_url, "SELECT detail ->> 'note' AS note FROM evidence WHERE kind = 'operator_resolved'")
    assert stored == ([{"note": note.strip()}] if accepted else [])
    assert rows(db_url, "SELECT status FROM steps_now")[0]["status"] == ("rejected" if accepted else "unknown")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(subject=nasty_text, name=nasty_text, text=st.text(max_size=200))
def test_whatever_passes_validation_is_stored_within_the_schema(db_url, subject, name, text):
    """A request the validator accepts never violates a constraint of the database."""
    data = request(subject=subject, text=text or "t", to=[{"email": "ok@example.com", "name": name}])
    try:
        valid = parse(data, POLICY)
    except InvalidRequest:
        return
    with psycopg.connect(db_url) as conn:
        step = enqueue(conn, valid, policy=POLICY)
        assert step.created
        conn.rollback()


def test_rendering_neutralizes_what_the_validator_would_have_refused():
    """Rows written by something other than the validator are made safe when rendered:
    a CR/LF in a stored subject becomes a space, never a header."""
    valid = parse(request(), POLICY)
    bad = {**valid.payload, "subject": "x\r\nBcc: eve@evil.example"}
    envelope = build_message(
        SendRequest(step_id=1, run_id="r", idempotency_key="k", message_id="<m@example.org>", attempt=1, payload=bad)
    )
    message = message_from_bytes(envelope.data)
    assert "Bcc" not in message and "eve@evil.example" not in envelope.recipients
    assert "\n" not in message["Subject"]


# Domain labels in many scripts, with the characters IDNA 2003 and IDNA 2008 map differently
# (ß, ς, joiners), upper case, and a few that are not allowed in a domain at all.
idna_labels = st.text(
    alphabet=st.sampled_from(list("abzAZ09-ßςΣσäöüÜéЖжाक中文ㄱ\u200c\u200d_ .")), min_size=1, max_size=12
)
display_names = st.text(alphabet=st.sampled_from(list("ab Zë中🚀,<>\"'\\;:@()")) | st.characters(), max_size=30)


@settings(max_examples=300, deadline=None)
@given(label=idna_labels, name=display_names)
def test_idna_domains_and_utf8_display_names_hold_for_any_input(label, name):
    """An IDNA domain is checked against the domain rules in the form the message is sent to
    (an allow or block rule cannot be dodged by a spelling the two IDNA standards map apart),
    and a UTF-8 display name renders as exactly one address with that name."""
    from email import policy as email_policy

    data = request(to=[{"email": f"user@{label}.example", "name": name}])
    valid = parse_or_refuse(data)
    if valid is None:
        return
    envelope = build_message(
        SendRequest(
            step_id=1,
            run_id="r",
            idempotency_key=valid.idempotency_key,
            message_id="<m@example.org>",
            attempt=1,
            payload=valid.payload,
        )
    )
    [recipient] = envelope.recipients
    domain = recipient.rpartition("@")[2]
    assert domain.isascii()
    written = valid.payload["to"][0]["email"].rpartition("@")[2]  # the rule as an operator may write it
    for rule in (domain, written):
        with pytest.raises(InvalidRequest):
            parse(data, Policy(blocked_domains=(rule,), providers=POLICY.providers))
        assert parse(data, Policy(allowed_domains=(rule,), providers=POLICY.providers)).payload == valid.payload
    [to] = message_from_bytes(envelope.data, policy=email_policy.default)["To"].addresses
    # (The email package's parser folds runs of whitespace in a name; the header itself keeps them.)
    assert " ".join(to.display_name.split()) == " ".join((valid.payload["to"][0]["name"] or "").split())
    assert to.domain.lower() in (domain, written)


def _nested(depth: int, leaf: object, as_dict: bool) -> object:
    value = leaf
    for _ in range(depth):
        value = {"k": value} if as_dict else [value]
    return value


@settings(max_examples=100, deadline=None)
@given(
    field=st.sampled_from(["decision", "headers", "to", "notify", "subject", "unexpected", "$root"]),
    depth=st.integers(min_value=1, max_value=20_000),
    as_dict=st.booleans(),
)
def test_deep_json_anywhere_is_refused_or_bounded_never_a_crash(field, depth, as_dict):
    """JSON nested to any depth, in any field (or as the whole request): a clear error, never
    a RecursionError; a rationale deeper than the limit is refused by name."""
    deep = _nested(depth, "x", as_dict)
    if field == "$root":
        data = deep
    elif field == "decision":
        data = request(decision={"rationale": deep})
    else:
        data = {**request(), field: deep}
    valid = parse_or_refuse(data)
    if field == "decision" and depth > 16:
        assert valid is None
    if valid is not None:
        json.dumps(valid.payload)
