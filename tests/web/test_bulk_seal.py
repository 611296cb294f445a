"""A bulk apply acts only on a preview the server rendered for this session (issue 18): the
preview's apply form carries an HMAC seal (ops/web/session.py, Sessions.seal) over the action,
exactly the ids and the states they were seen in, the verdict and the note; a changed field, a
form without its seal, or one rendered for another session is refused (422, saying so) and
changes nothing. Driven for real: `evq serve` on loopback against PostgreSQL, two browsers'
worth of cookies."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

from evq.ops.web.session import Session, Sessions
from evq.worker.backoff import Backoff
from evq.worker.outcomes import Retryable, Unknown
from evq.worker.transitions import decide
from tests.acceptance.conftest import make_key
from tests.support import rows, step_row, with_store
from tests.web.support import form_fields
from tests.web.test_ops_page import _csrf, _signed_in, server  # noqa: F401  (the fixture)
from tests.web.test_step_lists import after_one_try, held, preview, unknown

REFUSED = "not a preview this server showed in this session, or changed since: nothing was done"


def decisions(db_url: str, ids: list[int]) -> int:
    return rows(
        db_url,
        "SELECT count(*)::int AS n FROM evidence WHERE step_id = ANY(%s) AND kind IN ('cancelled', 'denied', "
        "'approved', 'operator_resolved')",
        (ids,),
    )[0]["n"]


def test_a_tampered_or_foreign_bulk_apply_is_refused_and_changes_nothing(server, db_url):  # noqa: F811
    ids = held(db_url, 3, run_id="run-seal")
    [other] = held(db_url, 1, run_id="run-other")  # a held row the preview did not show
    alice = make_key(db_url, "alice", "operator")
    with httpx.Client(base_url=server, timeout=30) as web, httpx.Client(base_url=server, timeout=30) as second:
        _signed_in(web, alice)
        token = _csrf(web.get("/ops/steps?status=held&run_id=run-seal").text)
        shown = preview(
            web, token, status="held", run_id="run-seal", action="cancel", note="customer unsubscribed\r\nall three"
        )
        assert shown.status_code == 200, shown.text[-2000:]
        form = form_fields(shown.text, "/ops/bulk/apply")
        assert form["seen"] == ",".join(f"{i}:held" for i in ids) and form["seal"]
        tampered = {
            "an id added": {"seen": f"{form['seen']},{other}:held"},
            "an id dropped": {"seen": ",".join(f"{i}:held" for i in ids[:2])},
            "another id": {"seen": form["seen"].replace(f"{ids[0]}:", f"{other}:")},
            "a seen state changed": {"seen": form["seen"].replace(f"{ids[0]}:held", f"{ids[0]}:pending")},
            "the action": {"action": "deny"},
            "the note": {"note": "customer unsubscribed"},
            "a verdict added": {"verdict": "rejected"},
            "a version changed": {"versions": form["versions"].replace(f"{ids[0]}:", f"{ids[0]}:1", 1)},
            "no versions": {"versions": ""},
            "the seal": {"seal": form["seal"][:-2] + ("AA" if not form["seal"].endswith("AA") else "BB")},
            "no seal": {"seal": ""},
        }
        for why, change in tampered.items():
            answer = web.post("/ops/bulk/apply", data=form | change)
            assert answer.status_code == 422, (why, answer.status_code, answer.text[-1500:])
            assert REFUSED in answer.text and "preview again" in answer.text, why
        no_seal = {k: v for k, v in form.items() if k != "seal"}
        assert web.post("/ops/bulk/apply", data=no_seal).status_code == 422
        # The same key signed in elsewhere: its own CSRF token is good, the seal is not its session's.
        _signed_in(second, alice)
        foreign = second.post("/ops/bulk/apply", data=form | {"csrf": _csrf(second.get("/ops/steps").text)})
        assert foreign.status_code == 422 and REFUSED in foreign.text
        assert {step_row(db_url, i)["status"] for i in [*ids, other]} == {"held"}
        assert decisions(db_url, [*ids, other]) == 0
        # The preview's own form, as a browser posts it (a hidden field's line breaks as CRLF or LF), applies.
        done = web.post("/ops/bulk/apply", data=form | {"note": form["note"].replace("\r\n", "\n")})
        assert done.status_code == 200 and "Bulk cancel: 3 done" in done.text, done.text[-2000:]
    assert [step_row(db_url, i)["status"] for i in ids] == ["rejected"] * 3
    assert step_row(db_url, other)["status"] == "held"


def test_a_tampered_or_foreign_unknown_close_is_refused_and_changes_nothing(server, db_url):  # noqa: F811
    ids = unknown(db_url, 2, run_id="run-sealu")
    [other] = unknown(db_url, 1, run_id="run-otheru")
    alice = make_key(db_url, "alice", "operator")
    with httpx.Client(base_url=server, timeout=30) as web, httpx.Client(base_url=server, timeout=30) as bob:
        _signed_in(web, alice)
        token = _csrf(web.get("/ops/unknown?run_id=run-sealu").text)
        shown = web.post(
            "/ops/unknown/preview", data={"csrf": token, "run_id": "run-sealu", "verdict": "rejected", "note": "outage"}
        )
        assert shown.status_code == 200, shown.text[-2000:]
        form = form_fields(shown.text, "/ops/unknown/close")
        assert form["ids"] == ",".join(map(str, ids)) and form["seal"]
        for change in (
            {"ids": f"{form['ids']},{other}"},
            {"ids": str(other)},
            {"verdict": "accepted"},
            {"note": "something else"},
            {"reason": "checked_log"},
            {"versions": ""},
            {"seal": ""},
        ):
            answer = web.post("/ops/unknown/close", data=form | change)
            assert answer.status_code == 422 and REFUSED in answer.text, (change, answer.text[-1500:])
        _signed_in(bob, make_key(db_url, "bob", "operator"))
        foreign = bob.post("/ops/unknown/close", data=form | {"csrf": _csrf(bob.get("/ops/unknown").text)})
        assert foreign.status_code == 422 and REFUSED in foreign.text
        assert {step_row(db_url, i)["status"] for i in [*ids, other]} == {"unknown"}
        assert decisions(db_url, [*ids, other]) == 0
        done = web.post("/ops/unknown/close", data=form)
        assert done.status_code == 200 and "Bulk close: 2 closed" in done.text, done.text[-2000:]
    assert [step_row(db_url, i)["status"] for i in ids] == ["rejected", "rejected"]
    assert step_row(db_url, other)["status"] == "unknown"


def test_a_seal_is_bound_to_its_secret_session_purpose_and_fields():
    sessions = Sessions("s3cret")
    session = Session(csrf="c1", expires=2**40, key_id="k1")
    fields = {"action": "cancel", "seen": "1:held", "verdict": "", "note": "a\r\nb"}
    seal = sessions.seal(session, "bulk", fields)
    assert sessions.sealed(session, "bulk", fields, seal)
    assert sessions.sealed(session, "bulk", fields | {"note": "a\nb"}, seal)  # line breaks as LF or CRLF
    assert not sessions.sealed(session, "bulk", fields | {"note": "a b"}, seal)
    assert not sessions.sealed(session, "unknown-close", fields, seal)
    assert not sessions.sealed(Session(csrf="c2", expires=2**40, key_id="k1"), "bulk", fields, seal)
    assert not sessions.sealed(session, "bulk", fields, Sessions("other").seal(session, "bulk", fields))
    assert not sessions.sealed(session, "bulk", fields, None) and not sessions.sealed(
        session, "bulk", fields, "x" * 200
    )
    # Not the cookie's signature under another name: a seal's key is its own, so neither passes
    # for the other.
    cookie = sessions.dump(session)
    assert seal not in cookie and sessions.load(seal) is None and sessions.load(cookie) == session
    assert not sessions.sealed(session, "bulk", fields, cookie.rsplit(".", 1)[-1])


def test_a_bulk_close_records_only_what_its_preview_sealed(server, db_url):  # noqa: F811
    """The steps page's bulk close offers a verdict and a note, nothing else: a reason, an
    evidence URL or a provider message id added to its apply form is no part of the seal, so
    it is refused, never recorded in the rows' evidence as if the preview had shown it."""
    ids = unknown(db_url, 2, run_id="run-sealx")
    alice = make_key(db_url, "alice", "operator")
    with httpx.Client(base_url=server, timeout=30) as web:
        _signed_in(web, alice)
        token = _csrf(web.get("/ops/steps?status=unknown&run_id=run-sealx").text)
        shown = preview(
            web, token, status="unknown", run_id="run-sealx", action="close", verdict="accepted", note="seen"
        )
        assert shown.status_code == 200, shown.text[-2000:]
        form = form_fields(shown.text, "/ops/bulk/apply")
        assert form["seen"] == ",".join(f"{i}:unknown" for i in ids) and form["seal"]
        for extra in (
            {"provider_message_id": "forged-id"},
            {"evidence_url": "https://evil.example/proof"},
            {"reason": "forged_reason"},
        ):
            answer = web.post("/ops/bulk/apply", data=form | extra)
            assert answer.status_code == 422 and REFUSED in answer.text, (extra, answer.text[-1500:])
        assert {step_row(db_url, i)["status"] for i in ids} == {"unknown"}
        assert decisions(db_url, ids) == 0
        done = web.post("/ops/bulk/apply", data=form)
        assert done.status_code == 200 and "2 done" in done.text, done.text[-2000:]
    recorded = rows(
        db_url,
        "SELECT detail::text AS d FROM evidence WHERE step_id = ANY(%s) AND kind = 'operator_resolved'",
        (ids,),
    )
    assert len(recorded) == 2 and not any("forged" in r["d"] or "evil.example" in r["d"] for r in recorded)


