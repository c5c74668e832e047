"""Durations written the way ToolHive writes them: ``500ms``, ``30s``, ``2m``, ``1h``, ``1m30s``."""

from __future__ import annotations

import re

_SECONDS_PER_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)"
# "ms" comes before "m" so that "500ms" is not read as 500 minutes followed by a stray "s".
_PART = re.compile(rf"({_NUMBER})(ms|h|m|s)")
_WHOLE = re.compile(rf"(?:{_NUMBER}(?:ms|h|m|s))+")
_BARE_NUMBER = re.compile(_NUMBER)
_EXAMPLES = "use e.g. 500ms, 30s, 2m"


def parse_duration(text: str) -> float:
    """Return the duration ``text`` in seconds; raise ``ValueError`` saying what is wrong."""
    if isinstance(text, bool) or not isinstance(text, (str, int, float)):
        raise ValueError(f"invalid duration: expected a string ({_EXAMPLES})")
    if isinstance(text, (int, float)):
        # YAML turns `timeout: 30` into a number; guessing seconds vs. milliseconds is worse.
        raise ValueError(f"invalid duration {text!r}: durations need a unit, e.g. 30s")
    stripped = text.strip()
    if _BARE_NUMBER.fullmatch(stripped):
        raise ValueError(f"invalid duration {_short(text)}: durations need a unit, e.g. 30s")
    if not _WHOLE.fullmatch(stripped):
        raise ValueError(f"invalid duration {_short(text)} ({_EXAMPLES})")
    seconds = sum(float(number) * _SECONDS_PER_UNIT[unit] for number, unit in _PART.findall(stripped))
    if seconds <= 0:
        raise ValueError(f"invalid duration {_short(text)}: must be greater than 0")
    return seconds


def _short(text: str, limit: int = 40) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")
