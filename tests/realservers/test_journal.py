"""The SMTP witness (issue 16, "A witness for SMTP") against real servers: a real Postfix
(tests/realservers/postfix.py) delivers each send's journal copy (EVQ_SMTP_JOURNAL, one more
envelope recipient, tagged per step: adapters/smtp/witness.py) into a maildir that a real
Dovecot (tests/realservers/dovecot.py) serves over IMAPS and STARTTLS; the reconciler's lookup
(adapters/smtp/journal.py) searches it by Message-ID and counts a copy only if Postfix's
delivery recorded the step's tagged address. A proxy in front of Postfix
(tests/realservers/cutproxy.py) loses the answer to the final ".", the case the witness exists
for; an outsider mailing the journal a copy with a victim's Message-ID (issue 29) proves nothing.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import smtplib
import socket
from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Any

import pytest

from evq.adapters.smtp import SmtpProvider, build_message
from evq.adapters.smtp.journal import MAX_HITS
from evq.adapters.smtp.witness import WitnessTags
from evq.ops.wiring import build_journal, build_providers
from evq.worker.errors import ConfigError
from evq.worker.executor import attempt
from evq.worker.outcomes import Accepted, Outcome, Rejected, Unknown
from evq.worker.ports import Lookup, LookupFailed, LookupResult, SendRequest, profile_of
from evq.worker.request import Policy, parse
from tests.acceptance.conftest import Evq, make_key
from tests.child import settings_from
from tests.realservers.cutproxy import CutProxy
from tests.realservers.dovecot import PASSWORD as IMAP_PASSWORD
from tests.realservers.dovecot import Dovecot
from tests.realservers.postfix import DOMAIN, JOURNAL, REFUSED_LOCAL, Postfix
from tests.support import rows, step_row

INTERNAL = Policy(internal_domains=(DOMAIN,))
_seq = itertools.count(1)
# The server's pepper for the tests that send and look up without a database (a worker reads
# its database's: PostgresKeys.server_pepper).
PEPPER = os.urandom(32)
TAGS = WitnessTags(PEPPER)


def send_request(to: list[str], message_id: str | None = None) -> SendRequest:
    n = next(_seq)
    valid = parse(
        {
            "run_id": "jr-run",
            "step_id": f"jr-{n}-{os.getpid()}",
            "from": "agent@example.org",
            "to": to,
            "subject": f"journal {n}",
            "text": "Hello from evq.\n",
        },
        INTERNAL,
    )
    return SendRequest(
        step_id=n,
        run_id=valid.run_id,
        idempotency_key=valid.idempotency_key,
        message_id=message_id or f"<evq.jr{n}.{os.urandom(6).hex()}@example.org>",
        attempt=1,
        payload=valid.payload,
    )


def smtp_env(postfix: Postfix, port: int | None = None, **env: str) -> dict[str, str]:
    return {
        "EVQ_SMTP_HOST": "127.0.0.1",
        "EVQ_SMTP_PORT": str(port or postfix.ports["plain"]),
        "EVQ_SMTP_TIMEOUT": "5",
        "EVQ_INTERNAL_DOMAINS": DOMAIN,
        "EVQ_LEASE_SECONDS": "20",
        **env,
    }


def imap_env(dovecot: Dovecot, port: str = "imaps", **env: str) -> dict[str, str]:
    return {
        "EVQ_JOURNAL_IMAP_URL": dovecot.url(port),
        "EVQ_JOURNAL_IMAP_PASSWORD": IMAP_PASSWORD,
        "EVQ_JOURNAL_IMAP_CA_FILE": dovecot.ca.ca_file,
        "EVQ_JOURNAL_IMAP_TIMEOUT": "3",
        **env,
    }


def provider(postfix: Postfix, port: int | None = None, **env: str) -> SmtpProvider:
    built = build_providers(settings_from(smtp_env(postfix, port, **env)), pepper=PEPPER)["smtp"]
    assert isinstance(built, SmtpProvider)
    return built


def send(smtp: SmtpProvider, req: SendRequest) -> Outcome:
    async def run() -> Outcome:
        try:
            outcome, _ = await attempt(smtp, req, deadline=60)
            return outcome
        finally:
            await smtp.close()

    return asyncio.run(run())


def witness(dovecot: Dovecot, port: str = "imaps", *, pepper: bytes = PEPPER, **env: str) -> Lookup:
    journal = build_journal(settings_from(imap_env(dovecot, port, **env)), pepper=pepper)
    assert journal is not None
    return journal


def look(journal: Lookup, message_id: str) -> LookupResult:
    return asyncio.run(journal.lookup("any-key", message_id))


def failure(journal: Lookup, message_id: str = "<evq.none@example.org>") -> str:
    with pytest.raises(LookupFailed) as failed:
        look(journal, message_id)
    return str(failed.value)


# -- the journal recipient ---------------------------------------------------------


def test_the_journal_is_one_more_envelope_recipient_and_nowhere_in_the_message(postfix: Postfix) -> None:
    req = send_request([f"journal-a@{DOMAIN}"])
    outcome = send(provider(postfix, EVQ_SMTP_JOURNAL=JOURNAL), req)

    assert isinstance(outcome, Accepted), outcome
    # The evidence never names the journal (every key reads it), nor the step's tag.
    assert outcome.response["journal"] == {"accepted": True, "code": 250, "reply": "2.1.5 Ok"}
    assert outcome.response["refused"] == {} and outcome.response["accepted"] == 1  # the journal is not counted
    [copy] = postfix.delivered(req.message_id, expect=1)
    [journaled] = postfix.journaled(req.message_id, expect=1)
    # One queued message for both (one transaction), so the bytes are the same but for the
    # Delivered-To line each maildir delivery adds: the journal's is the step's own subaddress.
    # The recipient's copy never names the journal.
    tagged = TAGS.address(JOURNAL, req.message_id)
    assert tagged == f"journal+{TAGS.tag(req.message_id)}@{DOMAIN}"
    assert journaled["Delivered-To"] == tagged and journaled["X-Original-To"] == tagged
    assert JOURNAL not in copy.as_string() and TAGS.tag(req.message_id) not in copy.as_string()
    strip = lambda m: [(k, str(v)) for k, v in m.items() if k not in ("Delivered-To", "X-Original-To")]  # noqa: E731
    assert strip(copy) == strip(journaled) and copy.get_content() == journaled.get_content()
    assert len(postfix.sessions_for(req.message_id, expect=1)) == 1
    # The rendered message is the same with or without a journal: only the envelope differs.
    envelope = build_message(req, internal_domains=(DOMAIN,))
    assert JOURNAL not in envelope.recipients and JOURNAL.encode() not in envelope.data


def test_a_refused_journal_recipient_is_recorded_and_the_send_stands(postfix: Postfix) -> None:
    refused_journal = f"{REFUSED_LOCAL}+journal@{DOMAIN}"
    req = send_request([f"journal-b@{DOMAIN}"])
    outcome = send(provider(postfix, EVQ_SMTP_JOURNAL=refused_journal), req)

    assert isinstance(outcome, Accepted), outcome
    journal = outcome.response["journal"]
    assert (journal["accepted"], journal["code"]) == (False, 550)
    # Postfix names the recipient it refuses: the evidence says "[journal]" instead.
    assert journal["reply"].startswith("5.1.1 <[journal]>: Recipient address rejected"), journal
    tag = TAGS.tag(req.message_id)
    assert tag in postfix.log()  # what Postfix refused was the step's tagged address
    assert tag not in json.dumps(outcome.response) and "refused+journal" not in json.dumps(outcome.response)
    assert outcome.response["refused"] == {}  # not a refused recipient: the send is not partially refused
    assert len(postfix.delivered(req.message_id, expect=1)) == 1


def test_a_send_every_recipient_refuses_stays_rejected_and_is_not_journaled(postfix: Postfix) -> None:
    req = send_request([f"{REFUSED_LOCAL}@{DOMAIN}"])
    outcome = send(provider(postfix, EVQ_SMTP_JOURNAL=JOURNAL), req)

    assert isinstance(outcome, Rejected), outcome
    assert outcome.response["journal"] is None  # never asked: it would have made the send look accepted
    assert postfix.journaled(req.message_id, expect=0, timeout=0) == []


def test_the_journal_setting_is_checked() -> None:
    with pytest.raises(ConfigError, match="EVQ_SMTP_JOURNAL"):
        settings_from({"EVQ_SMTP_JOURNAL": "Journal <journal@example.org>"})
    for url, named in (
        ("imaps://journal:pw@127.0.0.1/INBOX", "must not carry the password"),
        ("http://journal@127.0.0.1/INBOX", "imaps://"),
        ("imaps://127.0.0.1/INBOX", "name the user"),
    ):
        with pytest.raises(ConfigError, match="EVQ_JOURNAL_IMAP_URL") as refused:
            settings_from({"EVQ_JOURNAL_IMAP_URL": url, "EVQ_JOURNAL_IMAP_PASSWORD": "pw-1234"})
        assert named in refused.value.message and ":pw@" not in refused.value.message
    with pytest.raises(ConfigError, match="EVQ_JOURNAL_IMAP_PASSWORD"):
        settings_from({"EVQ_JOURNAL_IMAP_URL": "imaps://journal@127.0.0.1/INBOX"})
    with pytest.raises(ConfigError, match="EVQ_JOURNAL_IMAP_TIMEOUT"):
        settings_from(
            {
                "EVQ_JOURNAL_IMAP_URL": "imaps://journal@127.0.0.1/INBOX",
                "EVQ_JOURNAL_IMAP_PASSWORD": "pw-1234",
                "EVQ_JOURNAL_IMAP_TIMEOUT": "60",
            }
        )


def test_the_provider_has_a_lookup_only_with_a_witness(postfix: Postfix, dovecot: Dovecot) -> None:
    plain = provider(postfix, EVQ_SMTP_JOURNAL=JOURNAL)
    assert not isinstance(plain, Lookup) and profile_of(plain).lookup_by == ()
    assert not profile_of(plain).resolvable
    witnessed = provider(postfix, EVQ_SMTP_JOURNAL=JOURNAL, **imap_env(dovecot))
    assert isinstance(witnessed, Lookup) and profile_of(witnessed).lookup_by == ("message_id",)
    assert profile_of(witnessed).dedupe_window is None and profile_of(witnessed).webhook_events == ()


# -- the lookup --------------------------------------------------------------------


@pytest.mark.parametrize("port", ["imaps", "imap"])
def test_the_journal_copy_is_found_by_message_id_over_tls_and_starttls(
    postfix: Postfix, dovecot: Dovecot, port: str
) -> None:
    req = send_request([f"journal-c-{port}@{DOMAIN}"])
    assert isinstance(send(provider(postfix, EVQ_SMTP_JOURNAL=JOURNAL), req), Accepted)
    assert len(postfix.journaled(req.message_id, expect=1)) == 1

    found = look(witness(dovecot, port), req.message_id)
    assert found.found and found.provider_message_id is None
    assert found.raw["message_id"] == req.message_id and found.raw["mailbox"] == "INBOX"
    assert found.raw["copies"] == 1 and isinstance(found.raw["uid"], int) and found.raw["uidvalidity"]
    assert found.raw["internaldate"]


# -- a copy anyone could have sent is no proof (issue 29) -----------------------------


def outsider_sends(
    postfix: Postfix, message_id: str, *, rcpt: str = JOURNAL, headers: Mapping[str, str] = MappingProxyType({})
) -> None:
    """An outsider mails the journal, as anyone can mail an MX: through the real Postfix, in an
    SMTP session of its own, with the Message-ID it wants and whatever headers it likes."""
    lines = [f"{k}: {v}" for k, v in headers.items()] + [
        "From: mallory@example.org",
        f"To: {headers.get('To', JOURNAL)}",
        "Subject: totally the relay's journal copy",
        f"Message-ID: {message_id}",
        "",
        "Hello from nobody you know.",
        "",
    ]
    with smtplib.SMTP("127.0.0.1", postfix.ports["plain"], local_hostname="outsider.example.org", timeout=10) as s:
        refused = s.sendmail("mallory@example.org", [rcpt], "\r\n".join(lines).encode())
    assert refused == {}


def forged_headers(tagged: str) -> dict[str, str]:
    """Every header in which the outsider can put the step's tagged address (had it learned it):
    at the very top of what it sends, above a Received: line of its own."""
    return {"Delivered-To": tagged, "X-Original-To": tagged, "Received": "by relay.evq.test (Postfix)", "To": tagged}


FORGERIES = {
    "the journal, a plain copy": lambda tagged: (JOURNAL, {}),
    "the journal, the tag in its own headers": lambda tagged: (JOURNAL, forged_headers(tagged)),
    "a guessed tag, the tag in its own headers": lambda tagged: (
        f"journal+{'0' * 32}@{DOMAIN}",
        forged_headers(tagged),
    ),
}


@pytest.mark.parametrize("forge", FORGERIES.values(), ids=FORGERIES)
def test_a_copy_an_outsider_sent_is_no_proof(postfix: Postfix, dovecot: Dovecot, forge: Any) -> None:
    victim = f"<evq.victim.{os.urandom(6).hex()}@example.org>"
    tagged = TAGS.address(JOURNAL, victim)
    rcpt, headers = forge(tagged)
    outsider_sends(postfix, victim, rcpt=rcpt, headers=headers)
    [copy] = postfix.journaled(victim, expect=1)
    assert copy["Delivered-To"] == rcpt  # Postfix's own line: the first, above its Received:

    absent = look(witness(dovecot), victim)
    assert not absent.found, absent
    assert absent.raw["untagged_copies"] == 1 and "proves nothing" in absent.raw["note"]
    assert TAGS.tag(victim) not in json.dumps(absent.raw) and JOURNAL not in json.dumps(absent.raw)


def test_the_relays_copy_is_found_beside_forged_ones_and_only_under_this_installations_key(
    postfix: Postfix, dovecot: Dovecot
) -> None:
    req = send_request([f"journal-h@{DOMAIN}"])
    outsider_sends(postfix, req.message_id, headers=forged_headers(TAGS.address(JOURNAL, req.message_id)))
    assert isinstance(send(provider(postfix, EVQ_SMTP_JOURNAL=JOURNAL), req), Accepted)
    assert len(postfix.journaled(req.message_id, expect=2)) == 2

    found = look(witness(dovecot), req.message_id)
    assert found.found and found.raw["copies"] == 1 and found.raw["untagged_copies"] == 1
    # Another installation (another pepper) sharing the journal sees no proof of it.
    other = look(witness(dovecot, pepper=os.urandom(32)), req.message_id)
    assert not other.found and other.raw["untagged_copies"] == 2


def test_a_flood_of_outsider_copies_cannot_push_the_relays_copy_out_of_the_search(
    postfix: Postfix, dovecot: Dovecot
) -> None:
    """An outsider who learnt a held step's Message-ID (every key reads it) mails the journal
    more copies of it than a lookup reads before the relay's copy arrives: the lookup still
    finds the relay's tagged copy (it asks the server for the tag, not only the Message-ID),
    and before the relay's copy arrives it finds nothing, never a proof."""
    req = send_request([f"journal-f@{DOMAIN}"])
    flood = MAX_HITS + 5
    for _ in range(flood):
        outsider_sends(postfix, req.message_id)
    assert len(postfix.journaled(req.message_id, expect=flood)) == flood
    # Looked up once before the send: Dovecot numbers the flood first, so the relay's copy
    # comes after every one of them.
    before = look(witness(dovecot), req.message_id)
    assert not before.found and before.raw["search_hits"] == flood
    assert isinstance(send(provider(postfix, EVQ_SMTP_JOURNAL=JOURNAL), req), Accepted)
    assert len(postfix.journaled(req.message_id, expect=flood + 1)) == flood + 1

    found = look(witness(dovecot), req.message_id)
    assert found.found, found.raw
    assert found.raw["copies"] == 1 and found.raw["search_hits"] == flood + 1
    assert found.raw["untagged_copies"] == flood
    assert TAGS.tag(req.message_id) not in json.dumps(found.raw) and JOURNAL not in json.dumps(found.raw)


