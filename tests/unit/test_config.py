"""Unit tests for vmcp_actors.config: YAML -> validated, frozen dataclasses."""

from __future__ import annotations

import dataclasses
import textwrap
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest
import yaml

from vmcp_actors.config import (
    AdminConfig,
    AggregationConfig,
    BackendAuthConfig,
    BackendConfig,
    HeaderInjectionConfig,
    IncomingAuthConfig,
    OidcConfig,
    OperationalConfig,
    OutgoingAuthConfig,
    TimeoutsConfig,
    TokenExchangeConfig,
    ToolOverride,
    VmcpConfig,
    WorkloadToolsConfig,
    config_from_mapping,
    load_config,
    parse_duration,
    required_env_vars,
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
        ("30d", 30 * 86400.0),  # the lifetimes of sign-ins (incomingAuth.oauth)
        ("1d12h", 129600.0),
    ],
)
def test_parse_duration_accepts_every_form(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["abc", "", "30 s", "30sec", "1w", "-5s", "s", "1m30", "1e3s"])
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
    assert "backends[1].url: is required for transport streamable-http" in errors


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


def test_a_stdio_backend_loads_with_its_process_fields() -> None:
    config = config_from_mapping(minimal(backends=[{"name": "files", "transport": "stdio", "command": "npx",
                                     "args": ["-y", "server-filesystem", "/srv"], "env": {"LOG_LEVEL": "info"},
                                     "cwd": "/srv"}]))
    (files,) = config.backends
    assert (files.command, files.args, dict(files.env), files.cwd, files.scope, files.url) == (
        "npx", ("-y", "server-filesystem", "/srv"), {"LOG_LEVEL": "info"}, "/srv", "shared", None)
    assert files.is_process and not files.per_user


def test_a_legacy_sse_backend_loads() -> None:
    (old,) = config_from_mapping(minimal(backends=[{"name": "old", "transport": "sse", "url": "https://old.example.com/sse"}])).backends
    assert (old.transport, old.url) == ("sse", "https://old.example.com/sse")


@pytest.mark.parametrize(("entry", "expected"), [
    ({"name": "f", "transport": "stdio"}, ["backends[0].command: is required for transport stdio"]),
    ({"name": "f", "transport": "stdio", "command": "x", "url": "http://a"},
     ["backends[0].url: must not be set for transport stdio (it runs command instead)"]),
    ({"name": "f", "transport": "stdio", "command": "x", "args": ["--db", "/d/{user}.db"]},
     ["backends[0].args[1]: only a scope: perUser or perSession backend can use {user} (a shared process serves every user)"]),
    ({"name": "f", "transport": "stdio", "command": "x", "env": {"F": "/d/{user}"}, "cwd": "/h/{user}"},
     ["backends[0].cwd: only a scope: perUser or perSession backend can use {user} (a shared process serves every user)",
      "backends[0].env.F: only a scope: perUser or perSession backend can use {user} (a shared process serves every user)"]),
    ({"name": "f", "transport": "stdio", "command": "x", "env": {"1BAD": "v"}},
     ["backends[0].env.1BAD.key: must be an environment variable name (letters, digits and '_', not starting "
      "with a digit)"]),
    ({"name": "f", "transport": "stdio", "command": "x", "scope": "perUser"}, []),
    ({"name": "f", "url": "http://a", "command": "x", "scope": "perUser"},
     ["backends[0].command: is for transport stdio only (this backend's transport is streamable-http)",
      "backends[0].scope: is for transport stdio only (this backend's transport is streamable-http)"]),
    ({"name": "f", "transport": "sse"}, ["backends[0].url: is required for transport sse"]),
])
def test_process_backend_mistakes_are_reported_with_their_paths(entry: dict, expected: list[str]) -> None:
    assert sorted(problems_of(minimal(backends=[entry]))) == sorted(expected)


def problems_of(data: Any) -> tuple[str, ...]:
    """Like errors_of, for data that may load: () then."""
    try:
        config_from_mapping(data)
    except ConfigError as error:
        return error.errors
    return ()


def test_a_stdio_backend_credential_goes_into_its_environment() -> None:
    def auth(backend: dict, **block: object) -> tuple[str, ...]:
        return problems_of(minimal(backends=[backend], outgoingAuth={"backends": {"f": {
            "type": "header_injection", "headerInjection": {"headerName": "X-Key", "headerValueEnv": "KEY"},
            **block}}}))

    shared = {"name": "f", "transport": "stdio", "command": "x"}
    assert auth(shared, tokenEnv="API_KEY") == ()
    assert auth(shared) == ("outgoingAuth.backends.f.tokenEnv: is required for stdio backend 'f': its credential "
                            "goes into the child's environment under this name (a process takes no headers)",)
    assert auth({"name": "f", "url": "http://a"}, tokenEnv="API_KEY") == (
        "outgoingAuth.backends.f.tokenEnv: is for stdio backends only (backend 'f' is streamable-http)",)


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
        ({"compositeToolRefs": ["t"]}, "compositeToolRefs: compositeToolRefs is not supported yet"),
        ({"groupRef": "engineering"}, "groupRef: groupRef is not supported yet outside ToolHive's Kubernetes "
                                      "operator: list the group's servers under backends (name and url each)"),
        ({"incomingAuth": {"authz": {"type": "cedar", "policies": ["permit(principal, action, resource);"],
                                     "primaryUpstreamProvider": "github"}}},
         "incomingAuth.authz.primaryUpstreamProvider: primaryUpstreamProvider is not supported yet "
         "(the principal is the caller of incomingAuth.oidc)"),
        ({"incomingAuth": {"authz": {"type": "cedar"}}},
         "incomingAuth.authz.policies: must list at least one Cedar policy for type cedar (without one, every "
         "request is denied)"),
        ({"outgoingAuth": {"source": "discovered"}},
         "outgoingAuth.source: 'discovered' is not supported yet (outside Kubernetes every backend is inline)"),
    ],
)
def test_contract_field_not_built_yet_is_rejected_by_name(overrides: dict[str, Any], expected: str) -> None:
    assert errors_of(minimal(**overrides)) == (expected,)


def test_local_incoming_auth_type_is_not_supported_yet() -> None:
    assert errors_of(minimal(incomingAuth={"type": "local"})) == ("incomingAuth.type: 'local' is not supported yet",)


