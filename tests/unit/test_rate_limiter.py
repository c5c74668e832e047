"""Rate limits on a fake clock (issue 25): which buckets a call passes, all-or-nothing
spending, retry-after, forgetting idle buckets; the store-error policy with Redis
unreachable; and the ``rateLimiting`` config's errors, each naming its field."""

from __future__ import annotations

import logging
import types

import pytest
import redis

from tests.ports import free_port
from vmcp_actors.config import (
    RateLimitingConfig,
    TokenBucket,
    ToolRateLimit,
    config_from_mapping,
)
from vmcp_actors.exceptions import ConfigError
from vmcp_actors.identity import ANONYMOUS, Identity
from vmcp_actors.limits import (
    Bucket,
    MemoryBuckets,
    RateLimited,
    RateLimiter,
    RedisBuckets,
    _limiter,
)
from vmcp_actors.protocol import JsonRpcError

ALICE = Identity("https://idp.example", "alice")
BOB = Identity("https://idp.example", "bob")
NOBODY = Identity("", ANONYMOUS)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def limiter(clock: Clock, **config) -> RateLimiter:
    return RateLimiter(RateLimitingConfig(**config), MemoryBuckets(clock=clock), key_prefix="p:")


def tool(name: str, shared: TokenBucket | None = None, per_user: TokenBucket | None = None) -> ToolRateLimit:
    return ToolRateLimit(name, shared=shared, per_user=per_user)


def refused_by(limits: RateLimiter, identity: Identity | None, name: str | None, **options) -> RateLimited:
    with pytest.raises(RateLimited) as info:
        limits.admit(identity, name, **options)
    return info.value


def level(limits: RateLimiter, identity: Identity | None, name: str | None, kind: str) -> float:
    (found,) = [bucket for bucket in limits.buckets_for(identity, name) if bucket.kind == kind]
    return limits.level(found)


# -- which buckets --------------------------------------------------------------------------------


def test_a_call_passes_the_servers_buckets_then_its_tools():
    limits = limiter(Clock(), shared=TokenBucket(100, 60), per_user=TokenBucket(10, 60),
                     tools=(tool("echo", TokenBucket(5, 60), TokenBucket(2, 60)),))
    assert [bucket.kind for bucket in limits.buckets_for(ALICE, "echo")] == ["global", "perUser", "tool", "toolPerUser"]
    assert [bucket.kind for bucket in limits.buckets_for(ALICE, "other")] == ["global", "perUser"]
    # a call the gateway makes for the client (a composite's step): its tool's buckets only
    assert [bucket.kind for bucket in limits.buckets_for(ALICE, "echo", client_call=False)] == ["tool", "toolPerUser"]
    # an anonymous caller (or none) has no per-user bucket
    for nobody in (NOBODY, None):
        assert [bucket.kind for bucket in limits.buckets_for(nobody, "echo")] == ["global", "tool"]
    keys = {bucket.key for bucket in limits.buckets_for(ALICE, "echo") + limits.buckets_for(BOB, "echo")}
    assert len(keys) == 6 and all(key.startswith("p:rl:") and "alice" not in key for key in keys)


def test_a_gateway_call_is_not_decided_by_the_servers_buckets():
    limits = limiter(Clock(), shared=TokenBucket(1, 60), tools=(tool("echo", TokenBucket(3, 60)),))
    limits.admit(ALICE, "echo")
    assert refused_by(limits, ALICE, "echo").bucket.kind == "global"
    limits.admit(ALICE, "echo", client_call=False)  # the server's bucket is empty; the tool's is not
    limits.admit(ALICE, "echo", client_call=False)
    assert refused_by(limits, ALICE, "echo", client_call=False).bucket.kind == "tool"


def test_anonymous_callers_share_no_per_user_bucket_but_users_each_have_one():
    limits = limiter(Clock(), tools=(tool("echo", per_user=TokenBucket(1, 60)),))
    for _ in range(3):  # nothing applies to an anonymous caller
        limits.admit(NOBODY, "echo")
    limits.admit(ALICE, "echo")
    assert refused_by(limits, ALICE, "echo").bucket.kind == "toolPerUser"
    limits.admit(BOB, "echo")


# -- the decision ---------------------------------------------------------------------------------


