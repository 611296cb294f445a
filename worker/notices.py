"""Failure notices: when a step ends ``rejected`` (or, if configured, ``unknown``),
the address the caller named in ``notify`` is told, by an email step of its own; a
request that named none tells the enqueuing API key's default address
(``api_keys.notify_email``), if it has one. Every notice is one template: the
reason in words, what to do about it, and a legend of every reason.

This module decides what a notice says and who sends it; the store enqueues it in
the same transaction as the transition that called for it
(adapters/postgres/notices.py). Three rules keep notices from multiplying:
- the notice's idempotency key is derived from the original's (``evq:notice:KIND:KEY``),
  so a repeated transition finds the notice already there;
- a notice has ``notice_of`` set and no ``notify``, so a failing notice never causes another;
- its sender is reserved (``Policy.reserved_senders``): no caller can send as evq.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from evq.worker.domains import ascii_domain
from evq.worker.request import (
    MAX_SUBJECT,
    NOTICE_LOCAL_PART,
    RESERVED_PREFIX,
    Decision,
    Policy,
    ValidRequest,
    parse,
    payload_digest,
)
from evq.worker.states import Reason, Status

# NOTICE_LOCAL_PART is used with the failed step's sender domain when EVQ_NOTICE_FROM is
# unset: the provider already sends for that domain, so the notice can go out through it.
SUBJECT_PREFIX = {Status.REJECTED: "[delivery failed]", Status.UNKNOWN: "[delivery uncertain]"}
PARTIAL_PREFIX = "[delivery failed for some recipients]"
PARTIAL_KIND = "partially_refused"  # a notice's kind: its status, or this for an accepted step


def notice_kind(status: Status, reason: str | None) -> str:
    return PARTIAL_KIND if status is Status.ACCEPTED and reason == Reason.PARTIALLY_REFUSED else status.value


def reserved_sender(sender: str | None) -> str:
    """The Policy.reserved_senders rule for the configured notice sender."""
    return sender or f"{NOTICE_LOCAL_PART}@"


@dataclass(frozen=True, slots=True)
class NoticeConfig:
    sender: str | None = None  # EVQ_NOTICE_FROM
    on_unknown: bool = False  # EVQ_NOTICE_ON_UNKNOWN
    internal_domains: tuple[str, ...] = ()  # EVQ_INTERNAL_DOMAINS: a notify address may be at one

    @property
    def statuses(self) -> tuple[Status, ...]:
        return (Status.REJECTED, Status.UNKNOWN) if self.on_unknown else (Status.REJECTED,)

    def due(self, to_statuses: Sequence[Status], reasons: Sequence[str] = ()) -> bool:
        """Whether a batch moving steps to these states (for these reasons) may owe a
        notice (the rare case): a partial refusal is accepted, and owes one too."""
        # Asked for every batch of outcomes: the statuses read once, not per transition.
        statuses = self.statuses
        return any(status in statuses for status in to_statuses) or Reason.PARTIALLY_REFUSED in reasons

    def sender_for(self, original_sender: str) -> str:
        return self.sender or f"{NOTICE_LOCAL_PART}@{original_sender.rsplit('@', 1)[1]}"


def notice_key(kind: str, idempotency_key: str) -> str:
    return f"{RESERVED_PREFIX}notice:{kind}:{idempotency_key}"


def notice_step_id(kind: str, step_id: str) -> str:
    return f"{RESERVED_PREFIX}notice:{kind}:{step_id}"


def build_notice(original: Mapping[str, Any], config: NoticeConfig) -> ValidRequest:
    """The notice for one step row (id, run_id, step_id, idempotency_key, message_id,
    provider, payload, status, reason, detail, attempts, notify).

    The payload goes through the same validator as every request, so the adapter's
    re-check passes it like any other; the identifiers are evq's own (reserved prefix).
    Raises InvalidRequest if the notice cannot be a valid message.
    """
    status = Status(original["status"])
    kind = notice_kind(status, original["reason"])
    prefix = PARTIAL_PREFIX if kind == PARTIAL_KIND else SUBJECT_PREFIX[status]
    return _notice(original, config, kind=kind, prefix=prefix, text=notice_text(original), reason=original["reason"])


# Delivery events that tell notify (worker/delivery.py TELLS_NOTIFY): a notice's kind each.
DELIVERY_PREFIX = {"bounced_hard": "[bounced]", "complained": "[marked as spam]"}


def build_delivery_notice(original: Mapping[str, Any], event: Mapping[str, Any], config: NoticeConfig) -> ValidRequest:
    """The notice for a step the provider accepted and whose recipient then bounced it for
    good or called it spam: ``original`` as for :func:`build_notice`, ``event`` the stored
    delivery event (type, provider, recipient, occurred_at, received_at). Its kind is the
    event's type, so each step is told once per type however often the provider repeats it."""
    kind = event["type"]
    return _notice(
        original,
        config,
        kind=kind,
        prefix=DELIVERY_PREFIX[kind],
        text=delivery_notice_text(original, event),
        reason=kind,
    )