def test_a_message_id_not_in_the_journal_is_not_found(dovecot: Dovecot) -> None:
    absent = look(witness(dovecot), f"<evq.never-sent.{os.urandom(6).hex()}@example.org>")
    assert not absent.found and absent.raw["search_hits"] == 0


def test_a_hostile_message_id_is_quoted_or_refused_never_a_search_of_its_own(
    postfix: Postfix, dovecot: Dovecot
) -> None:
    """Quotes and backslashes in a Message-ID reach the server as one quoted string;
    anything that could end the command (CR, LF, space, non-ASCII) is refused before asking."""
    odd = f'<evq."quo\\ted".{os.urandom(4).hex()}@example.org>'
    req = send_request([f"journal-d@{DOMAIN}"], message_id=odd)
    assert isinstance(send(provider(postfix, EVQ_SMTP_JOURNAL=JOURNAL), req), Accepted)
    # (Python's header parser reads the quoted-pair, so the copy is matched by its bytes.)
    assert len(postfix.journaled_raw(f"Message-ID: {odd}\n".encode(), expect=1)) == 1
    journal = witness(dovecot)

    assert look(journal, odd).found
    # A quote that would close the string early finds only a message with that very id.
    assert not look(journal, '<"ALL"@example.org>').found
    assert not look(journal, odd.replace('"quo', "quo")).found
    for hostile in ("<a@b>\r\nA2 LOGOUT", '<x" OR ALL "@example.org>', "<évq@example.org>", "not-an-id"):
        assert "not of the form" in failure(journal, hostile)


