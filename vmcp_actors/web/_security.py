"""DNS-rebinding protection (the Host and Origin of a request must be ours), and the
operator tokens' check."""

from __future__ import annotations

import hmac
from urllib.parse import urlsplit

from flask import request

from vmcp_actors.runtime import Runtime


def _hostname(host_header: str) -> str:
    if host_header.startswith("["):  # [::1]:4483
        return host_header[1 : host_header.find("]")].lower()
    return host_header.rsplit(":", 1)[0].lower() if host_header.count(":") == 1 else host_header.lower()


def host_allowed(runtime: Runtime, host_header: str | None) -> bool:
    if runtime.any_host:
        return True
    if not host_header:
        return False
    # allowedHosts entries may be bare names (any port) or name:port (that port only).
    return _hostname(host_header) in runtime.allowed_hosts or host_header.lower() in runtime.allowed_hosts


def origin_allowed(runtime: Runtime, origin: str | None) -> bool:
    if origin is None:
        return True  # not a browser request
    if origin in runtime.config.operational.allowed_origins:
        return True
    parts = urlsplit(origin)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return False
    return runtime.any_host or parts.hostname.lower() in runtime.allowed_hosts or parts.netloc.lower() in runtime.allowed_hosts


def bearer_matches(expected: str) -> bool:
    """The request's ``Authorization: Bearer`` token is ``expected`` (constant-time)."""
    scheme, _, presented = request.headers.get("Authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(presented.strip().encode(), expected.encode())