def _notice(
    original: Mapping[str, Any], config: NoticeConfig, *, kind: str, prefix: str, text: str, reason: str | None
) -> ValidRequest:
    payload = original["payload"]
    subject = f"{prefix} {payload.get('subject') or ''}".strip()[:MAX_SUBJECT]
    provider = original["provider"]
    request = {
        "run_id": "notice",
        "step_id": "notice",
        "from": {"email": config.sender_for(payload["from"]["email"]), "name": "evq"},
        "to": [original["notify"]],
        "subject": subject,
        "text": text,
        # Auto-Submitted keeps auto-responders from answering a machine (RFC 3834);
        # In-Reply-To and References thread the notice under the message it is about
        # (RFC 5322 3.6.4: a reply carries both; some clients thread on only one).
        "headers": {
            "Auto-Submitted": "auto-generated",
            "In-Reply-To": original["message_id"],
            "References": original["message_id"],
        },
    }
    # evq itself is the one sender allowed to use the reserved address.
    checked = parse(
        request,
        Policy(
            providers=(provider,),
            default_provider=provider,
            reserved_senders=(),
            internal_domains=config.internal_domains,
        ),
    )
    payload_json, digest = payload_digest(checked.payload)
    return ValidRequest(
        run_id=original["run_id"],
        step_id=notice_step_id(kind, original["step_id"]),
        idempotency_key=notice_key(kind, original["idempotency_key"]),
        provider=provider,
        payload=checked.payload,
        payload_json=payload_json,
        payload_sha256=digest,
        decision=Decision(
            intent=f"tell {original['notify']} that step {original['id']} ended {kind}",
            tool="evq-notice",
            rationale={"notice_of": original["id"], "status": kind, "reason": reason},
        ),
        notify=None,
        sender_domain=checked.sender_domain,
    )


_DELIVERY_HEADLINE = {
    "bounced_hard": "Your email was accepted, then bounced: a recipient's server refused it for good.",
    "complained": "Your email was delivered, and a recipient marked it as spam.",
}
_DELIVERY_ADVICE = {
    Reason.DENIED.value: (
        "This send waited for a person's approval and was denied (their note is the reason above); nothing was "
        "sent. Do not send it again as it was; if the email is still needed, ask the operator what to change."
    ),
    Reason.APPROVAL_EXPIRED.value: (
        "This send waited for a person's approval and nobody approved it before it expired; nothing was sent. "
        "If the email is still needed, send it again as a new step (a new step_id), or ask the operator to "
        "approve sooner."
    ),
    "bounced_hard": (
        "The address does not take mail (it may not exist any more). Do not send to it again: providers suspend "
        "senders whose hard bounces pass a few percent. Correct or remove the address before the next send."
    ),
    "complained": (
        "Do not send this recipient more email of this kind: providers suspend senders whose complaint rate passes "
        "about 0.1%. Check that they asked for it, and honour unsubscribes."
    ),
}