@pytest.fixture
def own_dovecot(postfix: Postfix) -> Iterator[Dovecot]:
    """A Dovecot of the test's own on the journal maildir: for a test that stops it, or that
    fails logins (Dovecot then delays every login from that address for seconds: its auth
    penalty, which would slow the tests after it)."""
    server = Dovecot(maildir=postfix.root / "mail/journal", ca=postfix.ca)
    server.start()
    try:
        yield server
    finally:
        server.remove()


def test_a_wrong_password_is_a_failed_lookup_that_names_the_setting_not_the_password(own_dovecot: Dovecot) -> None:
    wrong = "Wrong-journal-pass-9931"
    message = failure(witness(own_dovecot, EVQ_JOURNAL_IMAP_PASSWORD=wrong))
    assert "refused the login" in message and "EVQ_JOURNAL_IMAP_PASSWORD" in message
    assert wrong not in message and IMAP_PASSWORD not in message


def test_an_untrusted_certificate_is_a_failed_lookup(dovecot: Dovecot) -> None:
    env = imap_env(dovecot)
    del env["EVQ_JOURNAL_IMAP_CA_FILE"]
    journal = build_journal(settings_from(env), pepper=PEPPER)
    assert journal is not None
    assert "EVQ_SMTP_CA_FILE" in failure(journal)


