"""Unit tests for vmcp_actors.config: YAML -> validated, frozen dataclasses."""

from __future__ import annotations

import dataclasses
import textwrap
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest

from vmcp_actors.config import (
    AdminConfig,
    AggregationConfig,
    BackendConfig,
    IncomingAuthConfig,
    OperationalConfig,
    TimeoutsConfig,
    VmcpConfig,
    config_from_mapping,
    load_config,
    parse_duration,
)
from vmcp_actors.exceptions import ConfigError

FULL_CONFIG = """\
name: engineering
backends:
  - {name: github, url: http://127.0.0.1:8081/mcp, transport: streamable-http}
  - {name: jira, url: https://jira-mcp.example.com/mcp}
incomingAuth: {type: anonymous}
aggregation:
  conflictResolution: prefix
  conflictResolutionConfig: {prefixFormat: "{workload}__"}
operational:
  timeouts: {default: 10s, perWorkload: {github: 45s}}
  sessionTTL: 1h
  pageSize: 50
  maxRequestBodyBytes: 2048
  allowedHosts: [gateway.example.com, "gateway.example.com:8443"]
  allowedOrigins: [https://app.example.com]
admin: {tokenEnv: VMCP_ADMIN_TOKEN}
"""


def minimal(**overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": "engineering",
        "backends": [{"name": "github", "url": "http://127.0.0.1:8081/mcp"}],
    }
    data.update(overrides)
    return data


def errors_of(data: Any) -> tuple[str, ...]:
    with pytest.raises(ConfigError) as info:
        config_from_mapping(data)
    return info.value.errors


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "vmcp.yaml"
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


# --- valid configs ----------------------------------------------------------------------


def test_full_config_file_loads_into_the_right_dataclasses(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, FULL_CONFIG))

    assert config == VmcpConfig(
        name="engineering",
        backends=(
            BackendConfig(name="github", url="http://127.0.0.1:8081/mcp", transport="streamable-http"),
            BackendConfig(name="jira", url="https://jira-mcp.example.com/mcp"),
        ),
        incoming_auth=IncomingAuthConfig(type="anonymous"),
        aggregation=AggregationConfig(conflict_resolution="prefix", prefix_format="{workload}__"),
        operational=OperationalConfig(
            timeouts=TimeoutsConfig(default=10.0, per_workload={"github": 45.0}),
            session_ttl=3600.0,
            page_size=50,
            max_request_body_bytes=2048,
            allowed_hosts=("gateway.example.com", "gateway.example.com:8443"),
            allowed_origins=("https://app.example.com",),
        ),
        admin=AdminConfig(token_env="VMCP_ADMIN_TOKEN"),
    )


def test_load_config_accepts_a_str_path(tmp_path: Path) -> None:
    assert load_config(str(write(tmp_path, FULL_CONFIG))).name == "engineering"


def test_minimal_config_gets_the_documented_defaults() -> None:
    config = config_from_mapping(minimal())

    assert config.backends == (BackendConfig("github", "http://127.0.0.1:8081/mcp", "streamable-http"),)
    assert config.incoming_auth == IncomingAuthConfig(type="anonymous")
    assert config.aggregation == AggregationConfig(conflict_resolution="prefix", prefix_format="{workload}_")
    assert config.operational.timeouts.default == 30.0
    assert dict(config.operational.timeouts.per_workload) == {}
    assert config.operational.session_ttl == 1800.0
    assert config.operational.page_size == 100
    assert config.operational.max_request_body_bytes == 4 * 1024 * 1024
    assert config.operational.allowed_hosts == ()
    assert config.operational.allowed_origins == ()
    assert config.admin == AdminConfig(token_env=None)
    assert config == VmcpConfig(name="engineering", backends=config.backends)


def test_empty_nested_sections_get_defaults() -> None:
    config = config_from_mapping(
        minimal(incomingAuth={}, aggregation={"conflictResolutionConfig": {}}, operational={"timeouts": {}}, admin={})
    )
    assert config == VmcpConfig(name="engineering", backends=config.backends)