def delivery_notice_text(original: Mapping[str, Any], event: Mapping[str, Any]) -> str:
    """A notice about a delivery event (a hard bounce or a complaint); a Bcc recipient is not named."""
    payload = original["payload"]
    kind = event["type"]
    bcc = [entry["email"] for entry in payload.get("bcc") or []]
    recipient = event.get("recipient")
    if recipient and recipient.lower() in {b.lower() for b in bcc}:
        recipient = "a Bcc recipient"
    lines = [
        _DELIVERY_HEADLINE[kind],
        "",
        *_about(original, bcc),
        f"  Event:       {kind} (from {event['provider']}'s webhook)",
        f"  Recipient:   {recipient or 'not named by the provider'}",
        f"  When:        {event.get('occurred_at') or event.get('received_at')}",
        "",
        "What to do:",
        *_wrap(_DELIVERY_ADVICE[kind]),
        "",
        f"The whole record, with every delivery event: evq steps show {original['id']}",
        *_signature(original),
    ]
    return "\n".join(lines) + "\n"


def _about(original: Mapping[str, Any], bcc: Sequence[str]) -> list[str]:
    """The lines every notice starts with: which message, from whom, to whom, which step."""
    payload = original["payload"]
    return [
        f"  Subject:     {payload.get('subject') or ''}",
        *(
            f"  {label + ':':<12} {_addresses(payload.get(field) or [])}"
            for field, label in (("to", "To"), ("cc", "Cc"))
            if payload.get(field)
        ),
        # The notice goes to whoever notify names: Bcc recipients were hidden from everyone
        # the message went to, and stay hidden from the notice's reader too.
        *([f"  {'Bcc:':<12} {_count(bcc)}, not listed"] if bcc else []),
        f"  From:        {payload['from']['email']}",
        f"  Step:        run {original['run_id']}, step {original['step_id']} (evq step {original['id']})",
        f"  Message-ID:  {original['message_id']}",
    ]


def _signature(original: Mapping[str, Any]) -> list[str]:
    key = original.get("notify_key")
    why = (
        f"evq sent this to the notification address of the API key {key!r}, which enqueued the send"
        " (the request named no notify address)."
        if key
        else "evq sent this because the request named this address to be told (notify)."
    )
    return ["", "-- ", *textwrap.wrap(why, width=76), "It is an automatic message; replies are not read."]


# Every notice, whatever its reason, carries this legend: the reader never has to look a
# code up. (codes, what it means, what to do), in the order a reader meets them most.
LEGEND: tuple[tuple[tuple[str, ...], str, str], ...] = (
    (
        (Reason.PROVIDER_REJECTED.value, Reason.LATE_ANSWER.value),
        "the provider refused the message for good.",
        "Check the addresses and content against the provider's answer; send a corrected request as a new step.",
    ),
    (
        (Reason.POLICY_REFUSED.value,),
        "evq's own policy refused it at send time (a blocked domain, a size limit); nothing reached the provider.",
        "Do not send it again unless the operator changes the policy.",
    ),
    (
        (Reason.ATTEMPTS_EXHAUSTED.value, Reason.RETRY_BUDGET_EXHAUSTED.value),
        "every attempt failed temporarily (for as many attempts, or as long, as evq retries); none was delivered.",
        "Sending it again later as a new step is safe; an operator can also requeue it.",
    ),
    (
        (Reason.OPERATOR.value,),
        "an operator checked the send and closed it (their note is the reason given).",
        "If the email is still needed, send it again as a new step.",
    ),
    (
        (Reason.DENIED.value, Reason.APPROVAL_EXPIRED.value),
        "it waited for a person's approval, and was denied (their note is the reason given) or nobody approved "
        "it in time; nothing was sent.",
        "Denied: do not send it again as it was. Expired: if it is still needed, send it again as a new step.",
    ),
    (
        (Reason.AMBIGUOUS_RESPONSE.value, Reason.LEASE_EXPIRED.value, Reason.DEDUPE_WINDOW_CLOSED.value),
        "status unknown: the answer was lost, so the message may or may not have gone out.",
        "Do NOT send it again (the recipients could get it twice); an operator or the reconciler decides, and "
        "you are told of the verdict.",
    ),
    (
        (Reason.PARTIALLY_REFUSED.value,),
        "the message went out, but some recipients were refused.",
        "Send a new step to the refused recipients alone; the others have it.",
    ),
    (
        ("anything else",),
        "a reason evq does not describe here.",
        "Read the provider's answer above and the whole record (evq steps show); ask the operator if unsure.",
    ),
)
# The reason in words, for the line that names it (its code follows in brackets).
REASON_WORDS = {
    Reason.PROVIDER_REJECTED.value: "the provider refused the message",
    Reason.LATE_ANSWER.value: "the provider refused the message (its answer came late)",
    Reason.POLICY_REFUSED.value: "evq's policy refused the message before it was sent",
    Reason.ATTEMPTS_EXHAUSTED.value: "every attempt failed temporarily",
    Reason.RETRY_BUDGET_EXHAUSTED.value: "temporary failures for longer than evq retries",
    Reason.OPERATOR.value: "an operator closed the send",
    Reason.AMBIGUOUS_RESPONSE.value: "the provider's answer was lost or unclear",
    Reason.LEASE_EXPIRED.value: "the sending worker stopped before the answer was recorded",
    Reason.DEDUPE_WINDOW_CLOSED.value: "a retry could no longer be recognised as a duplicate by the provider",
    Reason.PARTIALLY_REFUSED.value: "some recipients were refused",
    Reason.DENIED.value: "a person denied the send when it waited for approval",
    Reason.APPROVAL_EXPIRED.value: "nobody approved the send before its approval expired",
    Reason.CANCELLED.value: "the send was cancelled before it went out",
}