def test_nothing_listening_is_a_failed_lookup(dovecot: Dovecot) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    journal = witness(dovecot, EVQ_JOURNAL_IMAP_URL=f"imaps://journal@127.0.0.1:{closed}/INBOX")
    assert "connection refused" in failure(journal)


def test_a_paused_journal_is_a_failed_lookup_within_its_timeout(postfix: Postfix, dovecot: Dovecot) -> None:
    req = send_request([f"journal-e@{DOMAIN}"])
    assert isinstance(send(provider(postfix, EVQ_SMTP_JOURNAL=JOURNAL), req), Accepted)
    assert len(postfix.journaled(req.message_id, expect=1)) == 1
    journal = witness(dovecot, EVQ_JOURNAL_IMAP_TIMEOUT="1")
    dovecot.pause()
    try:
        # Whichever ends it first, the socket's timeout or the lookup's watchdog, both 1s.
        message = failure(journal, req.message_id)
        assert "did not answer at connect within 1s" in message or "gave no whole answer in 1s" in message
    finally:
        dovecot.resume()
    assert look(witness(dovecot), req.message_id).found, dovecot.log_tail()  # found once it answers again


def test_a_stopped_journal_is_a_failed_lookup(postfix: Postfix, own_dovecot: Dovecot) -> None:
    req = send_request([f"journal-f@{DOMAIN}"])
    assert isinstance(send(provider(postfix, EVQ_SMTP_JOURNAL=JOURNAL), req), Accepted)
    assert len(postfix.journaled(req.message_id, expect=1)) == 1
    journal = witness(own_dovecot)
    assert look(journal, req.message_id).found
    own_dovecot.stop()
    assert "connection refused" in failure(journal, req.message_id)


