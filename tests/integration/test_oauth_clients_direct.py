"""Three real OAuth MCP clients (tests/oauth_clients.py) signing in to a real OAuth-protected
MCP server, directly, no gateway: the TypeScript SDK's example server with its demo
authorization server (``simpleStreamableHttp.js --oauth --oauth-strict``). That server signs in
without a page, so a redirect follower plays the user; against the gateway the same harnesses
take a browser. What these tests show is that each harness completes the client's own flow
(discovery, registration, PKCE, the RFC 8707 resource, the code at its loopback callback),
lists the tools and calls one, and signs in again from what it stored without a user.

What the example server cannot show: it speaks the 2025 revisions only (the Python SDK's default
mode probes ``server/discover``, gets no 2026-07-28 answer and falls back to the initialize
handshake), it issues no refresh tokens, and its authorization server takes no client ID
metadata documents (no ``client_id_metadata_document_supported``): a client given a document
URL registers dynamically instead, and the document server is checked on its own here.

Needs ``scripts/install-node-mcp`` (skips without it, fails under CI).
"""

from __future__ import annotations

import os
from urllib.parse import parse_qs, urlsplit

import pytest
import requests

from tests.node_mcp import need_node_mcp
from tests.oauth_clients import (
    CimdDocumentServer,
    McpRemoteClient,
    PythonSdkClient,
    ToolCall,
    TsExampleOAuthServer,
    TsSdkClient,
    follow_redirects,
    no_browser,
)
from tests.ports import free_port

pytestmark = pytest.mark.timeout(90)

GREET = ToolCall("greet", {"name": "Ada"})


@pytest.fixture(scope="module")
def example():
    need_node_mcp()
    server = TsExampleOAuthServer()
    yield server
    server.stop()


def authorization_request(url: str) -> dict[str, str]:
    return {key: values[0] for key, values in parse_qs(urlsplit(url).query).items()}


def assert_signed_in_for(run, client, example) -> dict[str, str]:
    """One sign-in, asked the way the MCP authorization spec asks; the request's parameters."""
    assert len(run.authorization_urls) == 1
    url = run.authorization_urls[0]
    assert url.startswith(f"http://localhost:{example.auth_port}/authorize?")
    asked = authorization_request(url)
    assert asked["response_type"] == "code"
    assert asked["redirect_uri"] == client.redirect_uri
    assert asked["code_challenge_method"] == "S256" and len(asked["code_challenge"]) == 43
    assert asked["state"]
    assert asked["resource"] == example.mcp_url  # RFC 8707: the protected resource metadata's resource
    assert asked["scope"] == "mcp:tools"  # the protected resource metadata's scopes_supported
    assert run.callback in (None, {})  # the demo server sends no RFC 9207 iss
    assert not run.reused_tokens
    return asked


def assert_greeted(run, name: str = "Ada") -> None:
    assert "greet" in run.tools
    assert run.call_text == f"Hello, {name}!"
    assert run.call_is_error is False