def test_unknown_incoming_auth_type_lists_the_choices() -> None:
    assert errors_of(minimal(incomingAuth={"type": "basic"})) == (
        "incomingAuth.type: must be one of anonymous, oidc, oauth, local",
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
        "compositeTools": [{"name": "t", "description": "d"}],
        "incomingAuth": {"type": "oidc"},
        "operational": {"timeouts": {"default": "abc", "perWorkload": {"nosuch": "1s"}}, "pageSize": 0},
    }
    assert errors_of(data) == (
        "backends[0].url: must be an http(s) URL with a host",
        "backends[1].name: duplicate backend name 'a' (also backends[0])",
        "backends[1].ulr: unknown field",
        "compositeTools[0].steps: is required",
        "incomingAuth.oidc: is required for type oidc",
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


# --- identity and outgoing auth ---------------------------------------------------------

AUTH_CONFIG = """\
name: engineering
backends:
  - {name: github, url: http://127.0.0.1:8081/mcp}
  - {name: jira, url: https://jira-mcp.example.com/mcp}
incomingAuth:
  type: oidc
  oidc:
    issuer: https://idp.example.com
    audience: vmcp
    jwksUrl: https://idp.example.com/jwks
    algorithms: [RS256, EdDSA]
    clockSkew: 1m
    resourceUrl: https://gw.example.com/mcp
outgoingAuth:
  default: {type: unauthenticated}
  backends:
    github:
      type: header_injection
      headerInjection: {headerName: X-Api-Key, headerValueEnv: GITHUB_TOKEN}
    jira:
      type: token_exchange
      tokenExchange:
        tokenUrl: https://idp.example.com/token
        clientId: vmcp
        clientSecretEnv: JIRA_EXCHANGE_SECRET
        audience: jira-api
        scopes: [read, write]
  passthroughHeaders: [X-Request-Id, X-Tenant]
operational:
  discoveryCacheTTL: 45s
admin: {tokenEnv: VMCP_ADMIN_TOKEN}
"""

OIDC = {"issuer": "https://idp.example.com", "audience": "vmcp"}
SECRET = "sk-live-7Hq2xZ9pLm4Vw8Rt"


def yaml_auth_config() -> dict[str, Any]:
    return yaml.safe_load(AUTH_CONFIG)


def two_backends(**overrides: Any) -> dict[str, Any]:
    return minimal(
        backends=[
            {"name": "github", "url": "http://127.0.0.1:8081/mcp"},
            {"name": "jira", "url": "http://127.0.0.1:8082/mcp"},
        ],
        **overrides,
    )


def with_oidc(**oidc: Any) -> dict[str, Any]:
    return minimal(incomingAuth={"type": "oidc", "oidc": {**OIDC, **oidc}})


def with_backend_auth(auth: Any, oidc: bool = False, **overrides: Any) -> dict[str, Any]:
    """A config whose backend ``github`` authenticates with ``auth``."""
    data = minimal(outgoingAuth={"backends": {"github": auth}}, **overrides)
    if oidc:
        data["incomingAuth"] = {"type": "oidc", "oidc": OIDC}
    return data


def injection(**block: Any) -> dict[str, Any]:
    return {"type": "header_injection", "headerInjection": {"headerName": "X-Api-Key", **block}}


def exchange(**block: Any) -> dict[str, Any]:
    block = {"tokenUrl": "https://idp.example.com/token", "clientId": "vmcp", **block}
    return {"type": "token_exchange", "tokenExchange": block}


def test_full_auth_config_loads_into_the_right_dataclasses(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, AUTH_CONFIG))

    assert config.incoming_auth == IncomingAuthConfig(
        type="oidc",
        oidc=OidcConfig(
            issuer="https://idp.example.com",
            audience="vmcp",
            jwks_url="https://idp.example.com/jwks",
            algorithms=("RS256", "EdDSA"),
            clock_skew=60.0,
            resource_url="https://gw.example.com/mcp",
        ),
    )
    assert config.outgoing_auth == OutgoingAuthConfig(
        default=BackendAuthConfig(type="unauthenticated"),
        backends={
            "github": BackendAuthConfig(
                type="header_injection",
                header_injection=HeaderInjectionConfig(header_name="X-Api-Key", header_value_env="GITHUB_TOKEN"),
            ),
            "jira": BackendAuthConfig(
                type="token_exchange",
                token_exchange=TokenExchangeConfig(
                    token_url="https://idp.example.com/token",
                    client_id="vmcp",
                    client_secret_env="JIRA_EXCHANGE_SECRET",
                    audience="jira-api",
                    scopes=("read", "write"),
                ),
            ),
        },
        passthrough_headers=("X-Request-Id", "X-Tenant"),
    )
    assert config.operational.discovery_cache_ttl == 45.0


def test_auth_defaults_are_anonymous_and_unauthenticated() -> None:
    config = config_from_mapping(minimal())

    assert config.incoming_auth == IncomingAuthConfig(type="anonymous", oidc=None)
    assert config.outgoing_auth == OutgoingAuthConfig()
    assert config.outgoing_auth.default == BackendAuthConfig(type="unauthenticated")
    assert dict(config.outgoing_auth.backends) == {}
    assert config.outgoing_auth.passthrough_headers == ()
    assert config.operational.discovery_cache_ttl == 30.0


def test_oidc_block_gets_the_documented_defaults() -> None:
    oidc = config_from_mapping(with_oidc()).incoming_auth.oidc

    assert oidc == OidcConfig(issuer="https://idp.example.com", audience="vmcp")
    assert oidc.jwks_url is None
    assert oidc.algorithms == ("RS256", "ES256")
    assert oidc.clock_skew == 30.0
    assert oidc.resource_url is None


def test_empty_auth_sections_get_defaults() -> None:
    config = config_from_mapping(minimal(outgoingAuth={}, incomingAuth={"type": "anonymous"}))
    assert config == VmcpConfig(name="engineering", backends=config.backends)
    config = config_from_mapping(minimal(outgoingAuth={"default": {}, "backends": {}, "passthroughHeaders": []}))
    assert config == VmcpConfig(name="engineering", backends=config.backends)


def test_http_issuer_is_accepted_for_loopback_identity_providers() -> None:
    oidc = config_from_mapping(with_oidc(issuer="http://127.0.0.1:9000/realms/test")).incoming_auth.oidc
    assert oidc is not None and oidc.issuer == "http://127.0.0.1:9000/realms/test"


def test_for_backend_falls_back_to_the_default() -> None:
    github = BackendAuthConfig(
        type="header_injection", header_injection=HeaderInjectionConfig("X-Api-Key", header_value_env="T")
    )
    outgoing = OutgoingAuthConfig(default=BackendAuthConfig(), backends={"github": github})
    assert outgoing.for_backend("github") is github
    assert outgoing.for_backend("jira") == BackendAuthConfig(type="unauthenticated")


def test_auth_dataclasses_are_frozen_hashable_and_copy_their_arguments() -> None:
    backends = {"github": BackendAuthConfig()}
    outgoing = OutgoingAuthConfig(backends=backends, passthrough_headers=["X-Tenant"])  # type: ignore[arg-type]
    backends["jira"] = BackendAuthConfig()

    assert list(outgoing.backends) == ["github"]
    assert isinstance(outgoing.backends, MappingProxyType)
    assert outgoing.passthrough_headers == ("X-Tenant",)
    assert OidcConfig("https://i", "a", algorithms=["RS256"]).algorithms == ("RS256",)  # type: ignore[arg-type]
    assert TokenExchangeConfig("https://t", "c", scopes=["read"]).scopes == ("read",)  # type: ignore[arg-type]
    with pytest.raises(dataclasses.FrozenInstanceError):
        outgoing.default = BackendAuthConfig()  # type: ignore[misc]
    with pytest.raises(TypeError):
        outgoing.backends["x"] = BackendAuthConfig()  # type: ignore[index]
    assert hash(config_from_mapping(yaml_auth_config())) == hash(config_from_mapping(yaml_auth_config()))


