"""DNS-rebinding protection (the Host and Origin of a request must be ours), the
operator tokens' check, and the browser cookies that bind a sign-in or a connect to the
browser that started it."""

from __future__ import annotations

import hashlib
import hmac
import secrets
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


def browser_secret(cookie: str) -> tuple[str, bool]:
    """This browser's secret in ``cookie`` (a new one when it has none) and whether it is new."""
    current = request.cookies.get(cookie, "")
    if 20 <= len(current) <= 100:
        return current, False
    return secrets.token_urlsafe(32), True


def browser_digest(secret: str) -> str:
    """What the records keep of a browser's secret."""
    return hashlib.sha256(secret.encode()).hexdigest()


def same_browser(cookie: str, digest: str) -> bool:
    """Whether this request comes from the browser whose secret's digest is ``digest``."""
    presented = request.cookies.get(cookie, "")
    return bool(presented) and hmac.compare_digest(browser_digest(presented), digest)


def from_own_page(public_url: str) -> bool:
    """Whether a form post comes from the gateway's own pages: no Origin (an older browser),
    or the public URL's origin."""
    origin = request.headers.get("Origin")
    parts = urlsplit(public_url)
    return origin is None or origin == f"{parts.scheme}://{parts.netloc}"
