"""ASGI middleware helpers for test backends that look at a request's body before the app
does: ``read_body`` reads it whole, ``replaying`` hands it to the app as if unread."""

from __future__ import annotations

from typing import Any


async def read_body(receive: Any) -> bytes:
    """The request's whole body (what arrived, if the client went away first)."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":  # the client went away
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    return b"".join(chunks)


def replaying(body: bytes, receive: Any) -> Any:
    """A ``receive`` that hands on the body read already, then what the client sends next."""
    sent = False

    async def replayed() -> dict[str, Any]:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replayed