def processes_running(*parts: str) -> list[str]:
    """Command lines of this machine's processes that contain every one of ``parts``."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            continue
        if all(part in command for part in parts):
            found.append(command)
    return found


# Each client as a test starts it: what it keeps between sessions under tmp_path.
CLIENTS = {
    "python-sdk-legacy": lambda tmp_path: PythonSdkClient(mode="legacy"),
    "python-sdk-auto": lambda tmp_path: PythonSdkClient(mode="auto"),
    "ts-sdk": lambda tmp_path: TsSdkClient(store=tmp_path / "ts-store.json"),
    "mcp-remote": lambda tmp_path: McpRemoteClient(config_dir=tmp_path / "mcp-remote"),
}


@pytest.mark.parametrize("kind", CLIENTS)
def test_a_client_signs_in_lists_and_calls_then_signs_in_with_its_stored_tokens(example, tmp_path, kind):
    client = CLIENTS[kind](tmp_path)
    first = client.run(example.mcp_url, follow_redirects, GREET)
    assert_signed_in_for(first, client, example)
    assert_greeted(first)
    # python-sdk-auto probes server/discover first; the example answers it with no 2026-07-28
    # result (it wants an initialize), so the SDK falls back to the handshake
    assert first.protocol_version == "2025-11-25"
    assert first.tokens is None  # printed only when asked
    registered = client.registered()
    assert registered["redirect_uris"] == [client.redirect_uri]
    # a public client: both SDKs register what the harness asks for (neither has a default);
    # mcp-remote picks "none" itself because the authorization server lists it as supported
    assert registered["token_endpoint_auth_method"] == "none"
    stored = client.stored_tokens()
    assert stored["access_token"] and stored["token_type"].lower() == "bearer"
    assert "refresh_token" not in stored  # the demo server issues none

    second = client.run(example.mcp_url, no_browser, ToolCall("greet", {"name": "Bo"}))
    assert second.reused_tokens and not second.refreshed
    assert_greeted(second, "Bo")
    assert client.stored_tokens() == stored
    # the client's processes (the TypeScript script, mcp-remote and what it started) are gone
    assert processes_running("node", str(client.callback_port)) == []


def test_the_typescript_client_prints_its_tokens_when_asked(example, tmp_path):
    client = TsSdkClient(store=tmp_path / "ts-store.json")
    run = client.run(example.mcp_url, follow_redirects, GREET, print_tokens=True)
    assert_greeted(run)
    assert run.tokens["access_token"]
    assert run.tokens == client.stored_tokens()


@pytest.mark.parametrize("kind", [PythonSdkClient, TsSdkClient, McpRemoteClient], ids=lambda kind: kind.name)
def test_a_client_given_a_metadata_document_registers_dynamically_where_it_is_not_taken(example, kind):
    port = free_port()
    redirect_path = "/oauth/callback" if kind is McpRemoteClient else "/callback"
    with CimdDocumentServer([f"http://127.0.0.1:{port}{redirect_path}"]) as document:
        client = kind(cimd_url=document.url, callback_port=port)
        assert document.document["redirect_uris"] == [client.redirect_uri]
        metadata = requests.get(f"http://localhost:{example.auth_port}/.well-known/oauth-authorization-server",
                                timeout=10).json()
        assert "client_id_metadata_document_supported" not in metadata

        run = client.run(example.mcp_url, follow_redirects, GREET)
        asked = assert_signed_in_for(run, client, example)
        assert_greeted(run)
        assert asked["client_id"] != document.url  # a client_id the server registered
        assert document.fetches == 0


def test_the_metadata_document_is_served_over_https_with_its_own_url_as_client_id():
    redirect_uri = "http://127.0.0.1:1/callback"
    with CimdDocumentServer([redirect_uri], client_name="a test client") as document:
        assert document.url.startswith("https://localhost:") and document.url.endswith("/client.json")
        with pytest.raises(requests.exceptions.SSLError):
            requests.get(document.url, timeout=10)  # not a certificate the system trusts

        response = requests.get(document.url, timeout=10, verify=document.ca_pem_path,
                                headers={"Accept": "application/json"})
        assert response.status_code == 200
        assert response.headers["Content-Type"] == "application/json"
        assert response.json() == {
            "client_id": document.url,
            "client_name": "a test client",
            "redirect_uris": [redirect_uri],
            "grant_types": ["authorization_code", "refresh_token"],
            "response_types": ["code"],
            "token_endpoint_auth_method": "none",
        }
        assert document.wait_fetched(1)
        assert document.fetches == 1  # the refused handshake never reached the document
        assert document.last_headers["Accept"] == "application/json"
        assert document.last_headers["User-Agent"].startswith("python-requests/")

        ip_url = document.url.replace("https://localhost:", "https://127.0.0.1:")
        assert requests.get(ip_url, timeout=10, verify=document.ca_pem_path).json()["client_id"] == document.url
        assert document.fetches == 2
        assert requests.get(ip_url.replace("/client.json", "/other.json"), timeout=10,
                            verify=document.ca_pem_path).status_code == 404