def reason_words(reason: str | None) -> str:
    if not reason:
        return "no reason recorded"
    return f"{REASON_WORDS.get(reason, 'see the provider answer below')} [{reason}]"


def legend() -> list[str]:
    lines = ["What each reason means, and what to do:"]
    for codes, meaning, action in LEGEND:
        head = " / ".join(codes)
        lines += textwrap.wrap(f"{head}: {meaning} {action}", width=76, initial_indent="  * ", subsequent_indent="    ")
    return lines


def notice_text(original: Mapping[str, Any]) -> str:
    payload = original["payload"]
    status = Status(original["status"])
    if notice_kind(status, original["reason"]) == PARTIAL_KIND:
        return partial_notice_text(original)
    attempts = original["attempts"]
    bcc = [entry["email"] for entry in payload.get("bcc") or []]
    headline = (
        "Your email did not go out."
        if status is Status.REJECTED
        else "Nobody can tell yet whether your email went out."
    )
    lines = [
        headline,
        "",
        *_about(original, bcc),
        f"  Status:      {status.value} after {attempts} attempt{'s' if attempts != 1 else ''}"
        f" ({original['reason'] or 'no reason recorded'})",
        f"  Reason:      {reason_words(original['reason'])}",
        f"  Answer:      {_hidden(original['detail'], bcc) or '-'}",
        "",
        "What to do:",
        *_wrap(advice(status, original["reason"])),
        "",
        *legend(),
        "",
        f"The whole record, with every attempt and the provider's answers: evq steps show {original['id']}",
        *_signature(original),
    ]
    return "\n".join(lines) + "\n"


def partial_notice_text(original: Mapping[str, Any]) -> str:
    """A notice for a message the provider accepted for some recipients and refused for others.

    Every refused recipient is named with the server's answer, except a Bcc one: the
    notice shows no Bcc address (it says "a Bcc recipient"; `evq steps show` has it)."""
    payload = original["payload"]
    bcc_list = [entry["email"] for entry in payload.get("bcc") or []]
    bcc = {email.lower() for email in bcc_list}
    refused = original.get("refused") or {}
    lines_refused = []
    for recipient, answer in refused.items() if isinstance(refused, Mapping) else ():
        answer = answer if isinstance(answer, Mapping) else {}
        hidden = recipient.lower() in bcc
        shown = "a Bcc recipient" if hidden else recipient
        code = answer.get("code")
        # Servers quote the address in their reply, and may quote another recipient's.
        why = _hidden(" ".join(str(answer.get("reply") or "").split()), bcc_list) or ""
        lines_refused.append(f"  - {shown}: {code if code is not None else 'not sent'} {why}".rstrip())
    if not lines_refused:
        lines_refused = [f"  {_hidden(original['detail'], bcc_list) or 'the provider did not say which'}"]
    recipients = sum(len(payload.get(k) or ()) for k in ("to", "cc", "bcc"))
    lines = [
        f"Your email went out, but not to every recipient: {len(lines_refused)} of {recipients} refused it.",
        "",
        *_about(original, bcc_list),
        f"  Status:      accepted for the others ({original['reason']})",
        f"  Reason:      {reason_words(original['reason'])}",
        "",
        "Refused by the server:",
        *lines_refused,
        "",
        "What to do:",
        *_wrap(
            "Everyone else has the message: do not send it to them again. Check each refused address against the "
            "server's answer above; to reach those recipients, send a new step (a new step_id) to them alone."
        ),
        "",
        *legend(),
        "",
        f"The whole record, with the provider's answers: evq steps show {original['id']}",
        *_signature(original),
    ]
    return "\n".join(lines) + "\n"