# algorithms and clock skew

def test_none_algorithm_is_refused_with_the_reason() -> None:
    assert errors_of(with_oidc(algorithms=["none"])) == (
        "incomingAuth.oidc.algorithms[0]: 'none' is not allowed: unsigned tokens would be accepted from anyone",
    )


@pytest.mark.parametrize("algorithm", ["HS256", "HS384", "HS512", "hs256"])
def test_hmac_algorithms_are_refused_with_the_reason(algorithm: str) -> None:
    assert errors_of(with_oidc(algorithms=["RS256", algorithm])) == (
        f"incomingAuth.oidc.algorithms[1]: {algorithm!r} is not allowed: "
        "HMAC with a public key would let anyone forge tokens",
    )


def test_unknown_algorithm_lists_the_allowed_ones() -> None:
    assert errors_of(with_oidc(algorithms=["RS1"])) == (
        "incomingAuth.oidc.algorithms[0]: must be one of RS256, RS384, RS512, PS256, PS384, PS512, "
        "ES256, ES384, ES512, EdDSA",
    )


def test_every_asymmetric_algorithm_is_accepted() -> None:
    algorithms = ["RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"]
    oidc = config_from_mapping(with_oidc(algorithms=algorithms)).incoming_auth.oidc
    assert oidc is not None and oidc.algorithms == tuple(algorithms)


def test_empty_or_repeated_algorithms_are_rejected() -> None:
    assert errors_of(with_oidc(algorithms=[])) == ("incomingAuth.oidc.algorithms: must list at least one algorithm",)
    assert errors_of(with_oidc(algorithms=["ES256", "RS256", "ES256"])) == (
        "incomingAuth.oidc.algorithms[2]: duplicate algorithm 'ES256' (also algorithms[0])",
    )


@pytest.mark.parametrize(("text", "seconds"), [("0", 0.0), ("0s", 0.0), ("500ms", 0.5), ("5m", 300.0)])
def test_clock_skew_accepts_zero_to_five_minutes(text: str, seconds: float) -> None:
    oidc = config_from_mapping(with_oidc(clockSkew=text)).incoming_auth.oidc
    assert oidc is not None and oidc.clock_skew == seconds


@pytest.mark.parametrize(("text", "message"), [
    ("5m1s", "must be at most 5m"),
    ("1h", "must be at most 5m"),
    ("-1s", "invalid duration '-1s': must not be negative (use e.g. 500ms, 30s, 2m)"),
    ("30", "invalid duration '30': durations need a unit, e.g. 30s"),
])
def test_clock_skew_out_of_bounds_is_rejected(text: str, message: str) -> None:
    assert errors_of(with_oidc(clockSkew=text)) == (f"incomingAuth.oidc.clockSkew: {message}",)


# incoming auth type and block

def test_oidc_type_without_oidc_block_is_rejected() -> None:
    assert errors_of(minimal(incomingAuth={"type": "oidc"})) == ("incomingAuth.oidc: is required for type oidc",)
    assert errors_of(minimal(incomingAuth={"type": "oidc", "oidc": None})) == (
        "incomingAuth.oidc: is required for type oidc",
    )


@pytest.mark.parametrize("incoming", [{"type": "anonymous", "oidc": OIDC}, {"oidc": OIDC}])
def test_anonymous_type_with_oidc_block_is_rejected(incoming: dict[str, Any]) -> None:
    assert errors_of(minimal(incomingAuth=incoming)) == (
        "incomingAuth.oidc: must not be set for type anonymous (it is for type oidc)",
    )


def test_oidc_issuer_and_audience_are_required() -> None:
    assert errors_of(minimal(incomingAuth={"type": "oidc", "oidc": {}})) == (
        "incomingAuth.oidc.audience: is required",
        "incomingAuth.oidc.issuer: is required",
    )
    assert errors_of(with_oidc(audience=" ")) == ("incomingAuth.oidc.audience: must not be empty",)


@pytest.mark.parametrize(("field", "value", "message"), [
    ("issuer", "idp.example.com", "must be an http(s) URL with a host"),
    ("issuer", "https://idp.example.com/?tenant=a", "must be an http(s) URL without ?query or #fragment"),
    ("jwksUrl", "file:///etc/jwks.json", "must be an http(s) URL with a host"),
    ("resourceUrl", "https://gw.example.com/mcp#top", "must be an http(s) URL without a #fragment (RFC 9728)"),
    ("resourceUrl", "gw.example.com", "must be an http(s) URL with a host"),
])
def test_oidc_urls_are_validated(field: str, value: str, message: str) -> None:
    assert errors_of(with_oidc(**{field: value})) == (f"incomingAuth.oidc.{field}: {message}",)


def test_toolhive_oidc_client_introspection_scopes_and_resource_load() -> None:
    loaded = config_from_mapping(with_oidc(clientId="vmcp", clientSecretEnv="VMCP_CLIENT_SECRET", scopes=["mcp:tools"],
                            introspectionUrl="https://idp.example.com/introspect",
                            resource="https://gw.example.com/mcp")).incoming_auth.oidc
    assert (loaded.client_id, loaded.client_secret_env, loaded.scopes) == ("vmcp", "VMCP_CLIENT_SECRET", ("mcp:tools",))
    assert (loaded.introspection_url, loaded.resource_url) == ("https://idp.example.com/introspect",
                                                               "https://gw.example.com/mcp")
    assert errors_of(with_oidc(clientSecretEnv="X")) == ("incomingAuth.oidc.clientSecretEnv: needs clientId",)
    assert errors_of(with_oidc(resource="https://a.example.com/mcp", resourceUrl="https://b.example.com/mcp")) == (
        "incomingAuth.oidc.resource: resource and resourceUrl name the same thing: give one",)


@pytest.mark.parametrize(("field", "expected"), [
    ("insecureAllowHttp", "insecureAllowHttp is not supported yet (http issuers are accepted)"),
    ("protectedResourceAllowPrivateIp", "protectedResourceAllowPrivateIp is not supported yet"),
])
def test_toolhive_oidc_fields_not_built_are_rejected_by_name(field: str, expected: str) -> None:
    assert errors_of(with_oidc(**{field: "x"})) == (f"incomingAuth.oidc.{field}: {expected}",)


# outgoing auth type and block

@pytest.mark.parametrize(("auth", "expected"), [
    ({"type": "header_injection"}, ("headerInjection: is required for type header_injection",)),
    ({"type": "token_exchange"}, ("tokenExchange: is required for type token_exchange",)),
    (
        {"type": "unauthenticated", "headerInjection": {"headerName": "X-Api-Key", "headerValueEnv": "T"}},
        ("headerInjection: must not be set for type unauthenticated (it is for type header_injection)",),
    ),
    (
        {**exchange(), "headerInjection": {"headerName": "X-Api-Key", "headerValueEnv": "T"}},
        ("headerInjection: must not be set for type token_exchange (it is for type header_injection)",),
    ),
    (
        {"type": "header_injection", "tokenExchange": exchange()["tokenExchange"]},
        (
            "headerInjection: is required for type header_injection",
            "tokenExchange: must not be set for type header_injection (it is for type token_exchange)",
        ),
    ),
    (
        {"tokenExchange": exchange()["tokenExchange"]},
        ("tokenExchange: must not be set for type unauthenticated (it is for type token_exchange)",),
    ),
])
def test_auth_block_must_match_the_type(auth: dict[str, Any], expected: tuple[str, ...]) -> None:
    assert errors_of(with_backend_auth(auth, oidc=True)) == tuple(
        f"outgoingAuth.backends.github.{line}" for line in expected
    )