def test_a_refused_call_spends_no_token_from_any_bucket():
    clock = Clock()
    limits = limiter(clock, shared=TokenBucket(5, 60), per_user=TokenBucket(5, 60),
                     tools=(tool("echo", TokenBucket(1, 60)),))
    limits.admit(ALICE, "echo")
    for _ in range(3):
        assert refused_by(limits, ALICE, "echo").bucket.kind == "tool"
    assert level(limits, ALICE, "echo", "global") == 4  # one call admitted, three refused
    assert level(limits, ALICE, "echo", "perUser") == 4
    for _ in range(4):  # the four tokens left are there for other tools
        limits.admit(ALICE, "other")
    assert refused_by(limits, ALICE, "other").bucket.kind == "global"
    assert limits.refusals() == {("tool", "echo"): 3, ("global", ""): 1}


def test_the_first_empty_bucket_refuses_and_says_when_it_has_a_token():
    clock = Clock()
    buckets = MemoryBuckets(clock=clock)
    slow = Bucket("slow", "tool", "echo", TokenBucket(1, 10))  # a token every 10 s
    fast = Bucket("fast", "global", None, TokenBucket(2, 1))  # a token every 0.5 s
    assert buckets.decide([fast, slow]) == (-1, 0.0)
    clock.now += 2.5
    index, wait = buckets.decide([fast, slow])
    assert index == 1 and wait == pytest.approx(7.5)
    assert buckets.level(fast) == 2 and buckets.level(slow) == pytest.approx(0.25)  # the refusal spent nothing
    clock.now += 7.5
    assert buckets.decide([fast, slow]) == (-1, 0.0)


def test_retry_after_is_whole_seconds_rounded_up_and_at_least_one():
    clock = Clock()
    limits = limiter(clock, tools=(tool("slow", TokenBucket(1, 10)), tool("fast", TokenBucket(10, 1))))
    limits.admit(None, "slow")
    clock.now += 2.75
    refused = refused_by(limits, None, "slow")
    assert refused.retry_after == 8 and refused.data == {"retryAfterSeconds": 8}  # 7.25 s away
    assert refused.code == 429 and refused.message == "Rate limit exceeded" and refused.http_status == 429
    for _ in range(10):
        limits.admit(None, "fast")
    assert refused_by(limits, None, "fast").retry_after == 1  # 0.1 s away
    clock.now += 0.2
    limits.admit(None, "fast")


def test_a_bucket_refills_at_its_rate_up_to_its_burst():
    clock = Clock()
    limits = limiter(clock, shared=TokenBucket(3, 30))  # a token every 10 s, 3 at most
    for _ in range(3):
        limits.admit(ALICE, "echo")
    refused_by(limits, ALICE, "echo")
    clock.now += 10
    limits.admit(ALICE, "echo")
    refused_by(limits, ALICE, "echo")
    clock.now += 3600  # idle for an hour: the burst, not 360 calls
    for _ in range(3):
        limits.admit(ALICE, "echo")
    refused_by(limits, ALICE, "echo")


def test_sweep_forgets_buckets_idle_for_a_while_and_keeps_the_others():
    clock = Clock()
    buckets = MemoryBuckets(clock=clock)
    gone = Bucket("gone", "perUser", None, TokenBucket(2, 60))
    kept = Bucket("kept", "perUser", None, TokenBucket(2, 60))
    buckets.decide([gone])
    buckets.decide([gone])
    clock.now += 3000
    buckets.decide([kept])
    clock.now += 600
    assert buckets.sweep(idle=3600) == 1
    assert set(buckets._levels) == {"kept"}
    assert buckets.level(gone) == 2
    assert buckets.decide([gone, kept]) == (-1, 0.0)  # a forgotten bucket comes back full


def test_sweep_keeps_an_idle_bucket_that_is_not_full_again():
    clock = Clock()
    buckets = MemoryBuckets(clock=clock)
    daily = Bucket("daily", "toolPerUser", "echo", TokenBucket(1, 86400))  # one a day
    assert buckets.decide([daily]) == (-1, 0.0)
    clock.now += 3600
    buckets.sweep(idle=3600)
    assert buckets.decide([daily])[0] == 0  # still 23 hours away


# -- the store unreachable ------------------------------------------------------------------------


def closed_port() -> int:
    return free_port()