def test_dataclasses_are_frozen_and_hashable() -> None:
    config = config_from_mapping(minimal(operational={"timeouts": {"perWorkload": {"github": "5s"}}}))

    with pytest.raises(dataclasses.FrozenInstanceError):
        config.name = "other"  # type: ignore[misc]
    with pytest.raises(TypeError):
        config.operational.timeouts.per_workload["github"] = 1.0  # type: ignore[index]
    assert isinstance(config.operational.timeouts.per_workload, MappingProxyType)
    assert hash(config) == hash(config_from_mapping(minimal(operational={"timeouts": {"perWorkload": {"github": "5s"}}})))


def test_dataclasses_copy_mutable_arguments() -> None:
    per_workload = {"a": 1.0}
    hosts = ["h.example.com"]
    timeouts = TimeoutsConfig(per_workload=per_workload)
    operational = OperationalConfig(allowed_hosts=hosts)  # type: ignore[arg-type]
    per_workload["a"] = 99.0
    hosts.append("other")

    assert timeouts.per_workload["a"] == 1.0
    assert operational.allowed_hosts == ("h.example.com",)


def test_timeouts_for_backend_falls_back_to_default() -> None:
    timeouts = TimeoutsConfig(default=30.0, per_workload={"github": 45.0})
    assert timeouts.for_backend("github") == 45.0
    assert timeouts.for_backend("jira") == 30.0


def test_vmcp_config_backend_looks_up_by_name() -> None:
    config = VmcpConfig(name="x", backends=(BackendConfig("a", "http://a"), BackendConfig("b", "http://b")))
    assert config.backend("b") == BackendConfig("b", "http://b")
    assert config.backend("nosuch") is None


def test_prefix_for_applies_the_prefix_format() -> None:
    assert AggregationConfig().prefix_for("github") == "github_"
    assert AggregationConfig(prefix_format="gh-").prefix_for("github") == "gh-"


def test_fixed_prefix_format_without_placeholder_is_accepted() -> None:
    config = config_from_mapping(minimal(aggregation={"conflictResolutionConfig": {"prefixFormat": "vmcp."}}))
    assert config.aggregation.prefix_format == "vmcp."


def test_origin_with_trailing_slash_is_normalised() -> None:
    config = config_from_mapping(minimal(operational={"allowedOrigins": ["https://app.example.com/"]}))
    assert config.operational.allowed_origins == ("https://app.example.com",)


# --- durations --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("500ms", 0.5),
        ("30s", 30.0),
        ("2m", 120.0),
        ("1h", 3600.0),
        ("1m30s", 90.0),
        ("1.5s", 1.5),
        ("1h30m", 5400.0),
        ("1s500ms", 1.5),
        (" 30s ", 30.0),
    ],
)
def test_parse_duration_accepts_every_form(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["abc", "", "30 s", "30sec", "1d", "-5s", "s", "1m30", "1e3s"])
def test_parse_duration_rejects_bad_text_with_a_clear_message(text: str) -> None:
    with pytest.raises(ValueError, match=r"invalid duration .*\(use e\.g\. 500ms, 30s, 2m\)|need a unit"):
        parse_duration(text)


@pytest.mark.parametrize("value", [30, 1.5, "30", "0.5"])
def test_parse_duration_rejects_a_bare_number(value: Any) -> None:
    with pytest.raises(ValueError, match="durations need a unit, e.g. 30s"):
        parse_duration(value)


@pytest.mark.parametrize("text", ["0s", "0ms", "0m0s"])
def test_parse_duration_rejects_zero(text: str) -> None:
    with pytest.raises(ValueError, match="must be greater than 0"):
        parse_duration(text)


def test_bad_duration_in_config_reports_path_and_examples() -> None:
    assert errors_of(minimal(operational={"timeouts": {"default": "abc"}})) == (
        "operational.timeouts.default: invalid duration 'abc' (use e.g. 500ms, 30s, 2m)",
    )


def test_bare_number_duration_in_config_asks_for_a_unit() -> None:
    (line,) = errors_of(minimal(operational={"sessionTTL": 30}))
    assert line.startswith("operational.sessionTTL: ")
    assert "durations need a unit, e.g. 30s" in line


def test_bad_per_workload_duration_is_reported_under_its_key() -> None:
    assert errors_of(minimal(operational={"timeouts": {"perWorkload": {"github": "soon"}}})) == (
        "operational.timeouts.perWorkload.github: invalid duration 'soon' (use e.g. 500ms, 30s, 2m)",
    )


# --- backends ---------------------------------------------------------------------------


