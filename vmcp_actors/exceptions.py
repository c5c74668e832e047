"""The project's own errors, one module for all layers."""

from __future__ import annotations


class VmcpError(Exception):
    """Base of every error raised by vmcp-actors."""


class ConfigError(VmcpError):
    """The config file is invalid; ``errors`` holds one ``path: message`` line per problem."""

    def __init__(self, errors: list[str] | tuple[str, ...]):
        self.errors = tuple(errors)
        super().__init__("invalid config:\n" + "\n".join(f"  {e}" for e in self.errors))


class BackendError(VmcpError):
    """A backend exchange failed.

    The message names the backend, never its URL: these messages may reach MCP clients.
    """

    def __init__(self, backend: str, message: str):
        self.backend = backend
        super().__init__(message)


class BackendTimeout(BackendError):
    """The backend did not answer within its configured timeout."""


class BackendUnavailable(BackendError):
    """The backend could not be reached (connection refused, reset, DNS)."""


class BackendNotTried(BackendUnavailable):
    """The gateway did not reach for the backend (its own cap, an open circuit): nothing
    was learned about the backend itself."""


class BackendHTTPError(BackendError):
    """The backend answered with an unexpected HTTP status. ``challenge``: its
    ``WWW-Authenticate`` header on a 401 or 403 (what it wants of a token)."""

    def __init__(self, backend: str, message: str, status: int, challenge: str | None = None):
        self.status = status
        self.challenge = challenge
        super().__init__(backend, message)


class BackendSessionExpired(BackendHTTPError):
    """The backend answered 404 to our session id: it restarted or forgot us."""


class BackendCancelled(BackendError):
    """The call was cancelled (the client sent notifications/cancelled) and its exchange ended."""


class BackendProtocolError(BackendError):
    """The backend's answer is not valid MCP over streamable HTTP."""


class BackendRpcError(BackendError):
    """The backend answered with a JSON-RPC error object."""

    def __init__(self, backend: str, code: int, message: str, data: object = None, *, status: int = 200):
        self.code = code
        self.rpc_message = message
        self.data = data
        self.status = status  # the HTTP status it came with (a 2026-07-28 backend answers 4xx with one)
        super().__init__(backend, f"backend {backend!r} answered error {code}: {message}")


class BackendAuthError(BackendError):
    """Credentials for a backend could not be obtained for this caller (e.g. a failed token
    exchange). ``idp_error`` is the identity provider's error code, if it gave one."""

    def __init__(self, backend: str, message: str, idp_error: str | None = None):
        self.idp_error = idp_error
        super().__init__(backend, message)


class ConnectionNeeded(BackendAuthError):
    """The backend needs the person's own authorization (``outgoingAuth`` type ``oauth``)
    and they have not given it, or it lapsed: they are asked to connect. ``scopes``: what
    to ask for (the backend's challenge joined to what was asked before)."""

    def __init__(self, backend: str, message: str, scopes: tuple[str, ...] = ()):
        self.scopes = scopes
        super().__init__(backend, message)
