"""The ops page's session: a signed cookie (itsdangerous's URL-safe serializer, HMAC with a
server-side secret: the signed-cookie format Flask and Starlette use, not one of our own), HttpOnly
and SameSite=Strict, holding which key signed in (its public id, never the key), the key's
session generation at sign-in, the CSRF token every form must carry back, and the time zone
the visitor chose for the page's times (none: the server's EVQ_OPS_TIMEZONE).

The cookie holds no name and no role: each request re-reads the key by its id and builds the
identity it acts under with worker/keys.py's ``identity_of``, as the CLI, the HTTP API and MCP
do (ops/web/page/common.py, ``signed_in``), so the page's rules see the same key id, name and
role as theirs, and a revoke ends the key's sessions at their next click. Signing out does too:
it bumps the key's ``session_generation``, and a cookie made under an older one is refused, so
a copy of the cookie (another tab, a proxy's log) is worth nothing after.

A visitor who has not signed in gets a session too, with a CSRF token and no identity,
so the sign-in form is protected like every other.

The same secret (under a key of its own) seals a bulk preview (:meth:`Sessions.seal`): the
apply form carries back the exact ids, the states they were seen in and the note and verdict
in hidden fields, and only a seal over those values, made for this session, lets an apply act
on them, so a changed field or a form from another session or page is refused, not acted on.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from itsdangerous import BadSignature, URLSafeSerializer

from evq.worker.keys import Identity

COOKIE = "evq_session"
MAX_AGE = 8 * 3600


@dataclass(frozen=True, slots=True)
class Session:
    csrf: str
    expires: int
    key_id: str | None = None
    generation: int | None = None  # api_keys.session_generation when this session signed in
    tz: str | None = None  # the IANA zone chosen on /ops/zone (checked there, and again when used)
    # Never from the cookie: set by ops/web/page/common.py's signed_in from the key's row as it
    # is now (worker/keys.py's identity_of); None for a visitor not (or no longer) signed in.
    identity: Identity | None = field(default=None, compare=False)

    def csrf_ok(self, token: str | None) -> bool:
        return bool(token) and hmac.compare_digest(self.csrf.encode(), str(token).encode())


class Sessions:
    def __init__(self, secret: str | None, *, max_age: int = MAX_AGE):
        # Unset: a secret of this process alone, so every session ends when it restarts.
        raw = secret.encode() if secret else secrets.token_bytes(32)
        self._cookies = URLSafeSerializer(raw, salt="evq ops-page session v1")
        # Its own key: a seal can never pass for a cookie's signature, nor the other way round.
        self._seal_key = hashlib.sha256(b"evq ops-page preview seal v1\0" + raw).digest()
        self.max_age = max_age

    def new(self, *, identity: Identity | None = None, generation: int | None = None) -> Session:
        return Session(
            csrf=secrets.token_urlsafe(32),
            expires=int(time.time()) + self.max_age,
            key_id=identity.key_id if identity else None,
            generation=generation,
            identity=identity,
        )

    def dump(self, session: Session) -> str:
        return self._cookies.dumps(
            {"c": session.csrf, "e": session.expires, "k": session.key_id, "g": session.generation, "z": session.tz}
        )

    def load(self, cookie: str | None) -> Session | None:
        """The session in ``cookie`` if its signature holds and it has not expired (the expiry is
        the sign-in's, carried in the cookie: re-signing on every answer does not extend it)."""
        if not cookie or len(cookie) > 4096:
            return None
        try:
            data = self._cookies.loads(cookie)
            generation, zone = data.get("g"), data.get("z")
            key_id = data.get("k")
            session = Session(
                csrf=data["c"],
                expires=int(data["e"]),
                key_id=key_id if isinstance(key_id, str) else None,
                generation=generation if isinstance(generation, int) else None,
                tz=zone if isinstance(zone, str) else None,
            )
        except (BadSignature, ValueError, KeyError, TypeError, AttributeError):
            return None
        return session if session.expires > time.time() else None

    def seal(self, session: Session, purpose: str, fields: Mapping[str, str]) -> str:
        """An HMAC-SHA256 over what a preview showed (``fields``: the values its apply form posts
        back) for this session (its CSRF token, new at every sign-in, and its key) and ``purpose``
        (which form), so the seal of one preview fits no other rows, note, session or form.

        Line breaks count as LF: a browser posts a hidden field's line breaks as CRLF."""
        canonical = json.dumps(
            [purpose, session.csrf, session.key_id, sorted((k, _lines(v)) for k, v in fields.items())],
            separators=(",", ":"),
        )
        digest = hmac.new(self._seal_key, canonical.encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).decode().rstrip("=")

    def sealed(self, session: Session, purpose: str, fields: Mapping[str, str], seal: str | None) -> bool:
        """Whether ``seal`` is :meth:`seal`'s for these fields, this session and purpose."""
        if not seal or len(seal) > 100:
            return False
        return hmac.compare_digest(self.seal(session, purpose, fields).encode(), str(seal).encode())


def _lines(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "\n")
