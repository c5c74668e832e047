"""Each person's connections to backends that need their own authorization (outgoingAuth
type ``oauth``): the gateway is an OAuth client of each such backend's authorization server.

* **The backend's authorization server**, and the gateway's client there, are learned by
  ``_backend_servers.BackendAuthorization`` (behind its address guard).
* **A connect** starts from a link (``/connect/<ticket>``: random, no personal data, kept
  ``TICKET_TTL``) made for one person and backend. The page checks that the browser's
  person is that person, then sends them to the server with PKCE S256, ``state`` bound to
  the browser, ``resource`` (RFC 8707); the callback checks ``iss`` (RFC 9207), takes the
  flow once, and stores the tokens under (person, backend), never under a session.
* **Tokens** are refreshed before they expire, by one worker at a time (a lock in the
  records; the others wait for its result). A refresh the server refuses, or a 401 from the
  backend, ends that one connection: the person is asked to connect again.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import threading
import time
from collections.abc import Callable
from typing import Any

import requests
from authlib.integrations.base_client.errors import OAuthError as ClientOAuthError

from vmcp_actors.config import VmcpConfig
from vmcp_actors.exceptions import BackendAuthError, ConnectionNeeded
from vmcp_actors.identity import Identity
from vmcp_actors.oauth._backend_servers import (
    CONNECTION_TTL,
    BackendAuthorization,
    ConnectRefused,
    ConnectUnavailable,
    UrlGuard,
    parse_challenge,
    resource_of,
)
from vmcp_actors.oauth._records import OAuthRecords, await_renewal, kept_tokens
from vmcp_actors.oauth._server import Events

logger = logging.getLogger(__name__)

TICKET_TTL = 600.0  # a connect link works this long
FLOW_TTL = 600.0  # a connect under way (at the authorization server) this long
REFRESH_LOCK_TTL = 15.0
REFRESH_WAIT = 12.0
LOCAL_TOKEN_FOR = 5.0  # a token read from the records is reused this long by this process


def person_of(identity: Identity) -> tuple[str, str]:
    return identity.issuer, identity.subject


def person_key(identity: Identity) -> str:
    """Whose connection: the person (issuer and subject), as a digest."""
    return person_digest(person_of(identity))


def connection_key(person: tuple[str, str] | list[str], backend: str) -> str:
    """The records' key of a person's connection to ``backend``."""
    return f"{person_digest(person)}|{backend}"


def same_person(one: tuple[str, str] | list[str], other: tuple[str, str] | list[str]) -> bool:
    return person_digest(one) == person_digest(other)


def secret_key(secret: str) -> str:
    """A record's key for a random secret (a ticket, a state): its digest, so keys reveal none."""
    return hashlib.sha256(secret.encode()).hexdigest()


def person_digest(person: tuple[str, str] | list[str]) -> str:
    """(issuer, subject) as a key; an issuer with or without its trailing slash is one issuer
    (an access token's ``iss`` and the provider's discovery may differ in it)."""
    return hashlib.sha256(f"{person[0].rstrip('/')}\0{person[1]}".encode()).hexdigest()[:40]