# -- the worker's reconciler settles the lost answer ---------------------------------


@pytest.fixture
def evq(db_url: str) -> Evq:
    return Evq(db_url, api_key=make_key(db_url, "test-admin", "admin", created_by=None), EVQ_INTERNAL_DOMAINS=DOMAIN)


def enqueue(evq: Evq, run_id: str, to: str) -> dict[str, Any]:
    body = {
        "run_id": run_id,
        "step_id": "tell",
        "from": "agent@example.org",
        "to": [to],
        "subject": "the witness",
        "text": "Hello from evq.\n",
        "intent": "tell the user",
    }
    return evq.json("enqueue", "--file", "-", input=json.dumps(body))["data"]


def drain(evq: Evq, **env: str) -> str:
    done = evq.run("worker", "run", "--drain", **env)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stderr


@pytest.fixture
def lost(postfix: Postfix) -> Iterator[CutProxy]:
    """Postfix behind a proxy whose first connection loses the answer to the final "."."""
    with CutProxy(postfix.ports["plain"], modes=["lose-reply"]) as proxy:
        yield proxy


def test_a_lost_answer_is_settled_by_the_journal_copy(
    evq: Evq, db_url: str, postfix: Postfix, dovecot: Dovecot, lost: CutProxy
) -> None:
    step = enqueue(evq, "witness-a", f"witness-a@{DOMAIN}")
    sent = drain(evq, **smtp_env(postfix, lost.port, EVQ_SMTP_JOURNAL=JOURNAL))
    row = step_row(db_url, step["id"])
    assert row["status"] == "unknown", (row, sent[-2000:])
    assert lost.withheld and lost.withheld[0].startswith(b"250")  # Postfix took it; evq never heard
    [answer] = rows(db_url, "SELECT * FROM evidence WHERE step_id = %s AND kind = 'provider_response'", (step["id"],))
    assert (answer["detail"]["phase"], answer["detail"]["error_class"]) == ("final", "SMTPServerDisconnected")
    assert answer["detail"]["journal"]["accepted"] is True  # the journal was in the lost transaction
    assert len(postfix.journaled(step["message_id"], expect=1)) == 1

    settled = drain(evq, **smtp_env(postfix, lost.port, EVQ_SMTP_JOURNAL=JOURNAL), **imap_env(dovecot))
    row = step_row(db_url, step["id"])
    assert (row["status"], row["reason"]) == ("accepted", "reconciled"), (row, settled[-2000:])
    assert "Message-ID" in row["detail"]
    [reconciled] = rows(db_url, "SELECT * FROM evidence WHERE step_id = %s AND kind = 'reconciled'", (step["id"],))
    answer = reconciled["detail"]["answer"]
    assert reconciled["detail"]["found"] is True and answer["witness"] == "imap_journal"
    assert answer["message_id"] == step["message_id"] and answer["copies"] == 1
    # The recipient got the message exactly once: the one attempt, never a resend.
    assert len(postfix.delivered(step["message_id"], expect=1)) == 1
    assert len(postfix.sessions_for(step["message_id"], expect=1)) == 1
    assert row["attempts"] == 1

    chain = evq.json("runs", "show", "witness-a")["data"]
    kinds = [(e["kind"], e.get("to_status")) for e in chain["events"]]
    assert ("provider_response", "unknown") in kinds and kinds[-1] == ("reconciled", "accepted"), kinds
    human = evq.run("runs", "show", "witness-a").stdout
    assert "unknown -> accepted" in human and "found by the step's" in human, human
    for text in (sent, settled, human, json.dumps(chain)):
        assert IMAP_PASSWORD not in text


