"""EVQ_DATABASE_URL checked before anything hands it to libpq (issue 13).

libpq echoes a conninfo string it cannot parse, password and all, in its error, and
psycopg_pool would log that error on every retry for 15 s. So the URL is parsed here
first: the SQLAlchemy spelling (``postgresql+psycopg://``) is accepted by normalising
it; anything else libpq refuses is a ConfigError at once, naming the setting and never
echoing the URL. :func:`passwords` finds the password even in a URL that does not
parse, so it can be registered as a secret before anything can print it.
"""

from __future__ import annotations

import re
from urllib.parse import unquote, urlsplit

from evq.worker.errors import ConfigError

# Driver suffixes SQLAlchemy and others put on the scheme; libpq knows only the bare one.
_SCHEME = re.compile(r"^(postgres(?:ql)?)\+[a-z0-9_]+://", re.IGNORECASE)
# user:password@ in anything URL-shaped, and password=... in a key=value string.
_URL_PASSWORD = re.compile(r"://[^:/@\s]*:([^@\s]+)@")
# A URL whose authority (up to the first "/", "?" or "#") holds two "@": an unencoded one in
# the user name or password.
_AUTHORITY_AT = re.compile(r"^postgres(?:ql)?://[^/?#]*@[^/?#]*@", re.IGNORECASE)
_KV_PASSWORD = re.compile(r"password\s*=\s*('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)


def normalise(url: str) -> str:
    """The libpq form of ``url`` (a driver suffix on the scheme dropped); raises ConfigError
    with a message free of the URL when libpq cannot parse it."""
    url = _SCHEME.sub(lambda m: "postgresql://", url, count=1)
    if _AUTHORITY_AT.match(url):
        # libpq ends the password at the first "@" and takes the rest for the host, so its
        # error ("failed to resolve host 'word@db'") would show the password's tail.
        raise ConfigError(
            "EVQ_DATABASE_URL (--database-url) has more than one '@' before its host: "
            "a user name or password holding '@' must be percent-encoded (%40)",
            hint="e.g. postgresql://user:p%40ss@host:5432/evq; ':' is %3A and '/' is %2F",
            field="database_url",
        )
    import psycopg  # here, not above: every `evq` command imports this module, `evq --help` too

    try:
        psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError as exc:
        raise ConfigError(
            f"EVQ_DATABASE_URL (--database-url) is not a PostgreSQL URL libpq can read ({_why(exc)})",
            hint="e.g. postgresql://user:pass@host:5432/evq or 'host=... dbname=... user=...'",
            field="database_url",
        ) from None
    return url


def passwords(url: str | None) -> list[str]:
    """Every value in ``url`` that may be its password, parseable or not."""
    if not url:
        return []
    found: set[str] = set()
    try:
        if password := urlsplit(url).password:
            found.add(password)
    except ValueError:
        pass
    for match in _URL_PASSWORD.finditer(url):
        found |= {match[1], unquote(match[1])}
    for match in _KV_PASSWORD.finditer(url):
        value = match[1]
        found.add(value)
        if value.startswith("'") and value.endswith("'"):
            found.add(value[1:-1].replace("\\'", "'").replace("\\\\", "\\"))
    import psycopg

    try:
        if password := psycopg.conninfo.conninfo_to_dict(_SCHEME.sub("postgresql://", url, count=1)).get("password"):
            found.add(str(password))
    except psycopg.ProgrammingError:
        pass
    return sorted(found)


def _why(exc: Exception) -> str:
    """libpq's complaint without the part that quotes the string back."""
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return re.sub(r'"[^"]*"', '"..."', text)
