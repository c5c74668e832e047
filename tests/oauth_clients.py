"""Three real OAuth MCP clients, each signing in to an OAuth-protected MCP URL the way it does
for its users, then listing the tools and calling one:

* :class:`PythonSdkClient`: the official ``mcp`` SDK's ``OAuthClientProvider`` under
  ``mcp.Client`` (``mode="legacy"``, or the default ``"auto"`` that probes ``server/discover``
  for 2026-07-28); registers dynamically (DCR), or with ``cimd_url`` uses a client ID metadata
  document (CIMD, served by :class:`CimdDocumentServer`) where the authorization server says
  it takes them;
* :class:`TsSdkClient`: the TypeScript SDK's client with an ``OAuthClientProvider`` of its own
  (``tests/node/ts_oauth_client.mjs``);
* :class:`McpRemoteClient`: ``mcp-remote``, the stdio bridge desktop hosts run, spoken to over
  stdio by the Python SDK's client.

Each is an object holding what the client keeps between sessions (its registration and tokens,
its loopback callback port), and each ``run(url, open_url, call=...)`` is one session: connect,
sign in if the server asks (the client hands its authorization URL to ``open_url``, the
"user"), list the tools, call ``call``, disconnect. ``run`` returns a :class:`ClientRun`; a
second ``run`` signs in with the stored tokens (``reused_tokens``), ``stored_tokens()`` reads
the tokens the client stored (the refresh token, for the refresh tests) and ``registered()``
its registration (``client_id``, ``redirect_uris``, ``token_endpoint_auth_method``...).

The user is any ``open_url(authorization_url) -> None`` that ends with the authorization
server's redirect reaching the client's loopback redirect URI: :func:`follow_redirects` for an
authorization server that signs in without a page (the TypeScript SDK's demo server,
:class:`TsExampleOAuthServer`), a real browser for the gateway's login and consent pages;
:func:`no_browser` for a session that must not sign in again. How each client gets the URL
out and the code back: the Python SDK calls its ``redirect_handler`` (which calls
``open_url``) and its ``callback_handler`` waits for a loopback server of this module; the
TypeScript script prints ``{"authorize": url}`` and runs its own loopback server; mcp-remote
opens a browser with the ``open`` package (``xdg-open``, which runs ``$BROWSER``): a stand-in
browser posts the URL back to this module, and mcp-remote's own loopback server
(``/oauth/callback``) takes the redirect.

No token is logged or printed: the clients' own output stays in temporary files, shown (its
tail) only when a run fails; tokens are read only by ``stored_tokens()``.

Needs ``scripts/install-node-mcp`` for the TypeScript SDK, mcp-remote and the example server
(``tests.node_mcp.need_node_mcp`` skips a test without it).
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import shlex
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable
from urllib.parse import parse_qs, urlsplit

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread
import requests

from tests.node_mcp import NODE, node_mcp_home
from tests.ports import free_port

TS_OAUTH_CLIENT = Path(__file__).resolve().parent / "node" / "ts_oauth_client.mjs"
MCP_REMOTE_ENTRY = "node_modules/mcp-remote/dist/proxy.js"
EXAMPLE_SERVER_ENTRY = "node_modules/@modelcontextprotocol/sdk/dist/esm/examples/server/simpleStreamableHttp.js"
SESSION_TIMEOUT = 60.0  # one run, sign-in included
STARTUP_TIMEOUT = 15.0

OpenUrl = Callable[[str], None]


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass
class ClientRun:
    """What a client saw in one session."""

    client: str  # "python-sdk", "ts-sdk", "mcp-remote"
    tools: list[str]  # the names tools/list gave, in order
    call_text: str | None  # the text content of the call's result (joined by newlines); None without a call
    call_is_error: bool | None
    protocol_version: str | None  # the revision the client speaks to the server (mcp-remote: to its stdio client)
    authorization_urls: list[str]  # what the client gave open_url in this session: empty when it signed in without a user
    reused_tokens: bool  # it started with stored tokens and needed no user
    refreshed: bool  # it stored new tokens without a user (a refresh)
    callback: dict[str, str] | None  # the redirect's query at the loopback callback, code and state left out (RFC 9207's iss)
    tokens: dict[str, Any] | None = None  # the tokens the client printed: only TsSdkClient.run(print_tokens=True)
    elicitation: dict[str, Any] | None = None  # TsSdkClient.run(on_elicit=...): the ids asked and completed


def follow_redirects(authorization_url: str) -> None:
    """The user for an authorization server that signs in without a page (the TypeScript SDK's
    demo server): GET the authorization URL and follow its redirects, the last one to the
    client's loopback callback, which must answer 2xx."""
    response = requests.get(authorization_url, timeout=30)
    response.raise_for_status()