def test_default_auth_block_must_match_the_type_too() -> None:
    assert errors_of(minimal(outgoingAuth={"default": {"type": "header_injection"}})) == (
        "outgoingAuth.default.headerInjection: is required for type header_injection",
    )


def test_unknown_outgoing_auth_type_lists_the_choices() -> None:
    assert errors_of(with_backend_auth({"type": "basic"})) == (
        "outgoingAuth.backends.github.type: must be one of unauthenticated, header_injection, token_exchange, oauth, "
        "upstream_inject, aws_sts, obo, xaa",
    )


@pytest.mark.parametrize("kind", ["upstream_inject", "aws_sts", "obo", "xaa"])
def test_toolhive_outgoing_auth_types_not_built_are_rejected_by_name(kind: str) -> None:
    assert errors_of(with_backend_auth({"type": kind})) == (
        f"outgoingAuth.backends.github.type: {kind!r} is not supported yet",
    )


def test_outgoing_auth_source_and_backends_shape_are_checked() -> None:
    assert errors_of(minimal(outgoingAuth={"backends": ["github"]})) == (
        "outgoingAuth.backends: must be a mapping of backend name to settings",
    )
    assert errors_of(with_backend_auth("header_injection")) == ("outgoingAuth.backends.github: must be a mapping",)


# header injection

def test_header_injection_needs_exactly_one_of_value_and_env() -> None:
    assert errors_of(with_backend_auth(injection(headerValue=SECRET, headerValueEnv="GITHUB_TOKEN"))) == (
        "outgoingAuth.backends.github.headerInjection: set only one of headerValue and headerValueEnv",
    )
    assert errors_of(with_backend_auth(injection())) == (
        "outgoingAuth.backends.github.headerInjection: needs one of headerValueEnv or headerValue",
    )
    assert errors_of(with_backend_auth(injection(headerValue=None, headerValueEnv=None))) == (
        "outgoingAuth.backends.github.headerInjection: needs one of headerValueEnv or headerValue",
    )


def test_header_injection_with_a_literal_value_keeps_it_out_of_repr() -> None:
    auth = injection(headerName="Authorization", headerValue=f"Bearer {SECRET}")
    config = config_from_mapping(with_backend_auth(auth))
    injected = config.outgoing_auth.for_backend("github").header_injection

    assert injected == HeaderInjectionConfig(header_name="Authorization", header_value=f"Bearer {SECRET}")
    assert SECRET not in repr(config)
    assert SECRET not in str(config)
    assert SECRET not in repr(injected)


@pytest.mark.parametrize("name", [
    "Host", "content-length", "Content-Type", "ACCEPT", "Transfer-Encoding", "connection", "Keep-Alive",
    "Proxy-Authenticate", "proxy-authorization", "TE", "Trailer", "Upgrade", "mcp-session-id", "MCP-Protocol-Version",
])
def test_header_injection_refuses_headers_the_gateway_owns(name: str) -> None:
    (line,) = errors_of(with_backend_auth(injection(headerName=name, headerValueEnv="T")))
    assert line.startswith(f"outgoingAuth.backends.github.headerInjection.headerName: {name!r} is not allowed: ")


@pytest.mark.parametrize("name", ["Authorization", "X-Api-Key", "PRIVATE-TOKEN", "x-goog-api-key"])
def test_header_injection_accepts_credential_headers(name: str) -> None:
    config = config_from_mapping(with_backend_auth(injection(headerName=name, headerValueEnv="GITHUB_TOKEN")))
    assert config.outgoing_auth.backends["github"].header_injection == HeaderInjectionConfig(
        header_name=name, header_value_env="GITHUB_TOKEN"
    )


@pytest.mark.parametrize("name", ["Authorization: Bearer abc123", "X Api Key", "", "X-Api-Key\n"])
def test_malformed_header_name_is_rejected_without_echo(name: str) -> None:
    (line,) = errors_of(with_backend_auth(injection(headerName=name, headerValueEnv="T")))
    assert line == (
        "outgoingAuth.backends.github.headerInjection.headerName: "
        "must be an HTTP header name (letters, digits and !#$%&'*+-.^_`|~)"
    )


def test_header_value_env_must_be_an_env_var_name() -> None:
    (line,) = errors_of(with_backend_auth(injection(headerValueEnv="Bearer abc")))
    assert line.startswith(
        "outgoingAuth.backends.github.headerInjection.headerValueEnv: must be an environment variable name"
    )
    assert "abc" not in line


@pytest.mark.parametrize("value", [f"{SECRET}\r\nX-Evil: 1", f" {SECRET}", f"{SECRET}\u00e9", "", 12345])
def test_bad_header_value_is_rejected_without_echo(value: Any) -> None:
    (line,) = errors_of(with_backend_auth(injection(headerValue=value)))
    assert line.startswith("outgoingAuth.backends.github.headerInjection.headerValue: ")
    assert SECRET not in line
    assert "12345" not in line


def test_header_value_secret_never_appears_in_error_text() -> None:
    data = two_backends(
        name="",
        outgoingAuth={
            "default": injection(headerName="Host", headerValue=f"Bearer {SECRET}", headerValueEnv="TOKEN"),
            "backends": {
                "github": {
                    "type": "unauthenticated",
                    "headerInjection": {"headerName": "X-Key", "headerValue": SECRET},
                },
                "jira": injection(headerValue=SECRET, extra=SECRET),
                "nosuch": injection(headerValue=SECRET),
            },
            "passthroughHeaders": ["Authorization"],
        },
        operational={"pageSize": 0},
    )
    with pytest.raises(ConfigError) as info:
        config_from_mapping(data)

    assert len(info.value.errors) >= 6
    assert SECRET not in str(info.value)
    assert all(SECRET not in line for line in info.value.errors)


# token exchange

def test_token_exchange_needs_oidc_incoming_auth() -> None:
    assert errors_of(with_backend_auth(exchange())) == (
        "outgoingAuth.backends.github.type: token_exchange needs incomingAuth.type oidc or oauth (the caller's token, "
        "or the identity provider's token of the caller, is the subject token)",
    )


def test_token_exchange_as_default_needs_oidc_incoming_auth_too() -> None:
    assert errors_of(minimal(incomingAuth={"type": "anonymous"}, outgoingAuth={"default": exchange()})) == (
        "outgoingAuth.default.type: token_exchange needs incomingAuth.type oidc or oauth (the caller's token, "
        "or the identity provider's token of the caller, is the subject token)",
    )