def test_an_unreachable_journal_leaves_the_row_unknown(
    evq: Evq, db_url: str, postfix: Postfix, dovecot: Dovecot, lost: CutProxy
) -> None:
    step = enqueue(evq, "witness-b", f"witness-b@{DOMAIN}")
    drain(evq, **smtp_env(postfix, lost.port, EVQ_SMTP_JOURNAL=JOURNAL))
    assert len(postfix.journaled(step["message_id"], expect=1)) == 1  # the copy is there; the witness is not
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]

    log = drain(
        evq,
        **smtp_env(postfix, lost.port, EVQ_SMTP_JOURNAL=JOURNAL),
        **imap_env(dovecot, EVQ_JOURNAL_IMAP_URL=f"imaps://journal@127.0.0.1:{closed}/INBOX"),
    )
    row = step_row(db_url, step["id"])
    assert row["status"] == "unknown" and row["reconcile_checks"] == 0
    assert "reconcile_lookup_failed" in log and "connection refused" in log
    assert rows(db_url, "SELECT 1 FROM evidence WHERE step_id = %s AND kind = 'reconciled'", (step["id"],)) == []


def test_a_wrong_journal_password_leaves_the_row_unknown_and_is_in_no_log(
    evq: Evq, db_url: str, postfix: Postfix, own_dovecot: Dovecot, lost: CutProxy
) -> None:
    dovecot = own_dovecot
    wrong = "Wrong-journal-pass-4417"
    step = enqueue(evq, "witness-c", f"witness-c@{DOMAIN}")
    drain(evq, **smtp_env(postfix, lost.port, EVQ_SMTP_JOURNAL=JOURNAL))
    assert len(postfix.journaled(step["message_id"], expect=1)) == 1

    log = drain(
        evq,
        **smtp_env(postfix, lost.port, EVQ_SMTP_JOURNAL=JOURNAL),
        **imap_env(dovecot, EVQ_JOURNAL_IMAP_PASSWORD=wrong),
        EVQ_LOG_LEVEL="debug",
    )
    row = step_row(db_url, step["id"])
    assert row["status"] == "unknown"
    assert "reconcile_lookup_failed" in log and "refused the login" in log
    stored = json.dumps(rows(db_url, "SELECT * FROM evidence WHERE step_id = %s", (step["id"],)), default=str)
    for text in (log, stored, json.dumps(row, default=str), dovecot.log()):
        assert wrong not in text and IMAP_PASSWORD not in text


