"""How a script's values cross the sandbox's edge (issue 39): a tool's result as ``call_tool``
returns it to the script, and the script's final value as the script tool's result."""

from __future__ import annotations

import math

import pytest

from vmcp_actors.codemode import failure, script_result, tool_value
from vmcp_actors.codemode._sandbox import _call_arguments, _explained
from vmcp_actors.config import CodeModeConfig


def test_a_tool_result_reaches_the_script_as_its_structured_content_else_its_text():
    structured = {"content": [{"type": "text", "text": "{}"}], "structuredContent": {"n": 1}}
    assert tool_value("t", structured) == {"return_value": {"n": 1}}
    texts = {"content": [{"type": "text", "text": "a"}, {"type": "image", "data": "x"}, {"type": "text", "text": "b"}]}
    assert tool_value("t", texts) == {"return_value": "a\nb"}
    image = {"content": [{"type": "image", "data": "x", "mimeType": "image/png"}]}
    assert tool_value("t", image) == {"return_value": [{"type": "image", "data": "x", "mimeType": "image/png"}]}


def test_a_tool_error_raises_in_the_script_with_its_text():
    answer = tool_value("github_search", {"content": [{"type": "text", "text": "rate limited"}], "isError": True})
    assert answer == {"exc_type": "RuntimeError", "message": "github_search failed: rate limited"}


@pytest.mark.parametrize(("value", "structured", "text"), [
    ({"a": [1, 2]}, {"a": [1, 2]}, '{"a":[1,2]}'),
    ([1, "x"], {"result": [1, "x"]}, '[1,"x"]'),
    (3, {"result": 3}, "3"),
    (None, {"result": None}, "null"),
    ((1, 2), {"result": (1, 2)}, "[1,2]"),
])
def test_a_json_value_is_structured_an_object_as_is_anything_else_under_result(value, structured, text):
    result = script_result(value)
    assert result["structuredContent"] == structured and result["content"][0]["text"] == text
    assert result["isError"] is False


def test_text_stays_text_and_what_is_not_json_is_shown_as_written():
    assert script_result("hello") == {"content": [{"type": "text", "text": "hello"}], "isError": False}
    for value in ({1: "a"}, {"x": math.nan}, {1, 2}, b"bytes"):
        result = script_result(value)
        assert "structuredContent" not in result and result["content"][0]["text"] == repr(value)


def test_printed_output_and_unawaited_calls_are_told_after_the_value():
    result = script_result({"ok": True}, printed="step 1\n", unawaited=2)
    assert [block["text"] for block in result["content"][1:]] == [
        "note: 2 call_tool(...) call(s) were never awaited (write `await call_tool(...)`); those still running were "
        "cancelled",
        "printed:\nstep 1\n"]
    assert failure("boom", "p") == {"content": [{"type": "text", "text": "boom"}, {"type": "text", "text": "printed:\np"}],
                                    "isError": True}


@pytest.mark.parametrize(("args", "kwargs", "expected"), [
    (("t",), {}, ("t", {}, None)),
    (("t", {"a": 1}), {}, ("t", {"a": 1}, None)),
    ((), {"name": "t", "arguments": {"a": 1}}, ("t", {"a": 1}, None)),
    (("t", None), {}, ("t", {}, None)),
])
def test_call_tool_takes_a_name_and_a_dict(args, kwargs, expected):
    assert _call_arguments(args, kwargs) == expected


@pytest.mark.parametrize(("args", "kwargs", "said"), [
    ((), {}, "must be a tool's name"),
    ((3,), {}, "must be a tool's name"),
    (("t", [1]), {}, "arguments must be a dict"),
    (("t", {1: 2}), {}, "arguments must be a dict"),
    (("t", {}, 1), {}, "takes a tool's name and a dict"),
    (("t",), {"timeout": 3}, "takes a tool's name and a dict"),
])
def test_anything_else_is_a_type_error_in_the_script(args, kwargs, said):
    _, _, problem = _call_arguments(args, kwargs)
    assert problem is not None and said in problem


def test_a_limit_the_engine_reports_names_its_config_field():
    settings = CodeModeConfig(enabled=True, max_memory=1024 ** 2, execution_time=2.0)
    assert _explained("MemoryError: memory limit exceeded: 2 > 1", settings).endswith(
        "The script hit a limit: codeMode.maxMemory (1048576 bytes).")
    assert _explained("TimeoutError: feed time limit exceeded: 2.1s > 2s", settings).endswith(
        "codeMode.executionTime (2s).")
    assert _explained("RecursionError: maximum recursion depth exceeded", settings).endswith(
        "codeMode.maxRecursionDepth (200).")
    assert _explained("ValueError: nope", settings) == "ValueError: nope"