def unreachable(on_store_error: str) -> RateLimiter:
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    client = redis.Redis(host="127.0.0.1", port=closed_port(), socket_timeout=0.5, socket_connect_timeout=0.5,
                         retry=Retry(NoBackoff(), retries=0))  # redis-py's default retries for seconds
    config = RateLimitingConfig(shared=TokenBucket(1, 60), on_store_error=on_store_error)
    return RateLimiter(config, RedisBuckets(client))


@pytest.fixture
def log_clock(monkeypatch) -> Clock:
    """The clock that paces the limiter's log lines about the store."""
    clock = Clock()
    monkeypatch.setattr(_limiter, "time", types.SimpleNamespace(monotonic=clock))
    return clock


def store_warnings(caplog) -> list[str]:
    return [record.getMessage() for record in caplog.records
            if record.name == _limiter.__name__ and record.levelno == logging.WARNING]


def test_an_unreachable_store_lets_calls_through_when_allowed_and_says_so_every_ten_seconds(caplog, log_clock):
    limits = unreachable("allow")
    with caplog.at_level(logging.WARNING, logger=_limiter.__name__):
        for _ in range(3):  # the bucket holds 1: these are not decided at all
            limits.admit(ALICE, "echo")
        log_clock.now += 9
        limits.admit(ALICE, "echo")
        assert len(store_warnings(caplog)) == 1
        log_clock.now += 1
        limits.admit(ALICE, "echo")
    first, _ = store_warnings(caplog)
    assert "Redis unreachable (ConnectionError)" in first and "let through unchecked (onStoreError: allow)" in first
    assert limits.store_failures() == 5 and limits.refusals() == {}


def test_an_unreachable_store_refuses_calls_with_503_when_so_configured(caplog, log_clock):
    limits = unreachable("refuse")
    with caplog.at_level(logging.WARNING, logger=_limiter.__name__):
        for _ in range(2):
            with pytest.raises(JsonRpcError) as info:
                limits.admit(ALICE, "echo")
            refused = info.value
            assert not isinstance(refused, RateLimited)
            assert refused.http_status == 503 and refused.data == {"retryAfterSeconds": 1}
    (logged,) = store_warnings(caplog)
    assert "refused with 503 (onStoreError: refuse)" in logged
    assert limits.store_failures() == 2


# -- config ------------------------------------------------------------------------------------------


def config_errors(rate_limiting: dict, **extra) -> tuple[str, ...]:
    with pytest.raises(ConfigError) as info:
        config_from_mapping({"name": "limited", "backends": [{"name": "b", "url": "http://127.0.0.1:1/mcp"}],
                             "rateLimiting": rate_limiting, **extra})
    return info.value.errors


ONE = {"maxTokens": 1, "refillPeriod": "1s"}
NAMES_NO_ONE = "needs incomingAuth that names callers (type oidc or oauth): anonymous callers are one user"
OIDC = {"incomingAuth": {"type": "oidc", "oidc": {"issuer": "https://idp.example", "audience": "vmcp"}}}


def test_the_config_reads_toolhives_fields():
    loaded = config_from_mapping({
        "name": "limited", "backends": [{"name": "b", "url": "http://127.0.0.1:1/mcp"}], **OIDC,
        "rateLimiting": {"global": {"maxTokens": 1000, "refillPeriod": "1m"}, "perUser": ONE,
                         "tools": [{"name": "b_echo", "shared": {"maxTokens": 5, "refillPeriod": "1h"}},
                                   {"name": "b_sleep", "perUser": ONE}],
                         "onStoreError": "refuse"}}).rate_limiting
    assert loaded == RateLimitingConfig(
        shared=TokenBucket(1000, 60.0), per_user=TokenBucket(1, 1.0),
        tools=(ToolRateLimit("b_echo", shared=TokenBucket(5, 3600.0)),
               ToolRateLimit("b_sleep", per_user=TokenBucket(1, 1.0))),
        on_store_error="refuse")
    assert loaded.shared.rate == pytest.approx(1000 / 60)