def test_unknown_field_is_reported_with_its_path() -> None:
    data = minimal(backends=[{"name": "a", "url": "http://a"}, {"name": "b", "ulr": "http://b"}])
    errors = errors_of(data)
    assert "backends[1].ulr: unknown field" in errors
    assert "backends[1].url: is required" in errors


def test_unknown_top_level_field_is_reported() -> None:
    assert errors_of(minimal(nmae="x")) == ("nmae: unknown field",)


@pytest.mark.parametrize("url", ["not a url", "http://", "127.0.0.1:8081/mcp", "http:///mcp", "http://host:99999/"])
def test_bad_backend_url_is_rejected(url: str) -> None:
    assert errors_of(minimal(backends=[{"name": "a", "url": url}])) == (
        "backends[0].url: must be an http(s) URL with a host",
    )


@pytest.mark.parametrize("url", ["ftp://files.example.com/mcp", "ws://127.0.0.1/mcp", "file:///tmp/mcp"])
def test_non_http_backend_url_scheme_is_rejected(url: str) -> None:
    assert errors_of(minimal(backends=[{"name": "a", "url": url}])) == (
        "backends[0].url: must be an http(s) URL with a host",
    )


def test_url_error_does_not_echo_a_query_string_secret() -> None:
    (line,) = errors_of(minimal(backends=[{"name": "a", "url": "ftp://host/mcp?token=s3cret-value"}]))
    assert "s3cret" not in line
    assert "token" not in line


def test_duplicate_backend_names_point_at_the_first_one() -> None:
    backends = [{"name": n, "url": f"http://{i}.example.com"} for i, n in enumerate(["x", "y", "z", "x"])]
    assert errors_of(minimal(backends=backends)) == (
        "backends[3].name: duplicate backend name 'x' (also backends[0])",
    )


@pytest.mark.parametrize("name", ["-github", "git hub", "git.hub", "a" * 64, ""])
def test_invalid_backend_name_is_rejected(name: str) -> None:
    (line,) = errors_of(minimal(backends=[{"name": name, "url": "http://a"}]))
    assert line.startswith("backends[0].name: must be 1-63 letters")


def test_backend_name_of_63_characters_is_accepted() -> None:
    name = "a" + "b_-" * 20 + "cd"
    assert len(name) == 63
    assert config_from_mapping(minimal(backends=[{"name": name, "url": "http://a"}])).backends[0].name == name


@pytest.mark.parametrize("transport", ["sse", "stdio"])
def test_contract_transports_are_not_supported_yet(transport: str) -> None:
    assert errors_of(minimal(backends=[{"name": "a", "url": "http://a", "transport": transport}])) == (
        f"backends[0].transport: '{transport}' is not supported yet (only streamable-http)",
    )


def test_unknown_transport_lists_the_choices() -> None:
    (line,) = errors_of(minimal(backends=[{"name": "a", "url": "http://a", "transport": "grpc"}]))
    assert line.startswith("backends[0].transport: must be one of streamable-http")


def test_missing_name_and_backends_are_required() -> None:
    assert errors_of({}) == ("backends: is required", "name: is required")


def test_empty_backend_list_is_rejected() -> None:
    assert errors_of(minimal(backends=[])) == ("backends: must list at least one backend",)


def test_blank_name_is_rejected() -> None:
    assert errors_of(minimal(name="  ")) == ("name: must not be empty",)


def test_backend_that_is_not_a_mapping_is_reported() -> None:
    assert errors_of(minimal(backends=["http://a"])) == ("backends[0]: must be a mapping",)


def test_per_workload_naming_an_unknown_backend_is_rejected() -> None:
    assert errors_of(minimal(operational={"timeouts": {"perWorkload": {"nosuch": "5s"}}})) == (
        "operational.timeouts.perWorkload.nosuch: no backend named 'nosuch'",
    )