def no_browser(authorization_url: str) -> None:
    """The user for a session that must sign in with stored tokens."""
    raise AssertionError("the client asked the user to sign in again")


def _leaf(error: BaseException) -> BaseException:
    """The first exception inside (task) groups: what went wrong, not the group around it."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    return error


# -- loopback HTTP servers (in this process) ------------------------------------------------------


class _Httpd(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        # a client that hangs up, or refuses the certificate, is the client's business
        if not isinstance(sys.exc_info()[1], (ssl.SSLError, ConnectionError)):
            super().handle_error(request, client_address)


class _LoopbackServer:
    """A ThreadingHTTPServer on 127.0.0.1 (``port`` 0: one the system picks, race-free in-process)
    serving ``handler``, which reaches ``owner`` as ``self.server.owner``; ``close()`` stops it
    and its thread."""

    def __init__(self, handler: type[BaseHTTPRequestHandler], owner: object, port: int = 0,
                 context: ssl.SSLContext | None = None) -> None:
        self.httpd = _Httpd(("127.0.0.1", port), handler)
        self.httpd.owner = owner  # type: ignore[attr-defined]
        if context is not None:
            # the handshake happens in the request's thread, not in the accepting one
            self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True, do_handshake_on_connect=False)
        self.port = self.httpd.server_address[1]
        self._thread = threading.Thread(target=self.httpd.serve_forever, name=f"loopback-{self.port}", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(5)


class _QuietHandler(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass  # a request line may carry an authorization code

    def reply(self, status: int, body: bytes, content_type: str = "text/plain") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)


class _CallbackHandler(_QuietHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        owner: LoopbackCallback = self.server.owner  # type: ignore[attr-defined]
        at = urlsplit(self.path)
        if at.path != owner.path:
            self.reply(404, b"not found")
            return
        query = {key: values[0] for key, values in parse_qs(at.query).items()}
        ok = "code" in query and "error" not in query
        self.reply(200 if ok else 400, b"Signed in. You may close this window." if ok else b"Sign-in failed.")
        owner.received(query)


class LoopbackCallback:
    """A native client's redirect target, ``http://127.0.0.1:<port><path>``: records the query
    of the first redirect to it and wakes :meth:`wait`."""

    def __init__(self, port: int = 0, path: str = "/callback") -> None:
        self.path = path
        self._query: dict[str, str] | None = None
        self._arrived = threading.Event()
        self._server = _LoopbackServer(_CallbackHandler, self, port)
        self.redirect_uri = f"http://127.0.0.1:{self._server.port}{path}"

    def received(self, query: dict[str, str]) -> None:
        if not self._arrived.is_set():
            self._query = query
            self._arrived.set()

    def wait(self, timeout: float) -> dict[str, str] | None:
        """The first redirect's query; None after ``timeout`` seconds or once closed without one."""
        self._arrived.wait(timeout)
        return self._query

    def close(self) -> None:
        self._server.close()
        self._arrived.set()  # a waiter returns (None) rather than waiting out its timeout


class _CimdHandler(_QuietHandler):
    def do_GET(self) -> None:  # noqa: N802
        owner: CimdDocumentServer = self.server.owner  # type: ignore[attr-defined]
        if urlsplit(self.path).path != owner.path:
            self.reply(404, b"not found")
            return
        owner.fetched(dict(self.headers.items()))
        self.reply(200, json.dumps(owner.document).encode(), "application/json")