def test_token_exchange_with_oidc_incoming_auth_loads() -> None:
    config = config_from_mapping({**with_oidc(), "outgoingAuth": {"default": exchange()}})
    assert config.outgoing_auth.for_backend("github").token_exchange == TokenExchangeConfig(
        token_url="https://idp.example.com/token", client_id="vmcp"
    )


@pytest.mark.parametrize(("block", "expected"), [
    ({"tokenUrl": None}, "tokenUrl: must not be null"),
    ({"tokenUrl": "idp.example.com/token"}, "tokenUrl: must be an http(s) URL with a host"),
    ({"clientId": ""}, "clientId: must not be empty"),
    (
        {"clientSecretEnv": "s3cret value"},
        "clientSecretEnv: must be an environment variable name (letters, digits and '_', not starting with a digit)",
    ),
    ({"audience": ""}, "audience: must not be empty"),
    ({"scopes": "read write"}, "scopes: must be a list"),
    ({"scopes": ["read write"]}, "scopes[0]: must be an OAuth scope: printable ASCII without spaces, '\"' or '\\'"),
    ({"clientSecret": "s3cret"}, "clientSecret: clientSecret is not supported yet (use clientSecretEnv)"),
    ({"subjectTokenType": "urn:x:id_token"}, "subjectTokenType: subjectTokenType is not supported yet"),
    ({"subjectProviderName": "github"}, "subjectProviderName: subjectProviderName is not supported yet"),
])
def test_token_exchange_fields_are_validated(block: dict[str, Any], expected: str) -> None:
    assert errors_of(with_backend_auth(exchange(**block), oidc=True)) == (
        f"outgoingAuth.backends.github.tokenExchange.{expected}",
    )


def test_token_exchange_client_id_and_url_are_required() -> None:
    auth = {"type": "token_exchange", "tokenExchange": {}}
    assert errors_of(with_backend_auth(auth, oidc=True)) == (
        "outgoingAuth.backends.github.tokenExchange.clientId: is required",
        "outgoingAuth.backends.github.tokenExchange.tokenUrl: is required",
    )


# passthrough headers and backend references

@pytest.mark.parametrize("name", [
    "Authorization", "cookie", "Set-Cookie", "HOST", "Proxy-Authorization",
    "Connection", "keep-alive", "Proxy-Authenticate", "te", "Trailer", "Transfer-Encoding", "upgrade",
    "Content-Length", "content-type", "Accept", "Mcp-Session-Id", "mcp-protocol-version",
])
def test_passthrough_refuses_credentials_hop_by_hop_and_gateway_headers(name: str) -> None:
    (line,) = errors_of(minimal(outgoingAuth={"passthroughHeaders": ["X-Request-Id", name]}))
    assert line.startswith(f"outgoingAuth.passthroughHeaders[1]: {name!r} is not allowed: ")
    assert len(line) > len(f"outgoingAuth.passthroughHeaders[1]: {name!r} is not allowed: ") + 10


def test_passthrough_refusal_says_why() -> None:
    assert errors_of(minimal(outgoingAuth={"passthroughHeaders": ["Authorization", "Connection"]})) == (
        "outgoingAuth.passthroughHeaders[0]: 'Authorization' is not allowed: it carries the caller's credentials "
        "for the gateway (outgoingAuth authenticates to backends)",
        "outgoingAuth.passthroughHeaders[1]: 'Connection' is not allowed: it is a hop-by-hop header, "
        "meant for one connection only",
    )


def test_duplicate_passthrough_headers_are_rejected_case_insensitively() -> None:
    assert errors_of(minimal(outgoingAuth={"passthroughHeaders": ["X-Request-Id", "X-Tenant", "x-request-id"]})) == (
        "outgoingAuth.passthroughHeaders[2]: duplicate header 'x-request-id' (also passthroughHeaders[0])",
    )


def test_passthrough_headers_are_stored_as_given() -> None:
    config = config_from_mapping(minimal(outgoingAuth={"passthroughHeaders": ["x-request-id", "X-Tenant"]}))
    assert config.outgoing_auth.passthrough_headers == ("x-request-id", "X-Tenant")


def test_malformed_passthrough_header_is_rejected() -> None:
    assert errors_of(minimal(outgoingAuth={"passthroughHeaders": ["X Tenant"]})) == (
        "outgoingAuth.passthroughHeaders[0]: must be an HTTP header name (letters, digits and !#$%&'*+-.^_`|~)",
    )


def test_outgoing_auth_backends_naming_an_unknown_backend_is_rejected() -> None:
    auth = {"type": "unauthenticated"}
    assert errors_of(two_backends(outgoingAuth={"backends": {"github": auth, "nosuch": auth, "Jira": auth}})) == (
        "outgoingAuth.backends.Jira: no backend named 'Jira'",
        "outgoingAuth.backends.nosuch: no backend named 'nosuch'",
    )


# discovery cache

@pytest.mark.parametrize(("value", "seconds"), [(0, 0.0), ("0", 0.0), ("0s", 0.0), ("0ms", 0.0), ("2m", 120.0)])
def test_discovery_cache_ttl_of_zero_disables_and_is_allowed(value: Any, seconds: float) -> None:
    config = config_from_mapping(minimal(operational={"discoveryCacheTTL": value}))
    assert config.operational.discovery_cache_ttl == seconds


@pytest.mark.parametrize(("value", "message"), [
    ("-5s", "invalid duration '-5s': must not be negative (use e.g. 500ms, 30s, 2m)"),
    ("-1", "invalid duration '-1' (use e.g. 500ms, 30s, 2m)"),
    (30, "invalid duration 30: durations need a unit, e.g. 30s"),
])
def test_discovery_cache_ttl_negative_or_unitless_is_refused(value: Any, message: str) -> None:
    assert errors_of(minimal(operational={"discoveryCacheTTL": value})) == (
        f"operational.discoveryCacheTTL: {message}",
    )


def test_parse_duration_allows_zero_only_when_asked() -> None:
    assert parse_duration("0", allow_zero=True) == 0.0
    assert parse_duration("0s", allow_zero=True) == 0.0
    assert parse_duration("1m", allow_zero=True) == 60.0
    with pytest.raises(ValueError, match="durations need a unit"):
        parse_duration("0")
    with pytest.raises(ValueError, match="must be greater than 0"):
        parse_duration("0s")


# idle users and the signing key

def test_user_idle_timeout_and_signing_key_env_have_defaults() -> None:
    operational = config_from_mapping(minimal()).operational
    assert operational.user_idle_timeout == 300.0
    assert operational.signing_key_env is None


def test_user_idle_timeout_and_signing_key_env_are_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VMCP_SIGNING_KEY", "s3cret")
    config = config_from_mapping(minimal(operational={"userIdleTimeout": "90s", "signingKeyEnv": "VMCP_SIGNING_KEY"}))
    assert config.operational.user_idle_timeout == 90.0
    assert config.operational.signing_key_env == "VMCP_SIGNING_KEY"
    assert "s3cret" not in repr(config)


