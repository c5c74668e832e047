"""Unit tests for the codeMode section: YAML -> CodeModeConfig, every problem as one
``path: message`` line (issue 39)."""

from __future__ import annotations

from typing import Any

import pytest

from vmcp_actors.config import CodeModeConfig, config_from_mapping
from vmcp_actors.exceptions import ConfigError

MI, GI = 1024 ** 2, 1024 ** 3


def minimal(code_mode: dict[str, Any] | None = None, **overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {"name": "engineering", "backends": [{"name": "github", "url": "http://127.0.0.1:8081/mcp"}]}
    if code_mode is not None:
        data["codeMode"] = code_mode
    data.update(overrides)
    return data


def loaded(code_mode: dict[str, Any], **overrides: Any) -> CodeModeConfig:
    return config_from_mapping(minimal(code_mode, **overrides)).code_mode


def errors_of(data: dict[str, Any]) -> tuple[str, ...]:
    with pytest.raises(ConfigError) as info:
        config_from_mapping(data)
    return info.value.errors


def composite(name: str) -> dict[str, Any]:
    return {"name": name, "description": "d", "steps": [{"id": "s", "tool": "github.get_issue"}]}


# --- what loads -------------------------------------------------------------------------


def test_without_the_section_code_mode_is_off_with_its_defaults() -> None:
    code_mode = config_from_mapping(minimal()).code_mode
    assert code_mode == CodeModeConfig()
    assert (code_mode.enabled, code_mode.listing, code_mode.tools) == (False, "scripts", ("*",))
    assert (code_mode.timeout, code_mode.execution_time, code_mode.tool_call_timeout, code_mode.task_after) == \
        (60.0, 5.0, 30.0, 2.0)
    assert (code_mode.max_tool_calls, code_mode.parallel_max_concurrency, code_mode.max_memory,
            code_mode.max_recursion_depth, code_mode.max_script_size, code_mode.max_concurrent_scripts) == \
        (100, 8, 64 * MI, 200, 64 * 1024, 4)
    assert code_mode.worker_isolation == "bubblewrap"


def test_enabled_alone_takes_every_default() -> None:
    assert loaded({"enabled": True}) == CodeModeConfig(enabled=True)


def test_every_setting_loads() -> None:
    code_mode = loaded({"enabled": True, "listing": "all", "tools": ["github_*", "jira_search"], "timeout": "2m",
                        "executionTime": "500ms", "toolCallTimeout": "10s", "maxToolCalls": 7,
                        "parallelMaxConcurrency": 2, "maxMemory": "16Mi", "maxRecursionDepth": 50,
                        "maxScriptSize": "8Ki", "maxConcurrentScripts": 3, "taskAfter": 0})
    assert code_mode == CodeModeConfig(
        enabled=True, listing="all", tools=("github_*", "jira_search"), timeout=120.0, execution_time=0.5,
        tool_call_timeout=10.0, max_tool_calls=7, parallel_max_concurrency=2, max_memory=16 * MI,
        max_recursion_depth=50, max_script_size=8 * 1024, max_concurrent_scripts=3, task_after=0.0,
        worker_isolation="bubblewrap")
    assert loaded({"enabled": True, "workerIsolation": "none"}).worker_isolation == "none"


@pytest.mark.parametrize(("given", "size"), [
    ("64Mi", 64 * MI), (1048576, MI), ("1Gi", GI), ("2048Ki", 2 * MI), ("4Gi", 4 * GI), (" 64 Mi ", 64 * MI),
    ("64MiB", 64 * MI), ("1048576", MI),
])
def test_max_memory_takes_bytes_or_a_binary_unit(given: Any, size: int) -> None:
    assert loaded({"maxMemory": given}).max_memory == size


@pytest.mark.parametrize("given", ["64MB", "64M", "lots", "", "1.5Gi", "-1Mi", "64 mi", True, 1.5, [64]])
def test_max_memory_refuses_what_is_no_size(given: Any) -> None:
    assert errors_of(minimal({"maxMemory": given})) == (
        "codeMode.maxMemory: must be a size in bytes: an integer, or a number with Ki, Mi or Gi (64Mi)",)


def test_max_memory_may_not_be_null() -> None:
    assert errors_of(minimal({"maxMemory": None})) == ("codeMode.maxMemory: Field may not be null.",)


@pytest.mark.parametrize("given", [1000, MI - 1, 0, -1, "1023Ki", 4 * GI + 1, "5Gi"])
def test_max_memory_out_of_range_is_refused(given: Any) -> None:
    assert errors_of(minimal({"maxMemory": given})) == (
        f"codeMode.maxMemory: must be between {MI} and {4 * GI} bytes",)


# --- what is refused, at its path ---------------------------------------------------------


def test_step_limit_is_refused_saying_what_limits_instead() -> None:
    (error,) = errors_of(minimal({"enabled": True, "stepLimit": 100000}))
    assert error.startswith("codeMode.stepLimit: ") and "codeMode.executionTime" in error, error


def test_step_limit_is_refused_with_code_mode_off_too() -> None:
    (error,) = errors_of(minimal({"stepLimit": 5}))
    assert error.startswith("codeMode.stepLimit: "), error


def test_listing_all_with_the_optimizer_is_refused_at_listing() -> None:
    (error,) = errors_of(minimal({"enabled": True, "listing": "all"}, optimizer={}))
    assert error.startswith("codeMode.listing: 'all' lists every tool") and "listing: scripts" in error, error


def test_listing_scripts_with_the_optimizer_loads() -> None:
    config = config_from_mapping(minimal({"enabled": True}, optimizer={}))
    assert config.code_mode.listing == "scripts" and config.optimizer is not None


def test_listing_all_with_the_optimizer_is_no_error_while_code_mode_is_off() -> None:
    assert loaded({"enabled": False, "listing": "all"}, optimizer={}).listing == "all"


@pytest.mark.parametrize("name", ["execute_tool_script", "search_tools", "get_tool_schema"])
def test_a_composite_named_as_a_code_mode_tool_is_refused_at_its_name(name: str) -> None:
    (error,) = errors_of(minimal({"enabled": True}, compositeTools=[composite("triage"), composite(name)]))
    assert error == f"compositeTools[1].name: {name!r} is code mode's own tool (codeMode.enabled): rename the " \
                    "composite", error


def test_a_composite_named_execute_tool_script_loads_while_code_mode_is_off() -> None:
    config = config_from_mapping(minimal({"enabled": False}, compositeTools=[composite("execute_tool_script")]))
    assert [tool.name for tool in config.composite_tools] == ["execute_tool_script"]


@pytest.mark.parametrize(("tools", "expected"), [
    (["github_*", "jira search"], ("codeMode.tools[1]: must be a tool name or an fnmatch pattern (github_*), "
                                   "without spaces",)),
    ([" "], ("codeMode.tools[0]: must be a tool name or an fnmatch pattern (github_*), without spaces",)),
    ([], ("codeMode.tools: must name at least one tool or pattern",)),
])
def test_a_bad_tools_pattern_is_refused_at_its_index(tools: list[str], expected: tuple[str, ...]) -> None:
    assert errors_of(minimal({"enabled": True, "tools": tools})) == expected


@pytest.mark.parametrize(("field", "value", "path"), [
    ("listing", "some", "codeMode.listing"),
    ("maxToolCalls", 0, "codeMode.maxToolCalls"),
    ("maxToolCalls", 10_001, "codeMode.maxToolCalls"),
    ("parallelMaxConcurrency", 65, "codeMode.parallelMaxConcurrency"),
    ("maxRecursionDepth", 9, "codeMode.maxRecursionDepth"),
    ("maxConcurrentScripts", 0, "codeMode.maxConcurrentScripts"),
    ("maxScriptSize", 63, "codeMode.maxScriptSize"),
    ("timeout", "2h", "codeMode.timeout"),
    ("executionTime", "0s", "codeMode.executionTime"),
    ("taskAfter", "later", "codeMode.taskAfter"),
    ("enabled", "yes please", "codeMode.enabled"),
    ("workerIsolation", "docker", "codeMode.workerIsolation"),
    ("whatever", 1, "codeMode.whatever"),
])
def test_a_bad_field_is_reported_at_its_path(field: str, value: Any, path: str) -> None:
    errors = errors_of(minimal({"enabled": True, field: value}))
    assert len(errors) == 1 and errors[0].startswith(path + ": "), errors


def test_every_problem_of_the_section_is_its_own_line() -> None:
    errors = errors_of(minimal({"enabled": True, "stepLimit": 1, "maxMemory": "lots", "tools": ["a b"]}))
    assert sorted(error.split(":", 1)[0] for error in errors) == [
        "codeMode.maxMemory", "codeMode.stepLimit", "codeMode.tools[0]"], errors


def test_both_combinations_are_reported_together() -> None:
    errors = errors_of(minimal({"enabled": True, "listing": "all"}, optimizer={},
                               compositeTools=[composite("search_tools")]))
    assert sorted(error.split(":", 1)[0] for error in errors) == ["codeMode.listing", "compositeTools[0].name"], errors