class CimdDocumentServer:
    """A client ID metadata document (CIMD, SEP-991) served over HTTPS on loopback, with a
    certificate from a trustme CA: ``.url`` (``https://<host>:<port>/client.json``, also the
    document's ``client_id``), ``.ca_pem_path`` (the CA an authorization server fetching it must
    trust), ``.fetches`` (how many times it was fetched), ``.last_headers`` (the last fetch's
    request headers), :meth:`wait_fetched`. ``.document`` is the JSON it serves: ``client_id``,
    ``client_name``, ``redirect_uris``, the grant and response types of a public native client
    (``token_endpoint_auth_method: none``), then ``extra`` over those (a test may change it
    between fetches). It listens on 127.0.0.1; ``host`` is the name in the URL ("localhost" or
    "127.0.0.1", both in the certificate)."""

    path = "/client.json"

    def __init__(self, redirect_uris: list[str], *, client_name: str = "vmcp-actors test client",
                 host: str = "localhost", extra: dict[str, Any] | None = None) -> None:
        self._redirect_uris = list(redirect_uris)
        self._client_name = client_name
        self._host = host
        self._extra = dict(extra or {})
        self._changed = threading.Condition()
        self.fetches = 0
        self.last_headers: dict[str, str] | None = None
        self._server: _LoopbackServer | None = None
        self._dir: tempfile.TemporaryDirectory | None = None

    def __enter__(self) -> CimdDocumentServer:
        import trustme

        ca = trustme.CA()
        cert = ca.issue_cert("localhost", "127.0.0.1")
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        cert.configure_cert(context)
        self._dir = tempfile.TemporaryDirectory(prefix="cimd-")
        self.ca_pem_path = os.path.join(self._dir.name, "ca.pem")
        ca.cert_pem.write_to_path(self.ca_pem_path)
        try:
            self._server = _LoopbackServer(_CimdHandler, self, context=context)
        except BaseException:
            self._dir.cleanup()
            raise
        self.url = f"https://{self._host}:{self._server.port}{self.path}"
        self.document: dict[str, Any] = {
            "client_id": self.url,
            "client_name": self._client_name,
            "redirect_uris": self._redirect_uris,
            "grant_types": ["authorization_code", "refresh_token"],
            "response_types": ["code"],
            "token_endpoint_auth_method": "none",
            **self._extra,
        }
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._server is not None:
            self._server.close()
        if self._dir is not None:
            self._dir.cleanup()

    def fetched(self, headers: dict[str, str]) -> None:
        with self._changed:
            self.fetches += 1
            self.last_headers = headers
            self._changed.notify_all()

    def wait_fetched(self, count: int = 1, timeout: float = 10.0) -> bool:
        """Whether the document has been fetched ``count`` times, waiting up to ``timeout`` seconds."""
        with self._changed:
            return self._changed.wait_for(lambda: self.fetches >= count, timeout)


# -- the Python SDK -----------------------------------------------------------------------------


class MemoryTokenStorage:
    """The Python SDK's ``TokenStorage``, in memory: one instance is what a client keeps between
    sessions. ``tokens`` and ``client_info`` are what the SDK stored; ``tokens_saved`` counts
    its ``set_tokens`` calls; ``saved_at`` is the ``time.time()`` of the last (the SDK dates a
    token's expiry just before saving it, so ``saved_at + expires_in`` is past the SDK's own)."""

    def __init__(self) -> None:
        from mcp.shared.auth import OAuthClientInformationFull, OAuthToken

        self.tokens: OAuthToken | None = None
        self.client_info: OAuthClientInformationFull | None = None
        self.tokens_saved = 0
        self.saved_at: float | None = None

    async def get_tokens(self):
        return self.tokens

    async def set_tokens(self, tokens) -> None:
        self.tokens = tokens
        self.tokens_saved += 1
        self.saved_at = time.time()

    async def get_client_info(self):
        return self.client_info

    async def set_client_info(self, client_info) -> None:
        self.client_info = client_info


def _call_text(result: Any) -> str:
    return "\n".join(block.text for block in result.content if getattr(block, "type", None) == "text")


async def _list_and_call(client: Any, call: ToolCall | None,
                         before_call: Callable[[], None] | None = None) -> tuple[list[str], str | None, bool | None]:
    names: list[str] = []
    cursor = None
    for _ in range(1000):
        page = await client.list_tools(cursor=cursor)
        names.extend(tool.name for tool in page.tools)
        cursor = page.next_cursor
        if not cursor:
            break
    if call is None:
        return names, None, None
    if before_call is not None:
        await anyio.to_thread.run_sync(before_call, abandon_on_cancel=True)
    result = await client.call_tool(call.name, call.arguments)
    return names, _call_text(result), bool(result.is_error)