# --- not supported yet ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"compositeTools": [{"name": "t"}]}, "compositeTools: compositeTools is not supported yet"),
        ({"outgoingAuth": {"default": {"type": "unauthenticated"}}}, "outgoingAuth: outgoingAuth is not supported yet"),
        ({"compositeToolRefs": ["t"]}, "compositeToolRefs: compositeToolRefs is not supported yet"),
        ({"groupRef": "engineering"}, "groupRef: groupRef is not supported yet"),
        ({"telemetry": {}}, "telemetry: telemetry is not supported yet"),
        ({"audit": {"enabled": True}}, "audit: audit is not supported yet"),
        ({"optimizer": None}, "optimizer: optimizer is not supported yet"),
        ({"aggregation": {"tools": []}}, "aggregation.tools: tools is not supported yet"),
        ({"aggregation": {"excludeAllTools": False}}, "aggregation.excludeAllTools: excludeAllTools is not supported yet"),
        (
            {"aggregation": {"conflictResolutionConfig": {"priorityOrder": ["github"]}}},
            "aggregation.conflictResolutionConfig.priorityOrder: priorityOrder is not supported yet",
        ),
        ({"operational": {"discoveryCacheTTL": "5m"}}, "operational.discoveryCacheTTL: discoveryCacheTTL is not supported yet"),
        ({"incomingAuth": {"oidc": {"issuer": "https://idp"}}}, "incomingAuth.oidc: oidc is not supported yet"),
    ],
)
def test_contract_field_not_built_yet_is_rejected_by_name(overrides: dict[str, Any], expected: str) -> None:
    assert errors_of(minimal(**overrides)) == (expected,)


def test_oidc_incoming_auth_type_is_not_supported_yet() -> None:
    assert errors_of(minimal(incomingAuth={"type": "oidc"})) == ("incomingAuth.type: 'oidc' is not supported yet",)


def test_unknown_incoming_auth_type_lists_the_choices() -> None:
    assert errors_of(minimal(incomingAuth={"type": "basic"})) == ("incomingAuth.type: must be one of anonymous, oidc",)


@pytest.mark.parametrize("strategy", ["priority", "manual"])
def test_priority_and_manual_conflict_resolution_are_not_supported_yet(strategy: str) -> None:
    assert errors_of(minimal(aggregation={"conflictResolution": strategy})) == (
        f"aggregation.conflictResolution: '{strategy}' is not supported yet",
    )


def test_unknown_conflict_resolution_lists_the_choices() -> None:
    assert errors_of(minimal(aggregation={"conflictResolution": "first"})) == (
        "aggregation.conflictResolution: must be one of prefix, priority, manual",
    )


# --- aggregation and operational values -------------------------------------------------


@pytest.mark.parametrize("prefix_format", ["{server}_", "{workload}_{name}", "{workload!r}_", "{workload:>5}", "{}_"])
def test_unknown_prefix_placeholder_is_rejected(prefix_format: str) -> None:
    (line,) = errors_of(minimal(aggregation={"conflictResolutionConfig": {"prefixFormat": prefix_format}}))
    assert line.startswith("aggregation.conflictResolutionConfig.prefixFormat: unknown placeholder {")
    assert "only {workload} is allowed" in line


@pytest.mark.parametrize("prefix_format", ["", "{workload", "work load_", "{{workload}}"])
def test_malformed_prefix_format_is_rejected(prefix_format: str) -> None:
    (line,) = errors_of(minimal(aggregation={"conflictResolutionConfig": {"prefixFormat": prefix_format}}))
    assert line.startswith("aggregation.conflictResolutionConfig.prefixFormat: ")


@pytest.mark.parametrize(("value", "message"), [(0, "must be between 1 and 10000"), (10_001, "must be between 1 and 10000"),
                                                ("100", "must be an integer"), (True, "must be an integer"), (1.5, "must be an integer")])
def test_page_size_must_be_an_integer_in_range(value: Any, message: str) -> None:
    assert errors_of(minimal(operational={"pageSize": value})) == (f"operational.pageSize: {message}",)


def test_max_request_body_bytes_has_a_floor() -> None:
    assert errors_of(minimal(operational={"maxRequestBodyBytes": 1023})) == (
        "operational.maxRequestBodyBytes: must be at least 1024",
    )


def test_allowed_host_that_is_a_url_is_rejected() -> None:
    (line,) = errors_of(minimal(operational={"allowedHosts": ["ok.example.com", "https://gw.example.com/"]}))
    assert line.startswith("operational.allowedHosts[1]: must be a host name")


@pytest.mark.parametrize("origin", ["app.example.com", "https://app.example.com/path", "ftp://app.example.com"])
def test_allowed_origin_must_be_scheme_host_port(origin: str) -> None:
    (line,) = errors_of(minimal(operational={"allowedOrigins": [origin]}))
    assert line.startswith("operational.allowedOrigins[0]: must be an origin")