def test_a_message_not_in_the_journal_is_absent_evidence_and_stays_unknown(
    evq: Evq, db_url: str, postfix: Postfix, dovecot: Dovecot
) -> None:
    """The "." never reached Postfix (the proxy dropped it): no copy anywhere. The lookup's
    "not found" is kept as evidence; absence is not proof, so the row stays unknown."""
    step = enqueue(evq, "witness-d", f"witness-d@{DOMAIN}")
    with CutProxy(postfix.ports["plain"], modes=["lose-dot"]) as proxy:
        env = smtp_env(postfix, proxy.port, EVQ_SMTP_JOURNAL=JOURNAL)
        drain(evq, **env)
        assert proxy.cut.is_set() and not proxy.withheld
        assert step_row(db_url, step["id"])["status"] == "unknown"
        drain(evq, **env, **imap_env(dovecot))

    row = step_row(db_url, step["id"])
    assert row["status"] == "unknown" and row["reconcile_checks"] == 1
    [absent] = rows(db_url, "SELECT * FROM evidence WHERE step_id = %s AND kind = 'reconciled'", (step["id"],))
    assert absent["reason"] == "reconcile_absent" and absent["detail"]["found"] is False
    assert absent["detail"]["answer"]["witness"] == "imap_journal" and "Message-ID" in absent["detail"]["message"]
    assert postfix.delivered(step["message_id"], expect=0, timeout=0) == []
    assert postfix.journaled(step["message_id"], expect=0, timeout=0) == []
    chain = evq.json("runs", "show", "witness-d")["data"]
    assert chain["events"][-1]["kind"] == "reconciled"


