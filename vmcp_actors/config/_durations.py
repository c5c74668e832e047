"""Durations written the way ToolHive writes them: ``500ms``, ``30s``, ``2m``, ``1h``, ``1m30s``;
and ``30d`` (days) for the lifetimes of sign-ins."""

from __future__ import annotations

import re

_SECONDS_PER_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)"
# "ms" comes before "m" so that "500ms" is not read as 500 minutes followed by a stray "s".
_PART = re.compile(rf"({_NUMBER})(ms|d|h|m|s)")
_WHOLE = re.compile(rf"(?:{_NUMBER}(?:ms|d|h|m|s))+")
_BARE_NUMBER = re.compile(_NUMBER)
_EXAMPLES = "use e.g. 500ms, 30s, 2m"


def parse_duration(text: str, *, allow_zero: bool = False) -> float:
    """Return the duration ``text`` in seconds; raise ``ValueError`` saying what is wrong.

    Zero is refused unless ``allow_zero``; then ``0`` needs no unit (it is zero in any unit).
    """
    if isinstance(text, bool) or not isinstance(text, (str, int, float)):
        raise ValueError(f"invalid duration: expected a string ({_EXAMPLES})")
    if allow_zero and _is_bare_zero(text):
        return 0.0
    if isinstance(text, (int, float)):
        # YAML turns `timeout: 30` into a number; guessing seconds vs. milliseconds is worse.
        raise ValueError(f"invalid duration {text!r}: durations need a unit, e.g. 30s")
    stripped = text.strip()
    if _BARE_NUMBER.fullmatch(stripped):
        raise ValueError(f"invalid duration {_short(text)}: durations need a unit, e.g. 30s")
    if not _WHOLE.fullmatch(stripped):
        if stripped.startswith("-") and _WHOLE.fullmatch(stripped[1:].lstrip()):
            raise ValueError(f"invalid duration {_short(text)}: must not be negative ({_EXAMPLES})")
        raise ValueError(f"invalid duration {_short(text)} ({_EXAMPLES})")
    seconds = sum(float(number) * _SECONDS_PER_UNIT[unit] for number, unit in _PART.findall(stripped))
    if seconds <= 0 and not allow_zero:
        raise ValueError(f"invalid duration {_short(text)}: must be greater than 0")
    return seconds


def _is_bare_zero(value: str | int | float) -> bool:
    if isinstance(value, (int, float)):
        return value == 0
    return bool(_BARE_NUMBER.fullmatch(value.strip())) and float(value) == 0


def _short(text: str, limit: int = 40) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")
