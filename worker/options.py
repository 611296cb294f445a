"""How an ``EVQ_*`` option is declared, read and refused.

Each config (the core's in worker/config.py, each adapter's beside it) declares its own
table of :class:`Option`; the one loader (ops/settings.py) reads them all from the
environment and the flags. A bad value is a :class:`ConfigError` that names the
variable and the flag, so the operator knows which line to fix.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from evq.worker.errors import ConfigError


@dataclass(frozen=True, slots=True)
class Option:
    name: str
    parse: Callable[[str], Any]
    default: Any
    help: str
    choices: tuple[str, ...] = ()
    secret: bool = False
    minimum: float | None = None
    maximum: float | None = None

    @property
    def env(self) -> str:
        return "EVQ_" + self.name.upper()

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


def bound_text(bound: float) -> str:
    """A bound as a setting is written: 1000000000, not 1e+09; 0.1 stays 0.1."""
    return str(int(bound)) if float(bound).is_integer() else f"{bound:g}"


def lowercase_list(value: str) -> tuple[str, ...]:
    """A comma-separated list: ``a, B,,c`` is ``("a", "b", "c")``."""
    return tuple(part.strip().lower() for part in value.split(",") if part.strip())


def boolean(value: str) -> bool:
    text = value.strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected true or false")


_DURATION_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def duration(value: str) -> float:
    """Seconds, or a number with s, m, h or d: ``5d``, ``12h``, ``90``."""
    text = value.strip().lower()
    unit = _DURATION_UNITS.get(text[-1:]) if text else None
    number = text[:-1] if unit is not None else text
    try:
        seconds = float(number) * (unit or 1.0)
    except ValueError:
        raise ValueError("expected seconds or a number with s, m, h or d (e.g. 5d)") from None
    if not seconds == seconds or seconds in (float("inf"), float("-inf")):
        raise ValueError("expected a finite duration")
    return seconds


def duration_or_forever(value: str) -> float | None:
    """A :func:`duration`, or ``forever`` (None: no end)."""
    if value.strip().lower() == "forever":
        return None
    return duration(value)


def parse(option: Option, raw: str, *, source: str) -> Any:
    """``raw`` read by ``option``; ``source`` (the variable or the flag) is named when it cannot be."""
    try:
        return option.parse(raw)
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f"{source}: cannot read {raw if not option.secret else '***'!r}: {exc}",
            hint=f"{option.env} / {option.flag}: {option.help}",
            field=source,
        ) from None


def bad(option: Option, message: str) -> ConfigError:
    """The refusal of a value that was read but is not acceptable."""
    return ConfigError(f"{option.env} ({option.flag}) {message}", hint=option.help, field=option.env)