@pytest.mark.parametrize(("value", "message"), [
    ("0s", "invalid duration '0s': must be greater than 0"),
    (300, "invalid duration 300: durations need a unit, e.g. 30s"),
    ("soon", "invalid duration 'soon' (use e.g. 500ms, 30s, 2m)"),
    (None, "must not be null"),
])
def test_user_idle_timeout_must_be_a_positive_duration(value: Any, message: str) -> None:
    assert errors_of(minimal(operational={"userIdleTimeout": value})) == (f"operational.userIdleTimeout: {message}",)


@pytest.mark.parametrize("value", ["Bearer s3cret", "1KEY", "VMCP-KEY"])
def test_signing_key_env_must_be_an_env_var_name_and_is_not_echoed(value: str) -> None:
    (line,) = errors_of(minimal(operational={"signingKeyEnv": value}))
    assert line.startswith("operational.signingKeyEnv: must be an environment variable name")
    assert value not in line


# env vars

def test_required_env_vars_lists_paths_and_names(tmp_path: Path) -> None:
    data = yaml_auth_config()
    data["outgoingAuth"]["default"] = injection(headerValueEnv="DEFAULT_KEY")
    data["backends"].append({"name": "wiki", "url": "http://127.0.0.1:8083/mcp"})
    data["outgoingAuth"]["backends"]["wiki"] = injection(headerValue=SECRET)
    data["operational"] = {"signingKeyEnv": "VMCP_SIGNING_KEY"}

    assert required_env_vars(config_from_mapping(data)) == [
        ("operational.signingKeyEnv", "VMCP_SIGNING_KEY"),
        ("admin.tokenEnv", "VMCP_ADMIN_TOKEN"),
        ("outgoingAuth.default.headerInjection.headerValueEnv", "DEFAULT_KEY"),
        ("outgoingAuth.backends.github.headerInjection.headerValueEnv", "GITHUB_TOKEN"),
        ("outgoingAuth.backends.jira.tokenExchange.clientSecretEnv", "JIRA_EXCHANGE_SECRET"),
    ]


def test_required_env_vars_is_empty_without_env_references() -> None:
    assert required_env_vars(config_from_mapping(minimal())) == []
    public_client = {**with_oidc(), "outgoingAuth": {"default": exchange()}}
    assert required_env_vars(config_from_mapping(public_client)) == []


# --- aggregation: strategies, filters, overrides -----------------------------------------

AGGREGATION_CONFIG = """\
name: engineering
backends:
  - {name: github, url: http://127.0.0.1:8081/mcp}
  - {name: jira, url: http://127.0.0.1:8082/mcp}
  - {name: wiki, url: http://127.0.0.1:8083/mcp}
aggregation:
  conflictResolution: priority
  conflictResolutionConfig:
    prefixFormat: "{workload}."
    priorityOrder: [github, jira]
  excludeAllTools: false
  tools:
    - workload: github
      filter: [create_pr, list_issues]
      excludeAll: false
      overrides:
        open_pr: {name: create_pr, description: Open a pull request, annotations: {readOnlyHint: false}}
        list_issues: {description: List open issues}
    - {workload: jira, excludeAll: true}
    - {workload: wiki, filter: []}
"""


def aggregation(**settings: Any) -> dict[str, Any]:
    """A config with backends github and jira and these aggregation settings."""
    return two_backends(aggregation=settings)


def tools(*entries: dict[str, Any], **settings: Any) -> dict[str, Any]:
    return aggregation(tools=list(entries), **settings)


def test_full_aggregation_config_loads_into_the_right_dataclasses(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, AGGREGATION_CONFIG))

    assert config.aggregation == AggregationConfig(
        conflict_resolution="priority",
        prefix_format="{workload}.",
        priority_order=("github", "jira"),
        exclude_all_tools=False,
        tools=(
            WorkloadToolsConfig(
                workload="github",
                filter=("create_pr", "list_issues"),
                exclude_all=False,
                overrides={
                    "open_pr": ToolOverride(
                        name="create_pr", description="Open a pull request", annotations={"readOnlyHint": False}
                    ),
                    "list_issues": ToolOverride(description="List open issues"),
                },
            ),
            WorkloadToolsConfig(workload="jira", exclude_all=True),
            WorkloadToolsConfig(workload="wiki", filter=()),
        ),
    )
    github = config.aggregation.tools[0]
    assert isinstance(github.filter, tuple)
    assert isinstance(github.overrides, MappingProxyType)
    assert isinstance(github.overrides["open_pr"].annotations, MappingProxyType)
    assert github.overrides["list_issues"] == ToolOverride(name=None, description="List open issues", annotations=None)


def test_aggregation_defaults_hide_nothing_and_have_no_priority_order() -> None:
    config = config_from_mapping(minimal()).aggregation

    assert config.tools == ()
    assert config.exclude_all_tools is False
    assert config.priority_order == ()
    assert config == AggregationConfig()
    (workload,) = config_from_mapping(tools({"workload": "github"})).aggregation.tools
    assert workload == WorkloadToolsConfig(workload="github", filter=None, exclude_all=False, overrides={})


def test_tools_for_finds_a_workloads_settings_or_none() -> None:
    config = config_from_mapping(tools({"workload": "jira", "excludeAll": True}, {"workload": "github"})).aggregation

    assert config.tools_for("jira") == WorkloadToolsConfig(workload="jira", exclude_all=True)
    assert config.tools_for("github") == WorkloadToolsConfig(workload="github")
    assert config.tools_for("wiki") is None
    assert AggregationConfig().tools_for("github") is None


def test_aggregation_dataclasses_are_frozen_hashable_and_copy_their_arguments() -> None:
    annotations = {"readOnlyHint": True, "tags": ["a"]}
    override = ToolOverride(annotations=annotations)
    overrides = {"t": override}
    names = ["t"]
    order = ["github"]
    workload = WorkloadToolsConfig(workload="github", filter=names, overrides=overrides)  # type: ignore[arg-type]
    config = AggregationConfig(priority_order=order, tools=[workload])  # type: ignore[arg-type]
    annotations["readOnlyHint"] = False
    annotations["tags"].append("b")  # type: ignore[attr-defined]
    overrides["u"] = ToolOverride(name="u")
    names.append("u")
    order.append("jira")

    assert override.annotations == {"readOnlyHint": True, "tags": ["a"]}
    assert dict(workload.overrides) == {"t": override}
    assert workload.filter == ("t",)
    assert config.priority_order == ("github",)
    assert config.tools == (workload,)
    with pytest.raises(dataclasses.FrozenInstanceError):
        workload.exclude_all = True  # type: ignore[misc]
    with pytest.raises(TypeError):
        workload.overrides["v"] = override  # type: ignore[index]
    with pytest.raises(TypeError):
        override.annotations["x"] = 1  # type: ignore[index]
    same_override = ToolOverride(annotations={"readOnlyHint": True, "tags": ["a"]})
    same = AggregationConfig(
        priority_order=("github",), tools=(WorkloadToolsConfig("github", ("t",), overrides={"t": same_override}),)
    )
    assert config == same
    assert hash(config) == hash(same)