def test_a_forged_journal_copy_leaves_the_step_unknown_and_no_key_reads_the_journal(
    evq: Evq, db_url: str, postfix: Postfix, dovecot: Dovecot
) -> None:
    """Issue 29: the "." never reached Postfix, so the recipient has nothing. An outsider (who
    read the step's Message-ID, and even its tagged address) mails the journal a copy with that
    Message-ID: on main the reconciler took it as proof and closed the step `accepted`."""
    step = enqueue(evq, "witness-f", f"witness-f@{DOMAIN}")
    with CutProxy(postfix.ports["plain"], modes=["lose-dot"]) as proxy:
        env = smtp_env(postfix, proxy.port, EVQ_SMTP_JOURNAL=JOURNAL)
        drain(evq, **env)
        assert proxy.cut.is_set() and step_row(db_url, step["id"])["status"] == "unknown"
        [pepper] = rows(db_url, "SELECT pepper FROM api_key_pepper")
        tagged = WitnessTags(bytes(pepper["pepper"])).address(JOURNAL, step["message_id"])
        outsider_sends(postfix, step["message_id"], headers=forged_headers(tagged))
        assert len(postfix.journaled(step["message_id"], expect=1)) == 1
        log = drain(evq, **env, **imap_env(dovecot))

    row = step_row(db_url, step["id"])
    assert (row["status"], row["reconcile_checks"]) == ("unknown", 1), (row, log[-2000:])
    [absent] = rows(db_url, "SELECT * FROM evidence WHERE step_id = %s AND kind = 'reconciled'", (step["id"],))
    assert absent["reason"] == "reconcile_absent" and absent["detail"]["found"] is False
    assert absent["detail"]["answer"]["untagged_copies"] == 1 and "proves nothing" in absent["detail"]["answer"]["note"]
    assert postfix.delivered(step["message_id"], expect=0, timeout=0) == []

    # Neither the journal address nor the tag is written anywhere a key reads, nor logged.
    agent = Evq(db_url, api_key=make_key(db_url, "agent-f", "agent"), EVQ_INTERNAL_DOMAINS=DOMAIN)
    seen = [log, json.dumps(rows(db_url, "SELECT * FROM evidence WHERE step_id = %s", (step["id"],)), default=str)]
    for who in (agent, Evq(db_url, EVQ_INTERNAL_DOMAINS=DOMAIN), evq):
        seen += [
            json.dumps(who.json("steps", "show", str(step["id"]))),
            json.dumps(who.json("runs", "show", "witness-f")),
        ]
    for text in seen:
        assert JOURNAL not in text and tagged.split("@")[0].split("+")[1] not in text


def test_the_lookup_answers_are_what_the_reconciler_keeps(postfix: Postfix, dovecot: Dovecot) -> None:
    """An unknown outcome from the adapter itself (the proxy), and the witness's answer."""
    req = send_request([f"journal-g@{DOMAIN}"])
    with CutProxy(postfix.ports["plain"], modes=["lose-reply"]) as proxy:
        outcome = send(provider(postfix, port=proxy.port, EVQ_SMTP_JOURNAL=JOURNAL), req)
    assert isinstance(outcome, Unknown), outcome
    assert outcome.response["phase"] == "final" and outcome.response["journal"]["accepted"] is True
    assert len(postfix.journaled(req.message_id, expect=1)) == 1
    assert look(witness(dovecot), req.message_id).found
