"""The config contract of backends people connect themselves (outgoingAuth type oauth)."""

from __future__ import annotations

from typing import Any

import pytest

from vmcp_actors.config import BackendOAuthConfig, config_from_mapping, required_env_vars
from vmcp_actors.exceptions import ConfigError

OIDC = {"issuer": "https://idp.example", "audience": "gw", "clientId": "gw", "clientSecretEnv": "GW_SECRET"}


def data(auth: Any, incoming: Any = None, operational: Any = None, backend: Any = None) -> dict[str, Any]:
    found: dict[str, Any] = {
        "name": "gw", "backends": [backend or {"name": "github", "url": "https://api.githubcopilot.com/mcp/"}],
        "incomingAuth": incoming if incoming is not None else {"type": "oidc", "oidc": OIDC},
        "outgoingAuth": {"backends": {"github": auth}},
        "operational": operational if operational is not None else {"publicUrl": "https://mcp.example.com"}}
    return found


def errors_of(raw: dict[str, Any]) -> tuple[str, ...]:
    with pytest.raises(ConfigError) as info:
        config_from_mapping(raw)
    return info.value.errors


def test_the_issues_contract_loads():
    config = config_from_mapping(data({"type": "oauth", "oauth": {"scopes": ["repo"], "clientId": "Iv1.abc",
                                                                  "clientSecretEnv": "GH_SECRET"}}))
    auth = config.outgoing_auth.for_backend("github")
    assert auth.oauth == BackendOAuthConfig(("repo",), "Iv1.abc", "GH_SECRET")
    assert config.public_url == "https://mcp.example.com"
    assert config.connected_backends == ("github",)
    assert ("outgoingAuth.backends.github.oauth.clientSecretEnv", "GH_SECRET") in required_env_vars(config)


def test_the_oauth_block_may_be_left_out():
    config = config_from_mapping(data({"type": "oauth"}))
    assert config.outgoing_auth.for_backend("github").oauth == BackendOAuthConfig()


def test_the_public_url_defaults_to_the_authorization_servers_issuer():
    incoming = {"type": "oauth", "oauth": {"issuer": "https://gw.example", "signingKeyEnv": "KEY",
                                           "upstream": {"issuer": "https://idp.example", "clientId": "gw",
                                                        "clientSecretEnv": "IDP_SECRET"}}}
    config = config_from_mapping(data({"type": "oauth"}, incoming=incoming, operational={}))
    assert config.public_url == "https://gw.example"


def test_anonymous_callers_cannot_share_one_persons_account():
    assert errors_of(data({"type": "oauth"}, incoming={"type": "anonymous"})) == (
        "outgoingAuth.backends.github.type: type oauth needs incomingAuth.type oidc or oauth: with anonymous "
        "callers every caller would act as the one person who connected",)


def test_oidc_callers_need_a_client_at_the_idp_and_a_public_url():
    errors = errors_of(data({"type": "oauth"}, incoming={"type": "oidc", "oidc": {"issuer": "https://idp.example",
                                                                                  "audience": "gw"}},
                            operational={}))
    assert [error.split(":")[0] for error in errors] == ["incomingAuth.oidc.clientId", "operational.publicUrl"]


@pytest.mark.parametrize(("auth", "operational", "expected"), [
    ({"type": "oauth", "oauth": {"clientSecretEnv": "X"}}, None,
     "outgoingAuth.backends.github.oauth.clientSecretEnv: needs clientId"),
    ({"type": "oauth", "oauth": {"scopes": ["a b"]}}, None, "outgoingAuth.backends.github.oauth.scopes[0]:"),
    ({"type": "oauth", "oauth": {"scope": ["repo"]}}, None, "outgoingAuth.backends.github.oauth.scope: unknown field"),
    ({"type": "header_injection", "headerInjection": {"headerName": "X-Key", "headerValueEnv": "K"},
      "oauth": {}}, None, "outgoingAuth.backends.github.oauth: must not be set for type header_injection"),
    ({"type": "oauth"}, {"publicUrl": "http://gw.example.com"}, "operational.publicUrl: must be an https URL"),
])
def test_bad_settings_name_their_field(auth, operational, expected):
    errors = errors_of(data(auth, operational=operational))
    assert any(error.startswith(expected) for error in errors), errors


def test_a_process_backend_takes_the_persons_token_in_its_environment_only_per_person():
    stdio = {"name": "github", "transport": "stdio", "command": "github-mcp-server"}
    named = {"issuer": "https://auth.example"}
    assert any(error.startswith("outgoingAuth.backends.github.oauth: stdio backend 'github' has no URL")
               for error in errors_of(data({"type": "oauth", "tokenEnv": "T"}, backend={**stdio, "scope": "perUser"})))
    assert any(error.startswith("outgoingAuth.backends.github.tokenEnv: is required")
               for error in errors_of(data({"type": "oauth", "oauth": named}, backend=stdio)))
    assert any("needs scope: perUser" in error
               for error in errors_of(data({"type": "oauth", "oauth": named, "tokenEnv": "GITHUB_TOKEN"},
                                           backend=stdio)))
    config = config_from_mapping(data({"type": "oauth", "oauth": {**named, "resource": "https://api.example"},
                                       "tokenEnv": "GITHUB_TOKEN"}, backend={**stdio, "scope": "perUser"}))
    auth = config.outgoing_auth.for_backend("github")
    assert auth.token_env == "GITHUB_TOKEN" and auth.oauth.issuer == "https://auth.example"