@pytest.mark.parametrize(("rate_limiting", "expected"), [
    ({"perUser": ONE}, f"rateLimiting.perUser: {NAMES_NO_ONE}"),
    ({"tools": [{"name": "b_echo", "perUser": ONE}]}, f"rateLimiting.tools[0].perUser: {NAMES_NO_ONE}"),
    ({"tools": [{"name": "b_echo", "global": ONE}, {"name": "b_sleep", "global": ONE},
                {"name": "b_echo", "shared": ONE}]},
     "rateLimiting.tools[2].name: duplicate tool 'b_echo' (also tools[0])"),
    ({"tools": [{"name": "b_echo"}]},
     "rateLimiting.tools[0].name: limits nothing: give it global (or shared), perUser, or both"),
    ({"global": ONE, "shared": ONE}, "rateLimiting.shared: is the older name of global: set one of them"),
    ({"tools": [{"name": "b_echo", "global": ONE, "shared": ONE}]},
     "rateLimiting.tools[0].shared: is the older name of global: set one of them"),
    ({"global": {"maxTokens": 0, "refillPeriod": "1s"}},
     "rateLimiting.global.maxTokens: must be between 1 and 1000000000"),
    ({"global": {"maxTokens": 1, "refillPeriod": "0s"}},
     "rateLimiting.global.refillPeriod: invalid duration '0s': must be greater than 0"),
    ({"global": ONE, "onStoreError": "maybe"}, "rateLimiting.onStoreError: must be one of allow, refuse"),
], ids=["perUser-anonymous", "tool-perUser-anonymous", "duplicate-tool", "tool-without-bucket", "global-and-shared",
        "tool-global-and-shared", "maxTokens-0", "refillPeriod-0", "onStoreError"])
def test_config_errors_name_their_field(rate_limiting, expected):
    assert config_errors(rate_limiting) == (expected,)


TWO_BACKENDS = [{"name": "github", "url": "http://127.0.0.1:1/mcp"}, {"name": "jira", "url": "http://127.0.0.1:2/mcp"}]
TRIAGE = {"name": "triage", "description": "d", "steps": [{"id": "s", "tool": "github.get_issue"}]}


def loads_with(names: list[str], **extra) -> tuple[str, ...]:
    """The config errors of limits on ``names`` (an empty tuple: it loads)."""
    settings = {"name": "limited", "backends": TWO_BACKENDS, "compositeTools": [TRIAGE],
                "rateLimiting": {"tools": [{"name": name, "global": ONE} for name in names]}, **extra}
    try:
        config_from_mapping(settings)
    except ConfigError as refused:
        return refused.errors
    return ()


def test_a_limited_name_no_tool_can_be_advertised_under_is_an_error_naming_what_tools_are_called():
    assert loads_with(["github_create_issue", "jira_search", "triage"]) == ()
    assert loads_with(["gihtub_create_issue", "github_", "triage"]) == (
        "rateLimiting.tools[0].name: no tool can be advertised as 'gihtub_create_issue', so it would limit "
        "nothing; tools here are named: triage, github_*, jira_*",
        "rateLimiting.tools[1].name: no tool can be advertised as 'github_', so it would limit nothing; tools "
        "here are named: triage, github_*, jira_*")


def test_filters_and_hidden_backends_narrow_the_names_a_limit_may_have():
    aggregation = {"aggregation": {"tools": [  # a filter entry may name a tool by its own name: open_issue is "file"
        {"workload": "github", "filter": ["create_pr", "open_issue"], "overrides": {"open_issue": {"name": "file"}}},
        {"workload": "jira", "excludeAll": True}]}}
    assert loads_with(["github_create_pr", "github_file"], **aggregation) == ()
    refused = loads_with(["github_open_issue", "github_list_issues", "jira_search"], **aggregation)
    assert [error.split(":")[0] for error in refused] == [f"rateLimiting.tools[{i}].name" for i in range(3)]
    assert refused[2].startswith("rateLimiting.tools[2].name: no tool can be advertised as 'jira_search'")
    assert refused[2].endswith("tools here are named: triage, github_create_pr, github_file")
    hidden = {"aggregation": {"excludeAllTools": True}}
    assert loads_with(["triage"], **hidden) == ()
    assert loads_with(["github_x"], **hidden)[0].endswith("tools here are named: triage")


def test_bare_names_under_priority_or_manual_are_left_to_the_discovered_catalog():
    manual = {"aggregation": {"conflictResolution": "manual"}}
    assert loads_with(["anything_at_all"], **manual) == ()
    filtered = {"aggregation": {"conflictResolution": "manual", "tools": [
        {"workload": "github", "filter": ["create_pr"]}, {"workload": "jira", "excludeAll": True}]}}
    assert loads_with(["create_pr"], **filtered) == ()
    assert loads_with(["search"], **filtered)[0].endswith("tools here are named: triage, create_pr")