@pytest.mark.parametrize("strategy", ["priority", "manual"])
def test_priority_and_manual_conflict_resolution_are_accepted(strategy: str) -> None:
    settings: dict[str, Any] = {"conflictResolution": strategy}
    if strategy == "priority":
        settings["conflictResolutionConfig"] = {"priorityOrder": ["jira"]}
    config = config_from_mapping(aggregation(**settings)).aggregation
    assert config.conflict_resolution == strategy


@pytest.mark.parametrize("settings", [{}, {"prefixFormat": "{workload}."}, {"priorityOrder": []}])
def test_priority_without_a_priority_order_is_rejected(settings: dict[str, Any]) -> None:
    data = aggregation(conflictResolution="priority", conflictResolutionConfig=settings)
    assert errors_of(data) == (
        "aggregation.conflictResolutionConfig.priorityOrder: is required for conflictResolution priority",
    )


@pytest.mark.parametrize(
    ("strategy", "order"), [(None, ["github"]), ("prefix", ["github"]), ("manual", []), ("manual", ["jira"])]
)
def test_priority_order_with_another_strategy_loads_with_a_warning_not_silently(
    strategy: str | None, order: list[str]
) -> None:
    """The DESIGN.md contract example carries priorityOrder under prefix: it must load."""
    from vmcp_actors.config import config_warnings

    settings: dict[str, Any] = {"conflictResolutionConfig": {"priorityOrder": order}}
    if strategy is not None:
        settings["conflictResolution"] = strategy
    config = config_from_mapping(aggregation(**settings))
    expected = [] if not order else [
        f"aggregation.conflictResolutionConfig.priorityOrder: under {strategy or 'prefix'} it names no tool; it "
        "only ranks the backends whose tools share an own name an app calls by (the first listed gets such a call)"
    ]
    assert config_warnings(config) == expected


@pytest.mark.parametrize("strategy", ["priority", "manual"])
def test_prefix_format_with_priority_or_manual_is_accepted_silently(strategy: str) -> None:
    settings: dict[str, Any] = {"prefixFormat": "{workload}."}
    if strategy == "priority":
        settings["priorityOrder"] = ["github"]
    config = config_from_mapping(aggregation(conflictResolution=strategy, conflictResolutionConfig=settings))
    assert config.aggregation.prefix_format == "{workload}."


def test_priority_order_must_name_configured_backends() -> None:
    data = aggregation(conflictResolution="priority", conflictResolutionConfig={"priorityOrder": ["github", "x"]})
    assert errors_of(data) == ("aggregation.conflictResolutionConfig.priorityOrder[1]: no backend named 'x'",)


def test_priority_order_must_not_repeat_a_backend() -> None:
    order = ["jira", "github", "jira"]
    data = aggregation(conflictResolution="priority", conflictResolutionConfig={"priorityOrder": order})
    assert errors_of(data) == (
        "aggregation.conflictResolutionConfig.priorityOrder[2]: duplicate backend 'jira' (also priorityOrder[0])",
    )


def test_priority_order_need_not_list_every_backend() -> None:
    data = aggregation(conflictResolution="priority", conflictResolutionConfig={"priorityOrder": ["jira"]})
    assert config_from_mapping(data).aggregation.priority_order == ("jira",)


def test_tools_workload_must_name_a_configured_backend() -> None:
    assert errors_of(tools({"workload": "github"}, {"workload": "confluence"})) == (
        "aggregation.tools[1].workload: no backend named 'confluence'",
    )


def test_tools_workload_is_required() -> None:
    assert errors_of(tools({"filter": ["a"]})) == ("aggregation.tools[0].workload: is required",)


def test_workload_listed_twice_is_an_error_at_the_second() -> None:
    data = tools({"workload": "github"}, {"workload": "jira"}, {"workload": "github", "excludeAll": True})
    assert errors_of(data) == ("aggregation.tools[2].workload: duplicate workload 'github' (also tools[0])",)


@pytest.mark.parametrize(("value", "message"), [
    ("create_pr", "filter: must be a list"),
    (None, "filter: must not be null"),
    (["a", ""], "filter[1]: must not be empty"),
    (["a", 3], "filter[1]: must be a string"),
])
def test_filter_must_be_a_list_of_non_empty_strings(value: Any, message: str) -> None:
    assert errors_of(tools({"workload": "github", "filter": value})) == (f"aggregation.tools[0].{message}",)


def test_empty_filter_is_accepted_and_advertises_nothing() -> None:
    (github,) = config_from_mapping(tools({"workload": "github", "filter": []})).aggregation.tools
    assert github.filter == ()


@pytest.mark.parametrize("value", ["true", 1, None])
def test_exclude_all_and_exclude_all_tools_must_be_booleans(value: Any) -> None:
    data = tools({"workload": "github", "excludeAll": value}, excludeAllTools=value)
    expected = "must not be null" if value is None else "must be true or false"
    assert errors_of(data) == (
        f"aggregation.excludeAllTools: {expected}",
        f"aggregation.tools[0].excludeAll: {expected}",
    )


def test_exclude_all_tools_is_loaded() -> None:
    assert config_from_mapping(aggregation(excludeAllTools=True)).aggregation.exclude_all_tools is True


def test_filter_with_exclude_all_true_is_contradictory() -> None:
    assert errors_of(tools({"workload": "github", "filter": ["a"], "excludeAll": True})) == (
        "aggregation.tools[0]: filter and excludeAll true contradict each other (excludeAll hides every tool); "
        "keep one",
    )
    data = tools({"workload": "github", "filter": ["a"], "excludeAll": False})
    (github,) = config_from_mapping(data).aggregation.tools
    assert github.filter == ("a",)


def test_filter_may_name_a_renamed_tool_by_its_backend_name_as_toolhive_does() -> None:
    renamed = {"open_pr": {"name": "create_pr"}}
    loaded = config_from_mapping(tools({"workload": "github", "filter": ["open_pr"], "overrides": renamed}))
    assert loaded.aggregation.is_advertised("github", "create_pr", "open_pr")  # ToolHive: the backend's name
    assert not loaded.aggregation.is_advertised("github", "merge_pr", "merge_pr")
    both = config_from_mapping(tools({"workload": "github", "filter": ["create_pr"], "overrides": renamed}))
    assert both.aggregation.is_advertised("github", "create_pr", "open_pr")  # this project's: the new name


def test_a_config_with_every_field_of_toolhives_example_loads() -> None:
    from pathlib import Path

    import yaml

    data = yaml.safe_load((Path(__file__).parents[1] / "fixtures" / "toolhive-example-fields.yaml").read_text())
    assert errors_of(data) == (
        "backends: is required",
        "groupRef: groupRef is not supported yet outside ToolHive's Kubernetes operator: list the group's "
        "servers under backends (name and url each)",
    )
    del data["groupRef"]
    data["backends"] = [{"name": "tracker", "url": "http://127.0.0.1:9001/mcp"},
                        {"name": "wiki", "url": "http://127.0.0.1:9002/mcp"}]
    loaded = config_from_mapping(data)
    assert loaded.telemetry.endpoint == "http://localhost:4317" and loaded.telemetry.sampling_rate == 0.1
    from vmcp_actors.config import config_warnings

    assert [w.split(":")[0] for w in config_warnings(loaded)] == ["telemetry.endpoint", "telemetry.metricsEnabled"]
    assert loaded.operational.failure_handling.partial_failure_mode == "fail"
    assert loaded.incoming_auth.oidc.scopes == ("openid", "profile")