def test_admin_token_env_must_be_an_env_var_name_and_is_not_echoed() -> None:
    (line,) = errors_of(minimal(admin={"tokenEnv": "Bearer s3cret"}))
    assert line.startswith("admin.tokenEnv: must be an environment variable name")
    assert "s3cret" not in line


def test_admin_token_env_stores_only_the_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VMCP_ADMIN_TOKEN", "s3cret")
    config = config_from_mapping(minimal(admin={"tokenEnv": "VMCP_ADMIN_TOKEN"}))
    assert config.admin.token_env == "VMCP_ADMIN_TOKEN"
    assert "s3cret" not in repr(config)


def test_section_that_is_not_a_mapping_is_reported() -> None:
    assert errors_of(minimal(operational=["30s"])) == ("operational: must be a mapping",)


def test_null_section_is_reported() -> None:
    assert errors_of(minimal(aggregation=None)) == ("aggregation: must not be null",)


# --- error reporting --------------------------------------------------------------------


def test_several_errors_are_reported_together_sorted_by_path() -> None:
    data = {
        "name": "engineering",
        "backends": [
            {"name": "a", "url": "ftp://a"},
            {"name": "a", "url": "http://b", "ulr": "x"},
        ],
        "compositeTools": [],
        "incomingAuth": {"type": "oidc"},
        "operational": {"timeouts": {"default": "abc", "perWorkload": {"nosuch": "1s"}}, "pageSize": 0},
    }
    assert errors_of(data) == (
        "backends[0].url: must be an http(s) URL with a host",
        "backends[1].name: duplicate backend name 'a' (also backends[0])",
        "backends[1].ulr: unknown field",
        "compositeTools: compositeTools is not supported yet",
        "incomingAuth.type: 'oidc' is not supported yet",
        "operational.pageSize: must be between 1 and 10000",
        "operational.timeouts.default: invalid duration 'abc' (use e.g. 500ms, 30s, 2m)",
        "operational.timeouts.perWorkload.nosuch: no backend named 'nosuch'",
    )


def test_list_indices_sort_numerically() -> None:
    backends = [{"name": f"b{i}", "url": "http://h"} for i in range(12)]
    backends[2]["url"] = backends[10]["url"] = "nope"
    assert errors_of(minimal(backends=backends)) == (
        "backends[2].url: must be an http(s) URL with a host",
        "backends[10].url: must be an http(s) URL with a host",
    )


def test_config_error_message_lists_every_line() -> None:
    with pytest.raises(ConfigError) as info:
        config_from_mapping({})
    assert str(info.value) == "invalid config:\n  backends: is required\n  name: is required"


# --- files ------------------------------------------------------------------------------


def test_yaml_syntax_error_reports_file_line_and_column(tmp_path: Path) -> None:
    path = write(tmp_path, """\
        name: engineering
        backends:
          - name: github
             url: http://127.0.0.1:8081/mcp
        """)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    (line,) = info.value.errors
    assert line.startswith(f"{path}: YAML syntax error at line 4, column ")


def test_duplicate_yaml_key_is_an_error(tmp_path: Path) -> None:
    path = write(tmp_path, "name: a\nname: b\nbackends: [{name: a, url: 'http://a'}]\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.errors == (f"{path}: YAML syntax error at line 2, column 1: duplicate key 'name'",)


def test_missing_file_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "nosuch.yaml"
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.errors == (f"{path}: no such file",)


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n"])
def test_empty_file_is_reported(tmp_path: Path, text: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    (line,) = info.value.errors
    assert line.startswith(f"{path}: the file is empty")


def test_top_level_list_is_reported(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, "- name: github\n  url: http://a\n"))
    assert info.value.errors == ("config: must be a mapping",)


@pytest.mark.parametrize("data", [None, [], "name: x", 3])
def test_config_from_mapping_rejects_non_mappings(data: Any) -> None:
    assert errors_of(data) == ("config: must be a mapping",)


def test_directory_instead_of_file_is_reported(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path)
    (line,) = info.value.errors
    assert line.startswith(f"{tmp_path}: ")


def test_non_string_yaml_keys_are_reported_as_unknown_fields() -> None:
    assert errors_of(minimal(**{"5": 1})) == ("5: unknown field",)
    assert errors_of({**minimal(), 5: 1}) == ("5: unknown field",)