class Connections:
    """The people's connections (implements backends' ``PersonalTokens``)."""

    def __init__(self, config: VmcpConfig, records: OAuthRecords, secrets_by_backend: dict[str, str | None],
                 events: Events | None = None, clock: Callable[[], float] = time.time,
                 guard_for: Callable[[str], UrlGuard] | None = None):
        public_url = config.public_url
        assert public_url is not None, "the config checks a public URL is known"
        self.public_url = public_url
        self.records = records
        self.events = events if events is not None else Events(family="connection")
        self._clock = clock
        self._http = requests.Session()
        self._http.trust_env = False
        self.backends: dict[str, BackendAuthorization] = {}
        for name in config.connected_backends:
            backend = config.backend(name)
            auth = config.outgoing_auth.for_backend(name)
            assert backend is not None and auth.oauth is not None
            url = backend.url or ""
            self.backends[name] = BackendAuthorization(
                name, url, auth.oauth, secrets_by_backend.get(name), public_url, config.name, records, self._http,
                guard_for(url) if guard_for is not None and backend.url else None)
        self._tokens_lock = threading.Lock()  # guards _tokens (tokens this process read lately)
        self._tokens: dict[tuple[str, str], tuple[str, float]] = {}
        self._changed = threading.Condition()  # wakes waiters when this process stores a connection
        self.on_change: Callable[[Identity | tuple[str, str], str], None] | None = None
        self.refreshes = 0

    # -- tokens (PersonalTokens) ------------------------------------------------------------

    def token(self, identity: Identity | None, backend: str) -> str:
        if identity is None:
            raise ConnectionNeeded(backend, f"backend {backend!r} needs a signed-in person")
        key = (person_key(identity), backend)
        now = time.monotonic()
        with self._tokens_lock:
            kept = self._tokens.get(key)
            if kept is not None and now < kept[1]:
                return kept[0]
        connection = self._fresh(identity, backend)
        until = min(now + LOCAL_TOKEN_FOR, now + max(0.0, connection["refresh_at"] - self._clock()))
        with self._tokens_lock:
            if len(self._tokens) > 10_000:
                self._tokens.clear()
            self._tokens[key] = (connection["access_token"], until)
        return connection["access_token"]

    def refused(self, identity: Identity | None, backend: str, token: str, status: int,
                challenge: str | None) -> ConnectionNeeded | None:
        """A 401, or a 403 for scope, asks the person to connect (again); another 403 is the
        backend's answer to this call (None), and the connection stays."""
        asked = parse_challenge(challenge)
        if status == 403 and asked.get("error") != "insufficient_scope":
            return None
        if identity is None:
            return ConnectionNeeded(backend, f"backend {backend!r} needs a signed-in person")
        connection = self.records.get("connection", connection_key(person_of(identity), backend)) or {}
        scopes = tuple(connection.get("scopes", ()))
        if status == 403:  # for scope (another 403 was answered above)
            wanted = tuple(dict.fromkeys([*scopes, *asked.get("scope", "").split()]))
            self.events("call", "insufficient_scope", backend=backend, user=identity.subject)
            return ConnectionNeeded(backend, f"backend {backend!r} needs more of your authorization "
                                             f"({' '.join(wanted)}): connect again", wanted)
        self._forget(identity, backend, only_token=token)
        self.events("call", "token_refused", backend=backend, user=identity.subject)
        return ConnectionNeeded(backend, f"backend {backend!r} no longer accepts your authorization: connect "
                                         "again", scopes)

    def connected(self, identity: Identity | None, backend: str) -> bool:
        return identity is not None and \
            self.records.get("connection", connection_key(person_of(identity), backend)) is not None

    def _fresh(self, identity: Identity, backend: str) -> dict[str, Any]:
        record_key = connection_key(person_of(identity), backend)
        connection = self.records.get("connection", record_key)
        if connection is None:
            raise ConnectionNeeded(backend, f"backend {backend!r} needs your authorization: connect it first")
        if self._clock() < connection["refresh_at"]:
            return connection
        if not connection.get("refresh_token"):
            if self._clock() < connection["expires_at"]:
                return connection
            self._forget(identity, backend)
            raise ConnectionNeeded(backend, f"your authorization at backend {backend!r} expired: connect again",
                                   tuple(connection.get("scopes", ())))
        holder = self.records.acquire(f"connection-refresh:{record_key}", REFRESH_LOCK_TTL)
        if holder is None:
            return self._refreshed_by_another(identity, backend, connection)
        try:
            current = self.records.get("connection", record_key)
            if current is None:
                raise ConnectionNeeded(backend, f"backend {backend!r} needs your authorization: connect it first")
            if self._clock() < current["refresh_at"]:
                return current  # another worker refreshed it meanwhile
            return self._refresh(identity, backend, current)
        finally:
            self.records.release(f"connection-refresh:{record_key}", holder)

    def _refresh(self, identity: Identity, backend: str, current: dict[str, Any]) -> dict[str, Any]:
        authorization = self.backends[backend]
        try:
            server = authorization.server()
            client = current["client"]
            tokens = authorization.token_request(lambda session: session.refresh_token(
                server.token_endpoint, refresh_token=current["refresh_token"], **resource_of(server)), client)
        except ConnectRefused as refused:
            self.events("refresh", "refused", backend=backend, user=identity.subject, error=str(refused))
            self._forget(identity, backend)
            raise ConnectionNeeded(backend, f"backend {backend!r} no longer accepts your authorization: connect "
                                            "again", tuple(current.get("scopes", ()))) from None
        except ConnectUnavailable as down:
            self.events("refresh", "unavailable", backend=backend, user=identity.subject)
            if self._clock() < current["expires_at"]:
                return current  # still valid: try again on a later call
            raise BackendAuthError(backend, str(down)) from None
        self.refreshes += 1
        renewed = {**current, **kept_tokens(tokens, self._clock())}
        if not renewed.get("refresh_token"):
            renewed["refresh_token"] = current["refresh_token"]  # the server does not rotate it
        self.records.put("connection", connection_key(person_of(identity), backend), renewed, CONNECTION_TTL)
        self.events("refresh", "ok", backend=backend, user=identity.subject)
        return renewed

    def _refreshed_by_another(self, identity: Identity, backend: str, stale: dict[str, Any]) -> dict[str, Any]:
        record_key = connection_key(person_of(identity), backend)
        outcome, kept = await_renewal(self.records, "connection", record_key, f"connection-refresh:{record_key}",
                                      stale, REFRESH_WAIT)
        if outcome == "renewed":
            assert kept is not None
            return kept
        if outcome == "gone":
            raise ConnectionNeeded(backend, f"backend {backend!r} no longer accepts your authorization: connect "
                                            "again", tuple(stale.get("scopes", ())))
        if outcome == "late":
            raise BackendAuthError(backend, f"backend {backend!r}: your authorization is being renewed; retry")
        return self._fresh(identity, backend)  # the other worker gave up without a result: once more here

    def _forget(self, identity: Identity, backend: str, only_token: str | None = None) -> None:
        record_key = connection_key(person_of(identity), backend)
        if only_token is None:
            self.records.delete("connection", record_key)
        else:  # not one a refresh put there meanwhile
            self.records.update("connection", record_key,
                                lambda record: None if record.get("access_token") == only_token else record)
        with self._tokens_lock:
            self._tokens.pop((person_key(identity), backend), None)

    # -- connect links -----------------------------------------------------------------------

    def link(self, identity: Identity, backend: str, scopes: tuple[str, ...] = ()) -> tuple[str, str]:
        """A new connect link for this person and backend: ``(url, elicitation id)``."""
        ticket = secrets.token_urlsafe(24)
        elicitation = secrets.token_urlsafe(12)
        self.records.put("connect-ticket", secret_key(ticket), {"person": [identity.issuer, identity.subject],
                                                                "backend": backend, "scopes": list(scopes),
                                                                "elicitation": elicitation}, TICKET_TTL)
        self.events("link", "made", backend=backend, user=identity.subject)
        return f"{self.public_url}/connect/{ticket}", elicitation

    def ticket(self, ticket: str) -> dict[str, Any] | None:
        return self.records.get("connect-ticket", secret_key(ticket)) if 10 <= len(ticket) <= 100 else None

    def authorization_url(self, ticket: dict[str, Any], ticket_id: str, browser: str) -> str:
        """Where the person goes to authorize: the flow is kept under its ``state``."""
        backend = ticket["backend"]
        authorization = self.backends[backend]
        server = authorization.server()
        client = authorization.client(server)
        # The operator's choice, else what the backend asks for; plus what a 403 asked for since.
        asked = authorization.config.scopes or server.scopes
        scopes = tuple(dict.fromkeys([*asked, *ticket.get("scopes", ())]))
        state, verifier = secrets.token_urlsafe(24), secrets.token_urlsafe(48)
        with authorization.session(client, scopes) as session:
            url, _ = session.create_authorization_url(server.authorization_endpoint, state=state,
                                                      code_verifier=verifier, **resource_of(server))
        self.records.put("connect-flow", secret_key(state), {
            "ticket": ticket_id, "browser": browser, "verifier": verifier, "backend": backend,
            "person": ticket["person"], "issuer": server.issuer, "client": client, "scopes": list(scopes),
            "elicitation": ticket["elicitation"]}, FLOW_TTL)
        self.events("authorize", "sent", backend=backend)
        return url

    def take_flow(self, state: str) -> dict[str, Any] | None:
        """The connect under way that ``state`` names, taken (a callback uses it once)."""
        return self.records.take("connect-flow", secret_key(state)) if 10 <= len(state) <= 100 else None

    def finish(self, state: str, code: str, iss: str | None, browser: str) -> dict[str, Any]:
        """The callback: the flow of ``state`` (taken once), its code exchanged, the tokens
        stored for its person. ConnectRefused when anything does not match."""
        flow = self.take_flow(state)
        if flow is None:
            self.events("callback", "expired")
            raise ConnectRefused("this connect has expired or was already finished")
        backend = flow["backend"]
        if not secrets.compare_digest(flow["browser"], browser):
            self.events("callback", "other_browser", backend=backend)
            raise ConnectRefused("this connect was started in another browser")
        authorization = self.backends.get(backend)
        if authorization is None:
            raise ConnectRefused("this backend no longer takes connections")
        server = authorization.server()
        if (iss is not None and iss.rstrip("/") != flow["issuer"]) or (iss is None and server.sends_iss):
            self.events("callback", "issuer_mismatch", backend=backend)
            raise ConnectRefused("the answer came from another authorization server")
        try:
            tokens = authorization.token_request(lambda session: session.fetch_token(
                server.token_endpoint, grant_type="authorization_code", code=code, code_verifier=flow["verifier"],
                **resource_of(server)), flow["client"])
        except ConnectRefused as refused:
            self.events("callback", "code_refused", backend=backend, error=str(refused))
            raise ConnectRefused("the authorization server did not accept the answer") from None
        now = self._clock()
        kept = kept_tokens(tokens, now)
        granted = tokens.get("scope") if isinstance(tokens.get("scope"), str) else None
        issuer, subject = flow["person"]
        connection = {**kept, "backend": backend, "person": [issuer, subject], "client": flow["client"],
                      "scopes": granted.split() if granted else flow["scopes"], "since": now}
        ttl = CONNECTION_TTL if kept["refresh_token"] else max(1.0, kept["expires_at"] - now)
        self.records.put("connection", connection_key((issuer, subject), backend), connection, ttl)
        self.records.delete("connect-ticket", secret_key(flow["ticket"]))
        with self._tokens_lock:
            self._tokens.pop((person_digest((issuer, subject)), backend), None)
        with self._changed:
            self._changed.notify_all()
        self.events("connect", "ok", backend=backend, user=subject)
        if self.on_change is not None:
            self.on_change((issuer, subject), backend)
        return {"backend": backend, "elicitation": flow["elicitation"], "person": [issuer, subject]}

    def now(self) -> float:
        return self._clock()

    def wait_connected(self, identity: Identity, backend: str, timeout: float, since: float = 0.0) -> bool:
        """Whether the person has connected ``backend`` (at ``since`` or later: a connect asked
        for more scopes replaces one already there), waiting up to ``timeout`` for it (woken
        by a connect in this process; another worker's is seen within a second)."""
        deadline = time.monotonic() + timeout
        record_key = connection_key(person_of(identity), backend)
        while True:
            connection = self.records.get("connection", record_key)
            if connection is not None and connection.get("since", 0.0) >= since:
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            with self._changed:
                self._changed.wait(min(1.0, left))

    # -- the person's own view -----------------------------------------------------------------

    def of(self, person: tuple[str, str]) -> list[dict[str, Any]]:
        """Their connections, without tokens."""
        found = []
        for backend in sorted(self.backends):
            connection = self.records.get("connection", connection_key(person, backend))
            found.append({"backend": backend, "connected": connection is not None,
                          "scopes": list(connection.get("scopes", ())) if connection else [],
                          "since": connection.get("since") if connection else None,
                          "state": _state(connection, self._clock())})
        return found

    def disconnect(self, person: tuple[str, str], backend: str) -> bool:
        """Forget the connection and revoke its tokens where the server offers revocation."""
        connection = self.records.take("connection", connection_key(person, backend))
        with self._tokens_lock:
            self._tokens.pop((person_digest(person), backend), None)
        if connection is None:
            return False
        authorization = self.backends.get(backend)
        if authorization is not None:
            self._revoke(authorization, connection)
        self.events("disconnect", "ok", backend=backend, user=person[1])
        if self.on_change is not None:
            self.on_change(person, backend)
        return True

    def _revoke(self, authorization: BackendAuthorization, connection: dict[str, Any]) -> None:
        try:
            server = authorization.server()
            if server.revocation_endpoint is None:
                return
            for token, hint in ((connection.get("refresh_token"), "refresh_token"),
                                (connection.get("access_token"), "access_token")):
                if token:
                    with authorization.session(connection["client"]) as session:
                        session.revoke_token(server.revocation_endpoint, token, token_type_hint=hint)
        except (ConnectUnavailable, requests.RequestException, ClientOAuthError) as error:
            logger.warning("backend %r: revoking a disconnected person's tokens failed: %s",
                           authorization.backend, error.__class__.__name__)

    def overview(self) -> dict[str, Any]:
        """For operators: every person's connections (backend, scopes, since, state), no token."""
        rows = []
        for record_key in sorted(self.records.keys("connection")):
            connection = self.records.get("connection", record_key)
            if connection is None:
                continue
            rows.append({"backend": connection["backend"], "issuer": connection["person"][0],
                         "user": connection["person"][1], "scopes": list(connection.get("scopes", ())),
                         "since": connection.get("since"), "state": _state(connection, self._clock())})
        return {"connections": rows, "refreshes": self.refreshes}


def _state(connection: dict[str, Any] | None, now: float) -> str:
    if connection is None:
        return "not connected"
    if now < connection["expires_at"]:
        return "connected"
    return "expired (renewed on next use)" if connection.get("refresh_token") else "expired"