def fail_again(db_url: str, n: int) -> None:
    """A worker's attempt at ``n`` requeued steps fails for good: each is rejected again,
    the state a bulk retry's preview saw it in before it was retried."""

    async def go(store: Any) -> None:
        at = datetime.now(UTC) + timedelta(seconds=1)
        claimed = await store.claim(
            owner="w-test", providers=["smtp"], limit=n, lease_seconds=60, dedupe_windows={}, now=at
        )
        assert len(claimed) == n
        settled = [
            decide(
                c, Retryable("451 try later"), default_max_attempts=1, backoff=Backoff(1, 1), dedupe_window_open=False
            )
            for c in claimed
        ]
        await store.record(settled, actor="w-test", now=at)

    with_store(db_url, go)


def test_a_bulk_apply_replayed_after_its_rows_came_back_to_the_previewed_state_acts_on_none(server, db_url):  # noqa: F811
    """A seal says what the preview showed, not that it is still so: a bulk retry's form posted
    again (the back button, a second tab) after its rows were retried, sent and rejected again,
    in the state the preview saw, must not retry them again under the old note. Each row changed
    since the preview (its updated_at), so each is a conflict and nothing is done."""
    dead = after_one_try(db_url, 2, max_attempts=1, run_id="run-aba")
    with httpx.Client(base_url=server, timeout=30) as web:
        _signed_in(web, make_key(db_url, "alice", "operator"))
        token = _csrf(web.get("/ops/steps?status=rejected&run_id=run-aba").text)
        shown = preview(web, token, status="rejected", run_id="run-aba", action="retry", note="provider is back")
        assert shown.status_code == 200, shown.text[-2000:]
        form = form_fields(shown.text, "/ops/bulk/apply")
        done = web.post("/ops/bulk/apply", data=form)
        assert done.status_code == 200 and "Bulk retry: 2 done" in done.text, done.text[-2000:]
        fail_again(db_url, 2)
        assert [step_row(db_url, i)["status"] for i in dead] == ["rejected", "rejected"]
        again = web.post("/ops/bulk/apply", data=form)
        assert again.status_code == 200 and "Bulk retry: 0 done, 2 not done" in again.text, again.text[-2000:]
        assert again.text.count("conflict: someone else changed it") == 2
    assert [step_row(db_url, i)["status"] for i in dead] == ["rejected", "rejected"]
    requeues = rows(
        db_url,
        "SELECT count(*)::int AS n FROM evidence WHERE step_id = ANY(%s) AND kind = 'operator_resolved'",
        (dead,),
    )
    assert requeues[0]["n"] == 2  # one retry each: the preview's, once