class PythonSdkClient:
    """The official Python SDK: ``mcp.Client`` over streamable HTTP with the SDK's
    ``OAuthClientProvider``. ``mode`` is ``mcp.Client``'s (``"legacy"``: the initialize
    handshake; ``"auto"``: ``server/discover`` first, 2026-07-28 where the server speaks it).
    ``cimd_url``: the client's metadata document URL (used as its client_id when the authorization
    server advertises ``client_id_metadata_document_supported``; the SDK registers dynamically
    otherwise). The redirect URI is ``http://127.0.0.1:<callback_port>/callback`` (a port of
    :func:`free_port` unless given: stable across this object's sessions, as a registration
    needs). ``client_metadata`` goes over the registration's defaults (``client_name``,
    ``redirect_uris``, ``token_endpoint_auth_method: none``: the SDK has no default there, and
    without one RFC 7591 means client_secret_basic). ``ca_pem_path``: a CA to trust for an HTTPS
    server (both the MCP URL and the authorization server). ``run(before_call=...)``: a function
    called (on a worker thread) between the tools/list and the call of one session, to make the
    session outlast its access token, say."""

    name = "python-sdk"

    def __init__(self, *, mode: str = "legacy", cimd_url: str | None = None, callback_port: int | None = None,
                 client_metadata: dict[str, Any] | None = None, ca_pem_path: str | None = None,
                 storage: MemoryTokenStorage | None = None) -> None:
        self.mode = mode
        self.cimd_url = cimd_url
        self.callback_port = callback_port or free_port()
        self.redirect_uri = f"http://127.0.0.1:{self.callback_port}/callback"
        self.client_metadata = {"client_name": "vmcp-actors Python SDK test client",
                                "redirect_uris": [self.redirect_uri],
                                "token_endpoint_auth_method": "none", **(client_metadata or {})}
        self.ca_pem_path = ca_pem_path
        self.storage = storage or MemoryTokenStorage()

    def stored_tokens(self) -> dict[str, Any] | None:
        """What the SDK stored (``access_token``, ``refresh_token``, ``expires_in``, ``scope``...)."""
        tokens = self.storage.tokens
        return None if tokens is None else tokens.model_dump(mode="json", exclude_none=True)

    def registered(self) -> dict[str, Any] | None:
        """The client's registration as the SDK stored it (``client_id``, ``redirect_uris``...)."""
        info = self.storage.client_info
        return None if info is None else info.model_dump(mode="json", exclude_none=True)

    def run(self, url: str, open_url: OpenUrl, call: ToolCall | None = None,
            timeout: float = SESSION_TIMEOUT, before_call: Callable[[], None] | None = None,
            elicitation: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
            notifications: list[dict[str, Any]] | None = None) -> ClientRun:
        """``elicitation``: the client declares elicitation (form and URL) and answers each
        request with what this returns for its params (run on a worker thread);
        ``notifications``: the server's notifications are appended there (method, params)."""
        async def main() -> ClientRun:
            return await asyncio.wait_for(self._session(url, open_url, call, timeout, before_call, elicitation,
                                                        notifications), timeout)

        try:
            return asyncio.run(main())
        except BaseExceptionGroup as group:  # the user's failure, or the flow's, inside the SDK's task groups
            raise _leaf(group) from group

    async def _session(self, url: str, open_url: OpenUrl, call: ToolCall | None, timeout: float,
                       before_call: Callable[[], None] | None,
                       elicitation: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
                       notifications: list[dict[str, Any]] | None = None) -> ClientRun:
        import httpx2
        import mcp
        from mcp.client.auth import AuthorizationCodeResult, OAuthClientProvider, OAuthFlowError
        from mcp.client.streamable_http import streamable_http_client
        from mcp.shared._httpx_utils import MCP_DEFAULT_SSE_READ_TIMEOUT, MCP_DEFAULT_TIMEOUT
        from mcp.shared.auth import OAuthClientMetadata

        opened: list[str] = []
        callback = LoopbackCallback(self.callback_port)
        seen: dict[str, str] | None = None
        had_tokens = self.storage.tokens is not None
        saved_before = self.storage.tokens_saved

        async def redirect_handler(authorization_url: str) -> None:
            opened.append(authorization_url)
            await anyio.to_thread.run_sync(open_url, authorization_url, abandon_on_cancel=True)

        async def callback_handler() -> AuthorizationCodeResult:
            nonlocal seen
            query = await anyio.to_thread.run_sync(callback.wait, timeout, abandon_on_cancel=True)
            if query is None or "code" not in query:
                raise OAuthFlowError(f"no authorization code came to {callback.redirect_uri}: "
                                     f"{(query or {}).get('error', 'nothing came')}")
            seen = {key: value for key, value in query.items() if key not in ("code", "state")}
            return AuthorizationCodeResult(code=query["code"], state=query.get("state"), iss=query.get("iss"))

        provider = OAuthClientProvider(
            server_url=url, client_metadata=OAuthClientMetadata.model_validate(self.client_metadata),
            storage=self.storage, redirect_handler=redirect_handler, callback_handler=callback_handler,
            client_metadata_url=self.cimd_url)
        verify: Any = ssl.create_default_context(cafile=self.ca_pem_path) if self.ca_pem_path else True
        http = httpx2.AsyncClient(auth=provider, verify=verify,
                                  timeout=httpx2.Timeout(MCP_DEFAULT_TIMEOUT, read=MCP_DEFAULT_SSE_READ_TIMEOUT))
        extra: dict[str, Any] = {}
        if elicitation is not None:
            from mcp_types import ElicitResult

            async def elicit(context: Any, params: Any) -> Any:
                asked = params.model_dump(mode="json", by_alias=True, exclude_none=True)
                answer = await anyio.to_thread.run_sync(elicitation, asked, abandon_on_cancel=True)
                return ElicitResult.model_validate(answer)

            extra["elicitation_callback"] = elicit
        if notifications is not None:
            async def heard(message: Any) -> None:
                root = getattr(message, "root", message)
                method = getattr(root, "method", None)
                if isinstance(method, str):
                    params = getattr(root, "params", None)
                    notifications.append({"method": method, "params": params.model_dump(mode="json", by_alias=True)
                                          if hasattr(params, "model_dump") else params})

            extra["message_handler"] = heard
        try:
            async with http, mcp.Client(streamable_http_client(url, http_client=http), mode=self.mode,
                                        **extra) as client:
                tools, text, is_error = await _list_and_call(client, call, before_call)
                version = client.protocol_version
        finally:
            callback.close()
        saved = self.storage.tokens_saved - saved_before
        return ClientRun(self.name, tools, text, is_error, version, opened,
                         reused_tokens=had_tokens and not opened, refreshed=saved > 0 and not opened, callback=seen)


