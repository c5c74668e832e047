"""Server-sent events: encoding for the client edge, decoding for the backend edge."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SseEvent:
    event: str
    data: str
    id: str | None = None
    retry: int | None = None  # the reconnection time the server asked for, in ms


def encode_sse_event(message: Any, event: str = "message", event_id: str | None = None) -> str:
    """One SSE event carrying a JSON-RPC message as a single data line."""
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {event}\ndata: {json.dumps(message, separators=(',', ':'))}\n\n"


def iter_sse_events(lines: Iterable[str | bytes]) -> Iterator[SseEvent]:
    """Decode SSE events from an iterable of lines (without line terminators), per the WHATWG rules."""
    event_type = ""
    data_lines: list[str] = []
    event_id: str | None = None
    retry: int | None = None
    dispatch_empty = False  # an event with an id or a retry but no data still tells the reader both
    for raw in lines:
        line = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        if line.endswith("\r"):
            line = line[:-1]
        if line == "":
            if data_lines or dispatch_empty:
                yield SseEvent(event_type or "message", "\n".join(data_lines), event_id, retry)
            event_type, data_lines, retry, dispatch_empty = "", [], None, False
            continue
        if line.startswith(":"):
            continue  # comment / keep-alive
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "data":
            data_lines.append(value)
        elif name == "event":
            event_type = value
        elif name == "id":
            if "\0" not in value:
                event_id = value
                dispatch_empty = True
        elif name == "retry" and value.isdigit():
            retry = int(value)
            dispatch_empty = True
    if data_lines:
        yield SseEvent(event_type or "message", "\n".join(data_lines), event_id, retry)