def lost_again(db_url: str, n: int) -> None:
    """A worker sends ``n`` requeued steps and loses each answer: unknown again."""

    async def go(store: Any) -> None:
        at = datetime.now(UTC) + timedelta(seconds=1)
        claimed = await store.claim(
            owner="w-test", providers=["smtp"], limit=n, lease_seconds=60, dedupe_windows={}, now=at
        )
        assert len(claimed) == n
        settled = [
            decide(c, Unknown("reset"), default_max_attempts=3, backoff=Backoff(1, 1), dedupe_window_open=False)
            for c in claimed
        ]
        await store.record(settled, actor="w-test", now=at)

    with_store(db_url, go)


def test_an_unknown_close_replayed_after_its_rows_were_sent_and_lost_again_closes_none(server, db_url):  # noqa: F811
    """/ops/unknown/close: a close form "retry: verified not sent" posted again after its rows were
    requeued, sent and lost again (unknown, as the preview saw them) must not judge the new
    attempt by the old note: each such row is a conflict, and nothing about it changes."""
    ids = unknown(db_url, 2, run_id="run-abau")
    with httpx.Client(base_url=server, timeout=30) as web:
        _signed_in(web, make_key(db_url, "alice", "operator"))
        token = _csrf(web.get("/ops/unknown?run_id=run-abau").text)
        note = "provider log: never received"
        shown = web.post(
            "/ops/unknown/preview", data={"csrf": token, "run_id": "run-abau", "verdict": "retry", "note": note}
        )
        assert shown.status_code == 200, shown.text[-2000:]
        form = form_fields(shown.text, "/ops/unknown/close")
        done = web.post("/ops/unknown/close", data=form)
        assert done.status_code == 200 and "Bulk close: 2 closed" in done.text, done.text[-2000:]
        lost_again(db_url, 2)
        assert [step_row(db_url, i)["status"] for i in ids] == ["unknown", "unknown"]
        again = web.post("/ops/unknown/close", data=form)
        assert again.status_code == 200 and "Bulk close: 0 closed, 2 failed" in again.text, again.text[-2000:]
        assert again.text.count("E_CONFLICT") == 2
    assert [step_row(db_url, i)["status"] for i in ids] == ["unknown", "unknown"]
    assert decisions(db_url, ids) == 2  # the preview's close, once each