# -- the TypeScript SDK -------------------------------------------------------------------------


def _kill_group(process: subprocess.Popen) -> None:
    """Stop a child started with ``start_new_session=True`` and everything it started."""
    if process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            process.wait(5)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(5)
    else:
        try:  # the leader is gone; anything it left in its group goes too
            os.killpg(process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _tail(log: Any) -> str:
    log.seek(0)
    return log.read().decode("utf-8", "replace")[-3000:]


class TsSdkClient:
    """The TypeScript SDK's client, by ``tests/node/ts_oauth_client.mjs``: its registration and
    tokens are kept in ``store`` (a JSON file; a temporary one of this object's unless given),
    its redirect URI is ``http://127.0.0.1:<callback_port>/callback`` (stable across sessions).
    ``cimd_url``: the client's metadata document URL (the SDK's ``clientMetadataUrl``, used where
    the authorization server advertises support). ``client_metadata`` goes over the
    registration's defaults (as :class:`PythonSdkClient`'s). ``ca_pem_path``: a CA for Node to
    trust (``NODE_EXTRA_CA_CERTS``)."""

    name = "ts-sdk"

    def __init__(self, *, store: str | os.PathLike | None = None, cimd_url: str | None = None,
                 callback_port: int | None = None, client_metadata: dict[str, Any] | None = None,
                 ca_pem_path: str | None = None) -> None:
        self._dir = None
        if store is None:
            self._dir = tempfile.TemporaryDirectory(prefix="ts-oauth-")
            store = os.path.join(self._dir.name, "store.json")
        self.store = Path(store)
        self.cimd_url = cimd_url
        self.callback_port = callback_port or free_port()
        self.redirect_uri = f"http://127.0.0.1:{self.callback_port}/callback"
        self.client_metadata = client_metadata or {}
        self.ca_pem_path = ca_pem_path

    def stored(self) -> dict[str, Any]:
        """The store: ``clientInformation`` and ``tokens`` as the SDK saved them."""
        return json.loads(self.store.read_text()) if self.store.exists() else {}

    def stored_tokens(self) -> dict[str, Any] | None:
        return self.stored().get("tokens")

    def registered(self) -> dict[str, Any] | None:
        return self.stored().get("clientInformation")

    def run(self, url: str, open_url: OpenUrl, call: ToolCall | None = None, timeout: float = SESSION_TIMEOUT,
            print_tokens: bool = False, on_elicit: Callable[[dict[str, Any]], None] | None = None) -> ClientRun:
        """One session. ``print_tokens``: the script also prints the tokens it saved (they are in the
        store anyway: this is the SDK's own view, for a test that asks for it). ``on_elicit``: the
        client declares URL elicitation and accepts each request; this gets its params (the test
        opens the URL); the run's ``elicitation`` is then ``{"elicitations", "completed"}`` (ids)."""
        home = node_mcp_home()
        options = {"callbackPort": self.callback_port, "callbackHost": "127.0.0.1", "callbackPath": "/callback",
                   "store": str(self.store), "clientMetadataUrl": self.cimd_url, "clientMetadata": self.client_metadata,
                   "call": None if call is None else {"name": call.name, "arguments": call.arguments},
                   "printTokens": print_tokens, "elicitation": on_elicit is not None}
        env = dict(os.environ)
        if self.ca_pem_path:
            env["NODE_EXTRA_CA_CERTS"] = self.ca_pem_path
        log = tempfile.TemporaryFile()  # noqa: SIM115 - the script's stderr, shown when it fails
        process = subprocess.Popen([str(home / NODE), str(TS_OAUTH_CLIENT), str(home), url, json.dumps(options)],
                                   cwd=home, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log,
                                   start_new_session=True)
        lines: queue.Queue[str | None] = queue.Queue()
        reader = threading.Thread(target=_read_lines, args=(process.stdout, lines), daemon=True)
        reader.start()
        opened: list[str] = []
        try:
            outcome = self._follow(lines, open_url, opened, timeout, on_elicit)
            process.wait(10)
        except BaseException as error:
            _kill_group(process)
            if isinstance(error, RuntimeError):
                raise RuntimeError(f"{error}\nts_oauth_client.mjs stderr:\n{_tail(log)}") from None
            raise
        finally:
            _kill_group(process)
            reader.join(5)
            process.stdout.close()
            log.close()
        call_outcome = outcome["call"] or {}
        return ClientRun(self.name, outcome["tools"], call_outcome.get("text"), call_outcome.get("isError"),
                         outcome["protocolVersion"], opened, reused_tokens=outcome["hadTokens"] and not opened,
                         refreshed=outcome["tokensSaved"] > 0 and not opened, callback=outcome["callback"],
                         tokens=outcome.get("tokens"),
                         elicitation={key: outcome[key] for key in ("elicitations", "completed") if key in outcome}
                         or None)

    @staticmethod
    def _follow(lines: queue.Queue, open_url: OpenUrl, opened: list[str], timeout: float,
                on_elicit: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise RuntimeError(f"ts_oauth_client.mjs gave no outcome within {timeout} s") from None
            if line is None:
                raise RuntimeError("ts_oauth_client.mjs ended without an outcome")
            message = json.loads(line)
            if "authorize" in message:
                opened.append(message["authorize"])
                open_url(message["authorize"])
            elif "elicit" in message and on_elicit is not None:
                on_elicit(message["elicit"])
            elif "error" in message:
                raise RuntimeError(f"ts_oauth_client.mjs failed: {message['error']}")
            elif "outcome" in message:
                return message["outcome"]


def _read_lines(stream: Any, lines: queue.Queue) -> None:
    for raw in stream:
        lines.put(raw.decode("utf-8", "replace"))
    lines.put(None)


# -- mcp-remote ---------------------------------------------------------------------------------


class _BrowserHandler(_QuietHandler):
    def do_POST(self) -> None:  # noqa: N802
        owner: _StandInBrowser = self.server.owner  # type: ignore[attr-defined]
        body = self.rfile.read(int(self.headers.get("Content-Length", "0"))).decode()
        self.reply(204, b"")
        owner.opened(body)


class _StandInBrowser:
    """What mcp-remote takes for a browser: ``bin/`` holds an ``xdg-open`` (first on PATH) and
    ``browser`` (``$BROWSER``, which the ``open`` package's bundled xdg-open runs when it finds no
    desktop) that post the URL they are given to a loopback server here; each URL goes to
    ``on_open`` (on the server's thread; it must not block)."""

    def __init__(self, directory: Path, on_open: Callable[[str], None]) -> None:
        self._on_open = on_open
        self._server = _LoopbackServer(_BrowserHandler, self)
        self.bin = directory / "bin"
        self.bin.mkdir(parents=True, exist_ok=True)
        post = ("import sys, urllib.request; urllib.request.urlopen(urllib.request.Request("
                "sys.argv[1], data=sys.argv[2].encode(), method='POST'), timeout=10)")
        script = (f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -c {shlex.quote(post)} "
                  f"http://127.0.0.1:{self._server.port}/open \"$1\"\n")
        for name in ("xdg-open", "browser"):
            path = self.bin / name
            path.write_text(script)
            path.chmod(0o755)
        self.browser = str(self.bin / "browser")

    def opened(self, url: str) -> None:
        self._on_open(url)

    def close(self) -> None:
        self._server.close()


class McpRemoteClient:
    """mcp-remote (``node_modules/mcp-remote/dist/proxy.js``), the stdio bridge, driven over stdio
    by the Python SDK's client (``mode="legacy"``: mcp-remote's default ``--protocol legacy``
    passes the client's initialize through; ``protocol="auto"`` lets it probe for 2026-07-28).
    Its registration and tokens live in ``config_dir`` (``MCP_REMOTE_CONFIG_DIR``; a temporary one
    of this object's unless given); its redirect URI is
    ``http://127.0.0.1:<callback_port>/oauth/callback`` (the port passed explicitly: stable across
    sessions). ``cimd_url``: ``--client-metadata-url``. ``extra_args``: more of its flags.
    ``ca_pem_path``: ``NODE_EXTRA_CA_CERTS``."""

    name = "mcp-remote"

    def __init__(self, *, config_dir: str | os.PathLike | None = None, callback_port: int | None = None,
                 cimd_url: str | None = None, protocol: str = "legacy", extra_args: list[str] | None = None,
                 ca_pem_path: str | None = None) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="mcp-remote-")
        self.config_dir = Path(config_dir) if config_dir is not None else Path(self._dir.name) / "config"
        self.callback_port = callback_port or free_port()
        self.redirect_uri = f"http://127.0.0.1:{self.callback_port}/oauth/callback"
        self.cimd_url = cimd_url
        self.protocol = protocol
        self.extra_args = list(extra_args or [])
        self.ca_pem_path = ca_pem_path

    def _stored_file(self, suffix: str) -> Path | None:
        found = sorted((self.config_dir / "mcp-remote-v1").glob(f"*_{suffix}"))
        if len(found) > 1:
            raise RuntimeError(f"{len(found)} servers' {suffix} in {self.config_dir}: use one McpRemoteClient per server")
        return found[0] if found else None

    def stored(self, name: str = "tokens.json") -> dict[str, Any] | None:
        """One of mcp-remote's files for the server (``tokens.json``, ``client_info.json``)."""
        path = self._stored_file(name)
        return json.loads(path.read_text()) if path else None

    def stored_tokens(self) -> dict[str, Any] | None:
        return self.stored("tokens.json")

    def registered(self) -> dict[str, Any] | None:
        return self.stored("client_info.json")

    def command(self, url: str) -> list[str]:
        home = node_mcp_home()
        # --auth-timeout: how long it waits for the code at its callback (30 s by default), here as
        # long as a session may take: a browser signing in at an IdP and a consent page is slow under load
        args = [str(home / NODE), str(home / MCP_REMOTE_ENTRY), url, str(self.callback_port),
                "--host", "127.0.0.1", "--transport", "http-only", "--protocol", self.protocol,
                "--auth-timeout", str(int(SESSION_TIMEOUT))]
        if urlsplit(url).scheme == "http":
            args.append("--allow-http")  # loopback http is allowed anyway; any other http host needs it
        if self.cimd_url:
            args += ["--client-metadata-url", self.cimd_url]
        return args + self.extra_args

    def run(self, url: str, open_url: OpenUrl, call: ToolCall | None = None,
            timeout: float = SESSION_TIMEOUT) -> ClientRun:
        async def main() -> ClientRun:
            return await asyncio.wait_for(self._session(url, open_url, call), timeout)

        tokens_before = self._stored_file("tokens.json")
        before = tokens_before.read_bytes() if tokens_before else None
        try:
            run = asyncio.run(main())
        except BaseExceptionGroup as group:  # the user's failure, or the session's
            raise _leaf(group) from group
        tokens_after = self._stored_file("tokens.json")
        after = tokens_after.read_bytes() if tokens_after else None
        run.reused_tokens = before is not None and not run.authorization_urls
        run.refreshed = after != before and before is not None and not run.authorization_urls
        return run

    async def _session(self, url: str, open_url: OpenUrl, call: ToolCall | None) -> ClientRun:
        import mcp
        from mcp.client.stdio import StdioServerParameters, stdio_client

        opened: list[str] = []
        send, receive = anyio.create_memory_object_stream[str](10)
        token = anyio.lowlevel.current_token()

        def on_open(authorization_url: str) -> None:  # on the stand-in browser's thread
            anyio.from_thread.run_sync(send.send_nowait, authorization_url, token=token)

        async def user() -> None:
            async for authorization_url in receive:
                opened.append(authorization_url)
                await anyio.to_thread.run_sync(open_url, authorization_url, abandon_on_cancel=True)

        work = Path(self._dir.name)
        browser = _StandInBrowser(work, on_open)
        env = {"PATH": f"{browser.bin}{os.pathsep}{os.environ.get('PATH', '')}", "BROWSER": browser.browser,
               "MCP_REMOTE_CONFIG_DIR": str(self.config_dir)}
        if self.ca_pem_path:
            env["NODE_EXTRA_CA_CERTS"] = self.ca_pem_path
        home = node_mcp_home()
        command = self.command(url)
        params = StdioServerParameters(command=command[0], args=command[1:], env=env, cwd=str(home))
        log = tempfile.TemporaryFile()  # noqa: SIM115 - mcp-remote's stderr, shown when it fails
        try:
            async with anyio.create_task_group() as group:
                group.start_soon(user)
                try:
                    async with mcp.Client(stdio_client(params, errlog=log), mode="legacy") as client:
                        tools, text, is_error = await _list_and_call(client, call)
                        version = client.protocol_version
                except Exception as error:
                    raise RuntimeError(f"mcp-remote session failed: {error!r}\nmcp-remote stderr:\n{_tail(log)}") from error
                finally:
                    send.close()
        finally:
            browser.close()
            log.close()
        return ClientRun(self.name, tools, text, is_error, version, opened, reused_tokens=False, refreshed=False,
                         callback=None)


# -- an OAuth-protected MCP server without a login page -----------------------------------------


class TsExampleOAuthServer:
    """The TypeScript SDK's example server ``simpleStreamableHttp.js --oauth`` (with ``--oauth-strict``
    by default: its authorization server accepts only the RFC 8707 resource
    ``http://localhost:<port>/mcp`` and the MCP endpoint only tokens issued for it), its demo
    authorization server on a second port. That server signs in without a page (its
    ``/authorize`` redirects straight back with a code), so :func:`follow_redirects` plays the
    user. It registers clients dynamically (public ones too), issues no refresh tokens, does not
    take client ID metadata documents, and speaks the 2025 revisions only. Tools: ``greet``
    (``{"name"}`` -> ``Hello, <name>!``) and a few more. Its stdout (which logs every request's
    token) goes nowhere."""

    def __init__(self, strict: bool = True) -> None:
        self.port = free_port()
        self.auth_port = free_port()
        home = node_mcp_home()
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 - its stderr, kept until stop()
        self._listening = {"mcp": threading.Event(), "auth": threading.Event()}
        self._ended = False
        self._process = subprocess.Popen(
            [str(home / NODE), str(home / EXAMPLE_SERVER_ENTRY), "--oauth", *(["--oauth-strict"] if strict else [])],
            env={**os.environ, "MCP_PORT": str(self.port), "MCP_AUTH_PORT": str(self.auth_port)}, cwd=home,
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=self._log, start_new_session=True)
        self._reader = threading.Thread(target=self._watch, daemon=True)
        self._reader.start()
        try:
            self._wait_listening()
        except BaseException:
            self.stop()
            raise

    def _watch(self) -> None:
        """Read its stdout to the end, keeping nothing but whether it said it is listening."""
        for raw in self._process.stdout:
            if raw.startswith(b"MCP Streamable HTTP Server listening"):
                self._listening["mcp"].set()
            elif raw.startswith(b"OAuth Authorization Server listening"):
                self._listening["auth"].set()
        self._ended = True
        for event in self._listening.values():
            event.set()  # it exited: nobody waits out the timeout

    def _wait_listening(self) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT
        for event in self._listening.values():
            event.wait(max(0.0, deadline - time.monotonic()))
        if self._ended or not all(event.is_set() for event in self._listening.values()):
            raise RuntimeError(f"the TypeScript SDK's example OAuth server did not start: {self.log()}")

    def log(self) -> str:
        return _tail(self._log)

    @property
    def mcp_url(self) -> str:
        return f"http://localhost:{self.port}/mcp"

    @property
    def issuer(self) -> str:
        return f"http://localhost:{self.auth_port}/"

    def stop(self) -> None:
        _kill_group(self._process)
        self._reader.join(5)
        self._process.stdout.close()
        self._log.close()
