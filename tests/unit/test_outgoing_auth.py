import threading

import pytest
import responses

from vmcp_actors.backends import (
    ExchangedTokenCache,
    HeaderInjection,
    TokenExchange,
    build_outgoing_auth,
)
from vmcp_actors.config import TokenExchangeConfig, config_from_mapping
from vmcp_actors.exceptions import BackendAuthError, ConfigError
from vmcp_actors.identity import Identity

TOKEN_URL = "https://idp.example.test/token"
ALICE = Identity("https://idp.example.test", "alice", token="alice-token-1")
BOB = Identity("https://idp.example.test", "bob", token="bob-token-1")


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def exchange(cache=None, secret="s3cret", **config):
    settings = {"token_url": TOKEN_URL, "client_id": "vmcp", "audience": "jira-api", "scopes": ("read",), **config}
    return TokenExchange("jira", TokenExchangeConfig(**settings), secret, cache or ExchangedTokenCache(), timeout=5)


def token_request():
    """The request the exchange sent to the token endpoint (responses records any other
    request this process's threads make meanwhile, too)."""
    (sent,) = [call.request for call in responses.calls if call.request.url == TOKEN_URL]
    return sent


@responses.activate
def test_exchange_posts_rfc8693_form_with_client_basic_auth():
    responses.post(TOKEN_URL, json={"access_token": "jira-token", "expires_in": 300, "token_type": "Bearer"})
    assert exchange().headers(ALICE) == {"Authorization": "Bearer jira-token"}
    sent = token_request()
    form = dict(pair.split("=", 1) for pair in sent.body.split("&"))
    assert form["grant_type"] == "urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Atoken-exchange"
    assert form["subject_token"] == "alice-token-1"
    assert form["subject_token_type"] == "urn%3Aietf%3Aparams%3Aoauth%3Atoken-type%3Aaccess_token"
    assert form["audience"] == "jira-api" and form["scope"] == "read"
    assert sent.headers["Authorization"].startswith("Basic ")


@responses.activate
def test_a_public_client_sends_its_id_in_the_form():
    responses.post(TOKEN_URL, json={"access_token": "t", "expires_in": 300})
    exchange(secret=None).headers(ALICE)
    assert "client_id=vmcp" in token_request().body
    assert "Authorization" not in token_request().headers


@responses.activate
def test_exchanged_tokens_are_reused_per_user_and_never_shared():
    responses.post(TOKEN_URL, json={"access_token": "t", "expires_in": 300})
    strategy = exchange()
    for _ in range(5):
        strategy.headers(ALICE)
    strategy.headers(BOB)
    assert len(responses.calls) == 2  # one per user


@responses.activate
def test_a_refreshed_caller_token_gets_a_fresh_exchange():
    responses.post(TOKEN_URL, json={"access_token": "t", "expires_in": 300})
    strategy = exchange()
    strategy.headers(ALICE)
    strategy.headers(Identity(ALICE.issuer, ALICE.subject, token="alice-token-2"))
    assert len(responses.calls) == 2


def test_cached_tokens_are_refreshed_shortly_before_they_expire():
    clock = FakeClock()
    cache = ExchangedTokenCache(clock=clock)
    fetched = []

    def fetch():
        fetched.append(1)
        return f"token-{len(fetched)}", 100.0

    key = ExchangedTokenCache.key("jira", ALICE, "alice-token-1")
    assert cache.get_or_fetch(key, fetch) == "token-1"
    clock.now += 89.0  # 10 % margin: refresh at 90 s
    assert cache.get_or_fetch(key, fetch) == "token-1"
    clock.now += 1.0
    assert cache.get_or_fetch(key, fetch) == "token-2"
    assert cache.stats()["hits"] == 1


def test_concurrent_misses_of_one_user_make_one_exchange():
    cache = ExchangedTokenCache()
    started = threading.Event()
    calls = []

    def slow_fetch():
        calls.append(1)
        started.wait(1)
        return "t", 300.0

    key = ExchangedTokenCache.key("jira", ALICE, "alice-token-1")
    threads = [threading.Thread(target=cache.get_or_fetch, args=(key, slow_fetch)) for _ in range(8)]
    for thread in threads:
        thread.start()
    started.set()
    for thread in threads:
        thread.join(5)
    assert len(calls) == 1


@pytest.mark.parametrize(
    "kwargs, code",
    [
        ({"status": 400, "json": {"error": "invalid_target", "error_description": "no"}}, "invalid_target"),
        ({"status": 401, "json": {"error": "invalid_client"}}, "invalid_client"),
        ({"status": 500, "body": "<html>oops</html>"}, "http_500"),
        ({"status": 400, "json": {"error": 'bad"quote\\ eyJsecret'}}, "http_400"),
        ({"status": 200, "json": {"token_type": "Bearer"}}, "invalid_response"),
    ],
)
@responses.activate
def test_a_failed_exchange_names_the_backend_and_the_idp_error_code_only(kwargs, code):
    responses.post(TOKEN_URL, **kwargs)
    with pytest.raises(BackendAuthError) as caught:
        exchange().headers(ALICE)
    assert caught.value.idp_error == code
    assert "jira" in str(caught.value) and code in str(caught.value)
    assert "alice-token-1" not in str(caught.value) and "s3cret" not in str(caught.value)


def test_an_unreachable_idp_is_a_clean_error():
    strategy = exchange(token_url="http://127.0.0.1:9/token")
    with pytest.raises(BackendAuthError) as caught:
        strategy.headers(ALICE)
    assert caught.value.idp_error == "idp_unreachable"
    assert "127.0.0.1" not in str(caught.value)


def test_exchange_needs_the_callers_token():
    with pytest.raises(BackendAuthError):
        exchange().headers(None)


def test_header_injection_never_shows_its_value():
    strategy = HeaderInjection("X-Api-Key", "value-secret-123")
    assert strategy.headers(None) == {"X-Api-Key": "value-secret-123"}
    assert "value-secret-123" not in repr(strategy)


def test_unset_secret_env_vars_stop_the_start_naming_variable_and_field():
    config = config_from_mapping({
        "name": "t",
        "backends": [{"name": "gh", "url": "http://127.0.0.1:1/mcp"}],
        "outgoingAuth": {"backends": {"gh": {"type": "header_injection",
                                             "headerInjection": {"headerName": "X-Api-Key", "headerValueEnv": "GH_KEY"}}}},
    })
    with pytest.raises(ConfigError) as caught:
        build_outgoing_auth(config, environ={})
    assert any("GH_KEY" in line and "outgoingAuth.backends.gh" in line for line in caught.value.errors)
    strategies = build_outgoing_auth(config, environ={"GH_KEY": "k"})
    assert strategies["gh"].headers(None) == {"X-Api-Key": "k"}


def test_failed_exchanges_leave_no_lock_behind_for_long():
    cache = ExchangedTokenCache()

    def failing():
        raise BackendAuthError("jira", "token exchange for backend 'jira' failed: invalid_grant")

    for n in range(3000):
        with pytest.raises(BackendAuthError):
            cache.get_or_fetch(ExchangedTokenCache.key("jira", ALICE, f"token-{n}"), failing)
    assert len(cache._locks) <= 1001