def test_filter_may_name_an_old_name_that_another_override_reuses() -> None:
    swap = {"a": {"name": "b"}, "b": {"name": "a"}}
    (github,) = config_from_mapping(tools({"workload": "github", "filter": ["a"], "overrides": swap})).aggregation.tools
    assert github.filter == ("a",)


@pytest.mark.parametrize("override", [{}, None])
def test_override_must_set_name_description_or_annotations(override: Any) -> None:
    expected = "must set at least one of name, description, annotations" if override == {} else "must be a mapping"
    assert errors_of(tools({"workload": "github", "overrides": {"open_pr": override}})) == (
        f"aggregation.tools[0].overrides.open_pr: {expected}",
    )


@pytest.mark.parametrize("name", ["has space", "", "x" * 129, "caf\u00e9", "a/b"])
def test_override_name_must_be_a_valid_mcp_tool_name(name: str) -> None:
    assert errors_of(tools({"workload": "github", "overrides": {"open_pr": {"name": name}}})) == (
        "aggregation.tools[0].overrides.open_pr.name: must be an MCP tool name: 1-128 letters, digits, '_', '-' or '.'",
    )


def test_override_name_of_128_characters_with_dots_and_dashes_is_accepted() -> None:
    name = "a.b-c_" + "x" * 122
    (github,) = config_from_mapping(tools({"workload": "github", "overrides": {"t": {"name": name}}})).aggregation.tools
    assert github.overrides["t"].name == name


@pytest.mark.parametrize(("override", "message"), [
    ({"description": 3}, "description: must be a string"),
    ({"description": None}, "description: must not be null"),
    ({"name": None}, "name: must not be null"),
    ({"annotations": ["readOnlyHint"]}, "annotations: must be a mapping"),
    ({"name": "x", "title": "X"}, "title: unknown field"),
])
def test_override_fields_have_the_right_types(override: dict[str, Any], message: str) -> None:
    assert errors_of(tools({"workload": "github", "overrides": {"t": override}})) == (
        f"aggregation.tools[0].overrides.t.{message}",
    )


def test_override_annotations_take_any_json_values() -> None:
    annotations = {"title": "T", "readOnlyHint": True, "weight": 1.5, "n": None, "tags": ["a", {"b": [1]}]}
    (github,) = config_from_mapping(
        tools({"workload": "github", "overrides": {"t": {"annotations": annotations}}})
    ).aggregation.tools
    assert github.overrides["t"].annotations == annotations


def test_override_annotations_that_are_not_json_are_rejected() -> None:
    annotations = yaml.safe_load("{since: 2024-01-01, big: .inf, 3: x, ok: true}")
    assert errors_of(tools({"workload": "github", "overrides": {"t": {"annotations": annotations}}})) == (
        "aggregation.tools[0].overrides.t.annotations.3: names must be strings (quote them in YAML)",
        "aggregation.tools[0].overrides.t.annotations.big: must be a JSON value "
        "(string, finite number, boolean, null, list, mapping with string keys)",
        "aggregation.tools[0].overrides.t.annotations.since: must be a JSON value "
        "(string, finite number, boolean, null, list, mapping with string keys)",
    )


def test_override_keys_must_not_be_empty() -> None:
    assert errors_of(tools({"workload": "github", "overrides": {"": {"name": "x"}}})) == (
        "aggregation.tools[0].overrides: keys must be tool names, not empty",
    )


def test_overrides_must_be_a_mapping_of_tool_names() -> None:
    assert errors_of(tools({"workload": "github", "overrides": [{"name": "x"}]})) == (
        "aggregation.tools[0].overrides: must be a mapping of tool name to settings",
    )


@pytest.mark.parametrize("strategy", ["prefix", "manual"])
def test_two_overrides_of_one_workload_with_the_same_name_are_rejected(strategy: str) -> None:
    data = tools(
        {"workload": "github", "overrides": {"a": {"name": "x"}, "b": {"name": "x"}, "c": {"name": "y"}}},
        conflictResolution=strategy,
    )
    assert errors_of(data) == ("aggregation.tools[0].overrides.b.name: 'x' is also the new name of 'a'",)


def test_override_names_clashing_across_workloads_are_rejected_under_manual() -> None:
    data = tools(
        {"workload": "github", "overrides": {"a": {"name": "x"}}},
        {"workload": "jira", "overrides": {"y": {"name": "x"}, "z": {"name": "z2"}}},
        conflictResolution="manual",
    )
    assert errors_of(data) == (
        "aggregation.tools[1].overrides.y.name: 'x' clashes with github's override of 'a' (manual conflict resolution)",
    )


@pytest.mark.parametrize("settings", [
    {},
    {"conflictResolution": "prefix"},
    {"conflictResolution": "priority", "conflictResolutionConfig": {"priorityOrder": ["github"]}},
])
def test_override_names_may_repeat_across_workloads_under_prefix_and_priority(settings: dict[str, Any]) -> None:
    data = tools(
        {"workload": "github", "overrides": {"a": {"name": "x"}}},
        {"workload": "jira", "overrides": {"y": {"name": "x"}}},
        **settings,
    )
    github, jira = config_from_mapping(data).aggregation.tools
    assert github.overrides["a"].name == jira.overrides["y"].name == "x"


def test_aggregation_errors_are_reported_together() -> None:
    data = tools(
        {"workload": "github", "filter": ["x"], "excludeAll": True, "overrides": {"a": {"name": "bad name"}}},
        {"workload": "nosuch", "overrides": {"b": {}}},
        conflictResolution="priority",
        excludeAllTools="no",
    )
    assert errors_of(data) == (
        "aggregation.conflictResolutionConfig.priorityOrder: is required for conflictResolution priority",
        "aggregation.excludeAllTools: must be true or false",
        "aggregation.tools[0]: filter and excludeAll true contradict each other (excludeAll hides every tool); "
        "keep one",
        "aggregation.tools[0].overrides.a.name: must be an MCP tool name: 1-128 letters, digits, '_', '-' or '.'",
        "aggregation.tools[1].overrides.b: must set at least one of name, description, annotations",
        "aggregation.tools[1].workload: no backend named 'nosuch'",
    )


def test_a_yaml_alias_used_inside_itself_is_a_config_error_not_a_crash(tmp_path):
    path = tmp_path / "loop.yaml"
    path.write_text("name: x\nbackends: [{name: a, url: 'http://127.0.0.1:1/mcp'}]\n"
                    "compositeTools:\n  - name: c\n    description: d\n"
                    "    steps: [{id: s, tool: a.t, arguments: &x {loop: [*x]}}]\n")
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    assert raised.value.errors == ("config: nested too deeply (is a YAML alias used inside itself?)",)
