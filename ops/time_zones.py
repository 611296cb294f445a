"""Time zones an operator may name (EVQ_APPROVAL_TIMEZONE, the ops page's zone): IANA names the
system knows, never a path or one of the zone database's special files."""

from __future__ import annotations

import functools
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones


def time_zone(name: str) -> str:
    """An IANA time zone name the system knows (``Europe/Berlin``, ``UTC``), as given; an
    unknown or malformed one (``Mars/Olympus``, ``../etc``) is refused with ValueError."""
    text = name.strip()
    try:
        ZoneInfo(text)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        # ZoneInfo reads a file named by the key: refuse anything that is not a known zone.
        raise ValueError(f"unknown time zone {text[:80]!r} (an IANA name such as UTC or Europe/Berlin)") from None
    if text not in zone_names():
        # ZoneInfo also opens right/ (leap-second clocks), posix/ copies and files such as
        # posixrules, localtime or Factory that are no zone an operator means.
        raise ValueError(f"{text[:80]!r} is not an IANA zone name (such as UTC or Europe/Berlin)")
    return text


# Files in the zone database that ZoneInfo opens but that name no zone a person lives in.
NOT_ZONES = frozenset({"posixrules", "localtime", "Factory"})


@functools.cache
def zone_names() -> frozenset[str]:
    """The IANA zone names an operator may choose: the system's, less right/ and posix/ copies
    and the special files (NOT_ZONES)."""
    return frozenset(z for z in available_timezones() if not z.startswith(("right/", "posix/")) and z not in NOT_ZONES)
