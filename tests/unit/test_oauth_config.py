"""The config of the gateway as its clients' authorization server (``incomingAuth.type: oauth``):
what loads, its defaults, ToolHive's names, and the errors by field path."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

from vmcp_actors.config import (
    CimdConfig,
    OAuthServerConfig,
    UpstreamIdpConfig,
    config_from_mapping,
    load_config,
    required_env_vars,
)
from vmcp_actors.exceptions import ConfigError

UPSTREAM = {"issuer": "https://idp.example.com", "clientId": "vmcp-gateway", "clientSecretEnv": "IDP_CLIENT_SECRET"}
HTTPS_ONLY = "must be an https URL (http only for localhost, 127.0.0.1 or [::1])"


def oauth_block(**fields: Any) -> dict[str, Any]:
    return {"issuer": "https://gateway.example.com", "signingKeyEnv": "VMCP_SIGNING_KEY", "upstream": dict(UPSTREAM),
            **fields}


def with_oauth(block: dict[str, Any] | None = None, **overrides: Any) -> dict[str, Any]:
    return {"name": "engineering", "backends": [{"name": "github", "url": "http://127.0.0.1:8081/mcp"}],
            "incomingAuth": {"type": "oauth", "oauth": block if block is not None else oauth_block()}, **overrides}


def errors_of(data: Any) -> tuple[str, ...]:
    with pytest.raises(ConfigError) as info:
        config_from_mapping(data)
    return info.value.errors


def test_a_config_file_with_the_oauth_block_loads_with_its_defaults(tmp_path: Path):
    path = tmp_path / "vmcp.yaml"
    path.write_text(textwrap.dedent("""\
        name: engineering
        backends:
          - {name: github, url: http://127.0.0.1:8081/mcp}
        incomingAuth:
          type: oauth
          oauth:
            issuer: https://gateway.example.com/
            signingKeyEnv: VMCP_SIGNING_KEY
            upstream:
              issuer: https://idp.example.com
              clientId: vmcp-gateway
              clientSecretEnv: IDP_CLIENT_SECRET
        """), encoding="utf-8")
    incoming = load_config(path).incoming_auth
    assert incoming.type == "oauth" and incoming.oidc is None and incoming.names_callers
    assert incoming.oauth == OAuthServerConfig(
        issuer="https://gateway.example.com",  # the trailing slash goes: the issuer is compared exactly
        upstream=UpstreamIdpConfig(issuer="https://idp.example.com", client_id="vmcp-gateway",
                                   client_secret_env="IDP_CLIENT_SECRET", scopes=("openid",)),
        signing_key_env="VMCP_SIGNING_KEY", previous_signing_key_envs=(),
        access_token_ttl=3600.0, refresh_token_ttl=30 * 86400.0, refresh_grace_period=30.0,
        authorization_code_ttl=60.0, consent_ttl=30 * 86400.0, registrations_per_minute=20,
        cimd=CimdConfig(enabled=True, allowed_hosts=(), ca_bundle=None))
    assert incoming.oauth.resource == "https://gateway.example.com/mcp"


def test_every_field_of_the_oauth_block_is_read():
    oauth = config_from_mapping(with_oauth(oauth_block(
        issuer="http://127.0.0.1:8080", previousSigningKeyEnvs=["OLD_KEY"], accessTokenTtl="15m",
        refreshTokenTtl="168h", refreshGracePeriod="0s", authorizationCodeTtl="2m",
        consentTtl="0s", registrationsPerMinute=5,
        upstream={**UPSTREAM, "scopes": ["openid", "email", "offline_access"]},
        cimd={"enabled": False, "allowedHosts": ["Docs.Internal", "docs.internal:8443"], "caBundle": "/etc/ca.pem"},
    ))).incoming_auth.oauth
    assert (oauth.issuer, oauth.previous_signing_key_envs) == ("http://127.0.0.1:8080", ("OLD_KEY",))
    assert (oauth.access_token_ttl, oauth.refresh_token_ttl, oauth.refresh_grace_period) == (900.0, 604800.0, 0.0)
    assert (oauth.authorization_code_ttl, oauth.consent_ttl, oauth.registrations_per_minute) == (120.0, 0.0, 5)
    assert oauth.upstream.scopes == ("openid", "email", "offline_access")
    # Host names are compared lower-cased when a document's host is checked against them.
    assert oauth.cimd == CimdConfig(enabled=False, allowed_hosts=("docs.internal", "docs.internal:8443"),
                                    ca_bundle="/etc/ca.pem")


def test_toolhives_lifespan_names_are_read():
    oauth = config_from_mapping(with_oauth(oauth_block(
        accessTokenLifespan="30m", refreshTokenLifespan="240h", authCodeLifespan="90s"))).incoming_auth.oauth
    assert (oauth.access_token_ttl, oauth.refresh_token_ttl, oauth.authorization_code_ttl) == (1800.0, 864000.0, 90.0)


@pytest.mark.parametrize(("alias", "name"), [
    ("accessTokenLifespan", "accessTokenTtl"),
    ("refreshTokenLifespan", "refreshTokenTtl"),
    ("authCodeLifespan", "authorizationCodeTtl"),
])
def test_a_lifespan_and_its_ttl_together_are_an_error_at_the_alias(alias, name):
    assert errors_of(with_oauth(oauth_block(**{alias: "1m", name: "1m"}))) == (
        f"incomingAuth.oauth.{alias}: {alias} and {name} name the same thing: give one",)


@pytest.mark.parametrize("issuer", ["http://localhost:8080", "http://127.0.0.1", "http://[::1]:9000"])
def test_a_plain_http_issuer_is_allowed_on_loopback(issuer):
    assert config_from_mapping(with_oauth(oauth_block(issuer=issuer))).incoming_auth.oauth.issuer == issuer


@pytest.mark.parametrize("issuer", ["http://gateway.example.com", "http://localhost.evil.example",
                                    "http://10.0.0.5:8080"])
def test_a_plain_http_issuer_elsewhere_is_an_error(issuer):
    assert errors_of(with_oauth(oauth_block(issuer=issuer))) == (f"incomingAuth.oauth.issuer: {HTTPS_ONLY}",)


def test_a_plain_http_identity_provider_elsewhere_is_an_error():
    block = oauth_block(upstream={**UPSTREAM, "issuer": "http://idp.example.com"})
    assert errors_of(with_oauth(block)) == (f"incomingAuth.oauth.upstream.issuer: {HTTPS_ONLY}",)


def test_the_upstream_scopes_must_include_openid():
    block = oauth_block(upstream={**UPSTREAM, "scopes": ["email", "profile"]})
    assert errors_of(with_oauth(block)) == (
        "incomingAuth.oauth.upstream.scopes: must include openid (the gateway reads who signed in from the ID token)",)


def test_type_oauth_needs_its_block():
    assert errors_of({**with_oauth(), "incomingAuth": {"type": "oauth"}}) == (
        "incomingAuth.oauth: is required for type oauth",)


@pytest.mark.parametrize(("incoming", "expected"), [
    ({"type": "anonymous"}, ("incomingAuth.oauth: must not be set for type anonymous (it is for type oauth)",)),
    ({"type": "oidc", "oidc": {"issuer": "https://idp.example.com", "audience": "vmcp"}},
     ("incomingAuth.oauth: must not be set for type oidc (it is for type oauth)",)),
])
def test_the_oauth_block_with_another_type_is_an_error(incoming, expected):
    assert errors_of({**with_oauth(), "incomingAuth": {**incoming, "oauth": oauth_block()}}) == expected


def test_the_oidc_block_with_type_oauth_is_an_error():
    data = with_oauth()
    data["incomingAuth"]["oidc"] = {"issuer": "https://idp.example.com", "audience": "vmcp"}
    assert errors_of(data) == ("incomingAuth.oidc: must not be set for type oauth (it is for type oidc)",)


@pytest.mark.parametrize(("grace", "life"), [("10m", "5m"), ("5m", "5m")])
def test_a_refresh_grace_period_not_shorter_than_the_refresh_token_life_is_an_error(grace, life):
    assert errors_of(with_oauth(oauth_block(refreshGracePeriod=grace, refreshTokenTtl=life))) == (
        "incomingAuth.oauth.refreshGracePeriod: must be shorter than refreshTokenTtl",)


@pytest.mark.parametrize(("fields", "expected"), [
    ({"signingKeyEnv": None}, "incomingAuth.oauth.signingKeyEnv: "),
    ({"signingKeyEnv": "not a name"}, "incomingAuth.oauth.signingKeyEnv: must be an environment variable name"),
    ({"previousSigningKeyEnvs": ["OLD", "bad name"]},
     "incomingAuth.oauth.previousSigningKeyEnvs[1]: must be an environment variable name"),
    ({"accessTokenTtl": "25h"}, "incomingAuth.oauth.accessTokenTtl: must be at most 24h"),
    ({"refreshGracePeriod": "1h"}, "incomingAuth.oauth.refreshGracePeriod: must be at most 10m"),
    ({"registrationsPerMinute": 0}, "incomingAuth.oauth.registrationsPerMinute: must be at least 1"),
    ({"cimd": {"allowedHosts": ["https://docs.internal"]}},
     "incomingAuth.oauth.cimd.allowedHosts[0]: must be a host name, optionally with :port"),
    ({"upstream": {"issuer": "https://idp.example.com", "clientId": "vmcp-gateway"}},
     "incomingAuth.oauth.upstream.clientSecretEnv: "),
    ({"clientSecret": "sk-live-xyz"}, "incomingAuth.oauth.clientSecret: unknown field"),
])
def test_a_bad_field_is_an_error_at_its_path(fields, expected):
    block = {key: value for key, value in oauth_block(**fields).items() if value is not None}
    errors = errors_of(with_oauth(block))
    assert len(errors) == 1 and errors[0].startswith(expected)


def test_per_user_rate_limits_need_no_more_than_type_oauth():
    one = {"maxTokens": 1, "refillPeriod": "1s"}
    limits = config_from_mapping(with_oauth(rateLimiting={"perUser": one})).rate_limiting
    assert limits.per_user is not None and limits.per_user.max_tokens == 1
    # ...where anonymous callers, being one user, cannot have them
    anonymous = {**with_oauth(rateLimiting={"perUser": one}), "incomingAuth": {"type": "anonymous"}}
    assert errors_of(anonymous)[0].startswith("rateLimiting.perUser: needs incomingAuth that names callers")


def test_token_exchange_to_a_backend_is_allowed_with_type_oauth():
    exchange = {"type": "token_exchange", "tokenExchange": {"tokenUrl": "https://idp.example.com/token",
                                                             "clientId": "vmcp", "audience": "github-api"}}
    config = config_from_mapping(with_oauth(outgoingAuth={"backends": {"github": exchange}}))
    assert config.outgoing_auth.for_backend("github").token_exchange.audience == "github-api"
    anonymous = {**with_oauth(outgoingAuth={"backends": {"github": exchange}}), "incomingAuth": {"type": "anonymous"}}
    assert errors_of(anonymous)[0].startswith("outgoingAuth.backends.github.type: token_exchange needs")


def test_the_oauth_secrets_are_listed_by_path_for_startup_to_read():
    config = config_from_mapping(with_oauth(oauth_block(previousSigningKeyEnvs=["OLD_KEY_1", "OLD_KEY_2"])))
    assert required_env_vars(config) == [
        ("incomingAuth.oauth.signingKeyEnv", "VMCP_SIGNING_KEY"),
        ("incomingAuth.oauth.previousSigningKeyEnvs[0]", "OLD_KEY_1"),
        ("incomingAuth.oauth.previousSigningKeyEnvs[1]", "OLD_KEY_2"),
        ("incomingAuth.oauth.upstream.clientSecretEnv", "IDP_CLIENT_SECRET"),
    ]


def test_sign_ins_kept_in_memory_are_warned_about():
    from vmcp_actors.config import config_warnings

    memory = config_from_mapping(with_oauth())
    assert any(warning.startswith("incomingAuth.oauth: sign-ins") for warning in config_warnings(memory))
    shared = config_from_mapping(with_oauth(sessionStorage={"provider": "redis"},
                                            operational={"signingKeyEnv": "RECORDS_KEY"}))
    assert not any(warning.startswith("incomingAuth.oauth") for warning in config_warnings(shared))


def test_a_bad_value_under_toolhives_name_is_reported_under_that_name():
    assert errors_of(with_oauth(oauth_block(accessTokenLifespan="soon"))) == (
        "incomingAuth.oauth.accessTokenLifespan: invalid duration 'soon' (use e.g. 500ms, 30s, 2m)",)


def test_offline_access_is_asked_of_the_idp_but_not_advertised_to_clients():
    config = config_from_mapping(with_oauth(oauth_block(upstream={**UPSTREAM,
                                                                  "scopes": ["openid", "offline_access", "email"]})))
    oauth = config.incoming_auth.oauth
    assert oauth.upstream.scopes == ("openid", "offline_access", "email")
    assert oauth.advertised_scopes == ("openid", "email")