def advice(status: Status, reason: str | None) -> str:
    if status is Status.UNKNOWN:
        return (
            "The provider may or may not have accepted the message. evq will not send it again on its own; "
            "do not send it again yourself either, or the recipients may get it twice. An operator (or evq's "
            "reconciler, where the provider can be asked) will check and close it; if it ends rejected, you "
            "will be told again."
        )
    return _ADVICE.get(reason or "", _ADVICE_DEFAULT)


_ADVICE_DEFAULT = (
    "The message was not delivered. Read the reason above; if the email is still needed, fix the cause and "
    "send it again as a new step (a new step_id)."
)
_PROVIDER_REFUSED = (
    "The provider refused this message for good: sending the same request again will be refused the same way. "
    "Check the recipient addresses and the content against the reason above, then send a corrected request as "
    "a new step (a new step_id)."
)
_ADVICE = {
    Reason.PROVIDER_REJECTED.value: _PROVIDER_REFUSED,
    Reason.LATE_ANSWER.value: _PROVIDER_REFUSED,
    Reason.POLICY_REFUSED.value: (
        "evq's own policy refused the message when it was about to be sent (for example a recipient domain that "
        "is now blocked, or a message over the size limit); nothing reached the provider. If the policy is right, "
        "do not send it again; otherwise ask the operator to change it, then send the request again as a new step."
    ),
    Reason.ATTEMPTS_EXHAUSTED.value: (
        "The provider failed temporarily on every attempt, and none of them can have been delivered. Sending it "
        "again later as a new step is safe; if this keeps happening, ask the operator to check the provider."
    ),
    Reason.RETRY_BUDGET_EXHAUSTED.value: (
        "The provider failed temporarily for as long as evq keeps retrying (EVQ_RETRY_FOR), and no attempt can "
        "have been delivered. An operator can requeue it (evq steps resolve ID --as retry), or you can send it "
        "again later as a new step."
    ),
    Reason.OPERATOR.value: (
        "An operator checked this send and closed it as not delivered (their note is the reason above). If the "
        "email is still needed, send it again as a new step."
    ),
}


def _count(bcc: Sequence[str]) -> str:
    return f"{len(bcc)} recipient{'s' if len(bcc) != 1 else ''}"


def _hidden(text: str | None, bcc: Sequence[str]) -> str | None:
    """``text`` (a provider's answer, which may quote a refused recipient) without the Bcc
    addresses, in the form stored or the ASCII (IDNA) form a server answers with."""
    if not text or not bcc:
        return text
    forms = {form for email in bcc for form in (email, f"{email.rsplit('@', 1)[0]}@{ascii_domain(email)}")}
    pattern = re.compile("|".join(re.escape(f) for f in sorted(forms, key=len, reverse=True)), re.IGNORECASE)
    return pattern.sub("(a Bcc recipient)", text)


def _addresses(entries: list[Mapping[str, Any]]) -> str:
    return ", ".join(f"{e['name']} <{e['email']}>" if e.get("name") else e["email"] for e in entries)


def _wrap(text: str, width: int = 76) -> list[str]:
    return textwrap.wrap(text, width=width, initial_indent="  ", subsequent_indent="  ")
