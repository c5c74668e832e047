"""Where clients find the authorization server's metadata when the issuer has a path
(RFC 8414 section 3.1, and OpenID discovery's appended form), served by the Flask app."""

from __future__ import annotations

import pykka
import pytest

from tests.oauth_gateway import new_signing_key
from vmcp_actors.config import config_from_mapping
from vmcp_actors.exceptions import ConfigError
from vmcp_actors.runtime import start_runtime
from vmcp_actors.web import create_app, stop_app

ISSUER = "https://mcp.example.com/gateway"
CONFIG = {"name": "gw", "backends": [{"name": "a", "url": "http://127.0.0.1:9/mcp"}],
          "incomingAuth": {"type": "oauth", "oauth": {
              "issuer": ISSUER, "signingKeyEnv": "TEST_OAUTH_KEY",
              "upstream": {"issuer": "https://idp.example.com", "clientId": "gw",
                           "clientSecretEnv": "TEST_UPSTREAM_SECRET"}}}}


@pytest.fixture
def app(monkeypatch):
    monkeypatch.setenv("TEST_OAUTH_KEY", new_signing_key())
    monkeypatch.setenv("TEST_UPSTREAM_SECRET", "s3cret")
    config = config_from_mapping(CONFIG)
    made = create_app(start_runtime(config))
    yield made
    stop_app(made)
    pykka.ActorRegistry.stop_all(block=True, timeout=5)


@pytest.mark.parametrize(("path", "status"), [
    ("/.well-known/oauth-authorization-server/gateway", 200),  # RFC 8414, path inserted
    ("/.well-known/openid-configuration/gateway", 200),  # the same for OpenID discovery
    ("/.well-known/openid-configuration", 200),  # {issuer}/.well-known/openid-configuration behind a proxy
    ("/.well-known/oauth-authorization-server", 404),  # another issuer's (the host's root)
    ("/.well-known/oauth-authorization-server/other", 404),
])
def test_the_metadata_is_where_an_issuer_with_a_path_puts_it(app, path, status):
    answer = app.test_client().get(path, headers={"Host": "127.0.0.1"})
    assert answer.status_code == status
    if status == 200:
        metadata = answer.get_json()
        assert metadata["issuer"] == ISSUER
        assert metadata["authorization_endpoint"] == f"{ISSUER}/oauth/authorize"


def test_a_signing_key_that_is_not_a_key_stops_the_start_before_anything_runs(monkeypatch):
    import threading

    monkeypatch.setenv("TEST_OAUTH_KEY", "not a pem")
    monkeypatch.setenv("TEST_UPSTREAM_SECRET", "s3cret")
    config = config_from_mapping(CONFIG)
    threads = threading.active_count()
    with pytest.raises(ConfigError) as refused:
        start_runtime(config)
    assert refused.value.errors == (
        "incomingAuth.oauth.signingKeyEnv: environment variable TEST_OAUTH_KEY is not an unencrypted PEM private key",)
    assert pykka.ActorRegistry.get_all() == [] and threading.active_count() == threads  # nothing was started
