"""How the gateway copes with real backends at the edge: paging, tolerance, failures,
re-initialization, timeouts, request ids, result fidelity, SSE relay, laziness."""

from __future__ import annotations

import json
import logging
import threading
import time

import pytest
import requests

from tests.backends import (
    RawMcpBackend,
    delayed_backend,
    erroring_lists_backend,
    method_not_found_backend,
    paged_backend,
    restartable_backend,
    sdk_backend,
    sse_backend,
    static_result,
    text_result,
    tool_def,
)
from tests.gateway import (
    admin_get,
    answer_of,
    backend_entry,
    list_all,
    run_client,
    sse_messages,
)
from tests.ports import closed_port_url

ADMIN_ENV = "VMCP_TEST_EDGE_ADMIN_TOKEN"
ADMIN_TOKEN = "edge-admin-token-4f1c"
TOLERATED = ("resources/list", "resources/templates/list", "prompts/list")
WAIT = 30.0  # for what takes milliseconds: generous, so a loaded machine does not fail a test


def _call(gateway, session_id, name, arguments=None, request_id=1, meta=None):
    params = {"name": name, "arguments": arguments or {}}
    if meta is not None:
        params["_meta"] = meta
    return gateway.rpc(session_id, "tools/call", params, request_id=request_id)


def _text(answer: dict) -> str:
    assert "result" in answer, answer
    return answer["result"]["content"][0]["text"]


def _tool_names(gateway, session_id) -> list[str]:
    return [tool["name"] for tool in list_all(gateway, session_id, "tools/list", "tools")]


def _backend_states(gateway) -> dict[str, dict]:
    response = admin_get(gateway, token=ADMIN_TOKEN)
    assert response.status_code == 200, response.text
    sessions = response.json()["sessions"]
    assert len(sessions) == 1, sessions
    return {b["backend"]: b for b in sessions[0]["backends"]}


# -- 1. pagination ------------------------------------------------------------------------


def test_backend_pagination_is_followed_to_the_end(start_gateway):
    with paged_backend(total=23, page_size=5, prompts=7, prompt_page_size=3, resources=6, resource_page_size=4) as paged:
        gateway = start_gateway({"name": "t", "backends": [backend_entry("paged", paged)]})
        sid = gateway.initialize()

        assert _tool_names(gateway, sid) == [f"paged_tool_{i:02d}" for i in range(23)]
        prompts = list_all(gateway, sid, "prompts/list", "prompts")
        assert [p["name"] for p in prompts] == [f"paged_prompt_{i:02d}" for i in range(7)]
        resources = list_all(gateway, sid, "resources/list", "resources")
        assert [r["uri"] for r in resources] == [f"paged://paged/resource_{i:02d}" for i in range(6)]

        # every page was asked for exactly once: 23/5 -> 5 pages, 7/3 -> 3, 6/4 -> 2
        assert len(paged.requests("tools/list")) == 5
        assert len(paged.requests("prompts/list")) == 3
        assert len(paged.requests("resources/list")) == 2

        # a paged tool is callable under its prefixed name and reaches the backend by its own
        assert _text(_call(gateway, sid, "paged_tool_22")) == "tool_22"


def test_gateway_pages_its_own_lists_and_the_client_sees_everything(start_gateway):
    with paged_backend(total=23, page_size=5) as paged:
        gateway = start_gateway(
            {"name": "t", "backends": [backend_entry("paged", paged)], "operational": {"pageSize": 10}}
        )
        sid = gateway.initialize()
        first = gateway.rpc(sid, "tools/list")["result"]
        assert len(first["tools"]) == 10 and first.get("nextCursor")
        assert _tool_names(gateway, sid) == [f"paged_tool_{i:02d}" for i in range(23)]

        # the SDK client's list_tools returns one page; walk them all by cursor
        async def work_all(client):
            names, cursor = [], None
            while True:
                page = await client.list_tools(cursor=cursor) if cursor else await client.list_tools()
                names += [t.name for t in page.tools]
                cursor = page.next_cursor
                if not cursor:
                    return names

        assert run_client(gateway.url, work_all) == [f"paged_tool_{i:02d}" for i in range(23)]


# -- 2. tolerance of -32601 on advertised lists ------------------------------------------


def test_method_not_found_on_advertised_lists_is_tolerated(start_gateway, caplog):
    caplog.set_level(logging.WARNING, logger="vmcp_actors")
    with method_not_found_backend() as mnf, sdk_backend("alpha") as alpha:
        gateway = start_gateway({"name": "t", "backends": [backend_entry("mnf", mnf), backend_entry("alpha", alpha)]})
        sid = gateway.initialize()

        names = _tool_names(gateway, sid)
        assert "mnf_still_here" in names and "alpha_echo" in names
        assert _text(_call(gateway, sid, "mnf_still_here")) == "still here"

        resources = list_all(gateway, sid, "resources/list", "resources")
        assert {r["uri"] for r in resources} == {"test://alpha/static", "test://shared/readme"}
        templates = list_all(gateway, sid, "resources/templates/list", "resourceTemplates")
        assert [t["uriTemplate"] for t in templates] == ["test://alpha/items/{item}"]
        prompts = list_all(gateway, sid, "prompts/list", "prompts")
        assert [p["name"] for p in prompts] == ["alpha_greet"]

        # the backend was asked (and answered -32601) for each tolerated list
        for method in TOLERATED:
            assert mnf.requests(method), method

        display = f"http://127.0.0.1:{mnf.port}/mcp"
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING and r.name.startswith("vmcp_actors")]
        for method in TOLERATED:
            lines = [r.getMessage() for r in warnings if method in r.getMessage().split()]
            assert len(lines) == 1, (method, [r.getMessage() for r in warnings])
            assert "mnf" in lines[0] and display in lines[0], lines[0]
        # nothing else was worth a warning
        assert len(warnings) == len(TOLERATED), [r.getMessage() for r in warnings]


def test_no_warning_when_the_lists_work(start_gateway, caplog):
    caplog.set_level(logging.WARNING, logger="vmcp_actors")
    with sdk_backend("alpha") as alpha, paged_backend() as paged:
        gateway = start_gateway({"name": "t", "backends": [backend_entry("alpha", alpha), backend_entry("paged", paged)]})
        sid = gateway.initialize()
        assert _tool_names(gateway, sid)
        list_all(gateway, sid, "resources/list", "resources")
        list_all(gateway, sid, "prompts/list", "prompts")
        warnings = [r for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("vmcp_actors")]
        assert warnings == [], [r.getMessage() for r in warnings]


def test_tolerance_warning_shows_the_display_url_only(start_gateway, caplog):
    caplog.set_level(logging.WARNING, logger="vmcp_actors")
    with method_not_found_backend() as mnf:
        secret_url = f"http://user:pa55word@127.0.0.1:{mnf.port}/mcp?apikey=k3y#frag"
        gateway = start_gateway({"name": "t", "backends": [{"name": "mnf", "url": secret_url}]})
        sid = gateway.initialize()
        assert _tool_names(gateway, sid) == ["mnf_still_here"]
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == len(TOLERATED), warnings
        for line in warnings:
            assert f"http://127.0.0.1:{mnf.port}/mcp" in line
            for secret in ("user", "pa55word", "apikey", "k3y", "frag"):
                assert secret not in line, (secret, line)


# -- 3. other list errors stay fatal for that backend -------------------------------------


@pytest.mark.parametrize(
    "failure",
    [
        pytest.param({"code": -32603}, id="jsonrpc-32603"),
        pytest.param({"http_status": 500}, id="http-500"),
        # -32601 is tolerated only on the optional lists, never on tools/list
        pytest.param({"code": -32601, "methods": ("tools/list",)}, id="tools-list-32601"),
    ],
)
def test_other_list_errors_drop_the_backend_only(start_gateway, monkeypatch, failure):
    monkeypatch.setenv(ADMIN_ENV, ADMIN_TOKEN)
    with erroring_lists_backend(**failure) as broken, sdk_backend("alpha") as alpha:
        gateway = start_gateway(
            {
                "name": "t",
                "backends": [backend_entry("broken", broken), backend_entry("alpha", alpha)],
                "admin": {"tokenEnv": ADMIN_ENV},
            }
        )
        sid = gateway.initialize()
        names = _tool_names(gateway, sid)
        assert names and all(name.startswith("alpha_") for name in names), names
        assert _text(_call(gateway, sid, "alpha_echo", {"text": "hi"})) == "alpha:hi"
        uris = {r["uri"] for r in list_all(gateway, sid, "resources/list", "resources")}
        assert uris == {"test://alpha/static", "test://shared/readme"}
        # the failed backend's tools are not callable either
        answer = _call(gateway, sid, "broken_echo", {"text": "hi"})
        assert "error" in answer, answer

        states = _backend_states(gateway)
        assert states["alpha"]["state"] == "ready"
        assert states["broken"]["state"] == "failed", states["broken"]
        last_error = states["broken"]["lastError"]
        assert last_error and "broken" in last_error
        assert "127.0.0.1" not in last_error and str(broken.port) not in last_error


# -- 4. re-initialize when the backend forgot the session ---------------------------------


def test_reinitializes_once_when_the_backend_forgets_the_session(start_gateway):
    with restartable_backend() as backend:
        gateway = start_gateway({"name": "t", "backends": [backend_entry("rs", backend)]})
        sid = gateway.initialize()
        assert _text(_call(gateway, sid, "rs_echo", {"text": "one"})) == "restartable:one"
        before = backend.initialize_count
        assert before == 1

        backend.forget_sessions()
        assert _text(_call(gateway, sid, "rs_echo", {"text": "two"})) == "restartable:two"
        assert backend.initialize_count == before + 1
        # and the new backend session keeps working without another handshake
        assert _text(_call(gateway, sid, "rs_echo", {"text": "three"})) == "restartable:three"
        assert backend.initialize_count == before + 1
        assert len(backend.sessions) == 1


def test_concurrent_calls_after_a_backend_restart_reinitialize_once(start_gateway):
    with restartable_backend() as backend:
        gateway = start_gateway({"name": "t", "backends": [backend_entry("rs", backend)]})
        sid = gateway.initialize()
        assert _text(_call(gateway, sid, "rs_echo", {"text": "first"})) == "restartable:first"
        assert backend.initialize_count == 1

        backend.forget_sessions()
        backend.hang = True  # held until all six are in: they all hit the 404 before any renewal
        answers: dict[int, dict] = {}

        def call(i: int) -> None:
            answers[i] = _call(gateway, sid, "rs_echo", {"text": str(i)}, request_id=i)

        threads = [threading.Thread(target=call, args=(i,)) for i in range(6)]
        for thread in threads:
            thread.start()
        try:
            backend.wait_for("tools/call", count=1 + 6, timeout=WAIT)
        finally:
            backend.hang = False
        for thread in threads:
            thread.join(timeout=WAIT)
        assert {i: _text(answers[i]) for i in range(6)} == {i: f"restartable:{i}" for i in range(6)}
        assert backend.initialize_count == 2


# -- 5. per-backend timeouts ----------------------------------------------------------------


def test_per_backend_timeout_is_a_clean_error_and_spares_the_others(start_gateway):
    with sdk_backend("slow", tools=("echo", "sleep")) as slow, sdk_backend("fast", tools=("echo",)) as fast:
        gateway = start_gateway(
            {
                "name": "t",
                "backends": [backend_entry("slow", slow), backend_entry("fast", fast)],
                "operational": {"timeouts": {"default": "30s", "perWorkload": {"slow": "500ms"}}},
            }
        )
        sid = gateway.initialize()
        assert "slow_sleep" in _tool_names(gateway, sid)

        started = time.monotonic()
        response = gateway.post(
            {"jsonrpc": "2.0", "id": 42, "method": "tools/call", "params": {"name": "slow_sleep", "arguments": {"seconds": 60}}},
            sid,
        )
        elapsed = time.monotonic() - started
        answer = answer_of(response)
        # The slow backend's 500 ms, not the 30 s default (nor the 60 s sleep).
        assert 0.5 <= elapsed < 15, elapsed
        assert answer["id"] == 42
        assert answer["error"]["code"] == -32001, answer
        message = answer["error"]["message"]
        assert "slow" in message
        body = json.dumps(answer)
        for leak in ("127.0.0.1", "http", str(slow.port), "localhost"):
            assert leak not in body, (leak, body)

        assert _text(_call(gateway, sid, "fast_echo", {"text": "x"})) == "fast:x"
        assert _text(_call(gateway, sid, "slow_echo", {"text": "y"})) == "slow:y"


# -- 6. / 7. unreachable backends -----------------------------------------------------------


def test_unreachable_backend_is_skipped_with_a_warning(start_gateway, monkeypatch, caplog):
    caplog.set_level(logging.WARNING, logger="vmcp_actors")
    monkeypatch.setenv(ADMIN_ENV, ADMIN_TOKEN)
    down_url = closed_port_url()
    with sdk_backend("alpha") as alpha:
        gateway = start_gateway(
            {
                "name": "t",
                "backends": [{"name": "down", "url": down_url}, backend_entry("alpha", alpha)],
                "admin": {"tokenEnv": ADMIN_ENV},
            }
        )
        sid = gateway.initialize()
        names = _tool_names(gateway, sid)
        assert names and all(name.startswith("alpha_") for name in names)
        assert _text(_call(gateway, sid, "alpha_echo", {"text": "up"})) == "alpha:up"

        warnings = [r.getMessage() for r in caplog.records
                    if r.levelno == logging.WARNING and r.name.startswith("vmcp_actors")]
        assert any("down" in w for w in warnings), warnings

        states = _backend_states(gateway)
        assert states["down"]["state"] == "failed"
        assert states["down"]["lastError"]
        assert down_url not in json.dumps(states)


def test_every_backend_down_is_a_clean_503(start_gateway):
    urls = [closed_port_url(), closed_port_url()]
    gateway = start_gateway({"name": "t", "backends": [{"name": "one", "url": urls[0]}, {"name": "two", "url": urls[1]}]})
    sid = gateway.initialize()
    response = gateway.post({"jsonrpc": "2.0", "id": 9, "method": "tools/list"}, sid)
    assert response.status_code == 503
    assert response.headers["Content-Type"].startswith("application/json")
    answer = response.json()
    assert answer["jsonrpc"] == "2.0" and answer["id"] == 9
    assert isinstance(answer["error"]["code"], int) and answer["error"]["message"]
    text = response.text
    assert "127.0.0.1" not in text and "http" not in text.lower()
    for url in urls:
        port = url.rsplit(":", 1)[1].split("/")[0]
        assert port not in text


def test_a_session_recovers_once_a_backend_answers_again(start_gateway):
    """A session whose every backend failed discovery tries again on the next request."""
    with erroring_lists_backend(methods=("tools/list",)) as flaky:
        gateway = start_gateway({"name": "t", "backends": [backend_entry("flaky", flaky)]})
        sid = gateway.initialize()
        response = gateway.post({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, sid)
        assert response.status_code == 503

        flaky.handlers["tools/list"] = static_result({"tools": [tool_def("echo", text="string")]})
        flaky.handlers["tools/call"] = lambda call: text_result("back")
        assert _tool_names(gateway, sid) == ["flaky_echo"]
        assert _text(_call(gateway, sid, "flaky_echo", {"text": "x"})) == "back"


# -- 8. unique request ids towards the backend ---------------------------------------------


def test_concurrent_calls_reusing_a_client_id_get_unique_backend_ids(start_gateway):
    with delayed_backend(delay=0.0) as backend:
        gateway = start_gateway({"name": "t", "backends": [backend_entry("d", backend)]})
        sid = gateway.initialize()
        assert "d_sleep" in _tool_names(gateway, sid)
        backend.hang = True  # held until all ten are in: in flight together

        answers: dict[int, requests.Response] = {}

        def call(i: int) -> None:
            answers[i] = gateway.post(
                {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "d_echo", "arguments": {"text": f"n{i}"}}},
                sid,
            )

        threads = [threading.Thread(target=call, args=(i,)) for i in range(10)]
        for thread in threads:
            thread.start()
        try:
            backend.wait_for("tools/call", count=10, timeout=WAIT)
        finally:
            backend.hang = False
        for thread in threads:
            thread.join(timeout=WAIT)

        for i in range(10):
            answer = answer_of(answers[i])
            assert answer["id"] == 1, answer
            assert _text(answer) == f"delayed:n{i}"
        calls = backend.requests("tools/call")
        assert len(calls) == 10
        assert len({json.dumps(c.id) for c in calls}) == 10
        # and unique across everything the gateway sent on that backend session
        all_ids = [json.dumps(m.id) for m in backend.received if m.is_request and m.method != "initialize"]
        assert len(all_ids) == len(set(all_ids))


# -- 9. names, arguments and results pass through unchanged --------------------------------


RICH_RESULT = {
    "content": [
        {"type": "text", "text": "héllo \u2603"},
        {"type": "image", "data": "aGVsbG8=", "mimeType": "image/png"},
        {"type": "resource_link", "uri": "test://x/y", "name": "y"},
    ],
    "structuredContent": {"n": 1, "nested": {"list": [1, 2.5, None, True], "s": "x"}},
    "isError": True,
    "_meta": {"vendor/key": "value"},
}


def test_original_name_arguments_and_result_pass_through(start_gateway):
    handlers = {
        "tools/list": static_result({"tools": [tool_def("do_it", "Does it", a="string", b="object")]}),
        "tools/call": static_result(RICH_RESULT),
    }
    raw = RawMcpBackend("raw", handlers).start()
    with raw:
        gateway = start_gateway({"name": "t", "backends": [backend_entry("raw", raw)]})
        sid = gateway.initialize()
        arguments = {"a": "x\u00e9", "b": {"deep": [1, {"k": None}], "flag": False}, "n": 3.25}
        answer = _call(gateway, sid, "raw_do_it", arguments, request_id="req-1")
        assert answer["id"] == "req-1"
        assert answer["result"] == RICH_RESULT

        (received,) = raw.requests("tools/call")
        assert received.params["name"] == "do_it"
        assert received.params["arguments"] == arguments


def test_sdk_structured_and_failing_results_come_back_unchanged(start_gateway):
    with sdk_backend("alpha", tools=("structured", "fail")) as alpha:
        gateway = start_gateway({"name": "t", "backends": [backend_entry("alpha", alpha)]})
        sid = gateway.initialize()
        structured = _call(gateway, sid, "alpha_structured")["result"]
        assert structured["structuredContent"] == {"backend": "alpha", "ok": True, "items": [1, 2, 3]}
        assert not structured.get("isError")
        failing = _call(gateway, sid, "alpha_fail")
        assert "error" not in failing
        assert failing["result"]["isError"] is True
        assert "alpha failed on purpose" in failing["result"]["content"][0]["text"]

        # the same through the official SDK client
        async def work(client):
            return await client.call_tool("alpha_structured", {}), await client.call_tool("alpha_fail", {})

        ok, bad = run_client(gateway.url, work)
        assert ok.structured_content == {"backend": "alpha", "ok": True, "items": [1, 2, 3]}
        assert bad.is_error is True


# -- 10. SSE relay -------------------------------------------------------------------------


def test_streamed_notifications_are_relayed_as_sse_in_order(start_gateway):
    with sse_backend() as backend:
        gateway = start_gateway({"name": "t", "backends": [backend_entry("sse", backend)]})
        sid = gateway.initialize()
        response = gateway.post(
            {"jsonrpc": "2.0", "id": 77, "method": "tools/call",
             "params": {"name": "sse_echo", "arguments": {"text": "hi"}, "_meta": {"progressToken": "tok-1"}}},
            sid,
        )
        assert response.status_code == 200
        assert response.headers["Content-Type"].startswith("text/event-stream")
        messages = sse_messages(response)
        assert [m.get("method") for m in messages] == [
            "notifications/progress", "notifications/progress", "notifications/message", None
        ]
        assert [m["params"]["progressToken"] for m in messages[:2]] == ["tok-1", "tok-1"]
        assert [m["params"]["progress"] for m in messages[:2]] == [1, 2]
        assert messages[2]["params"]["logger"] == "sse"
        final = messages[-1]
        assert final["id"] == 77 and final["result"]["content"][0]["text"] == "sse:hi"

        # the backend got the client's progress token unchanged
        (call,) = backend.requests("tools/call")
        assert call.params["_meta"] == {"progressToken": "tok-1"}


def test_sdk_client_receives_relayed_progress(start_gateway):
    with sse_backend() as backend:
        gateway = start_gateway({"name": "t", "backends": [backend_entry("sse", backend)]})
        progress: list[tuple] = []

        async def on_progress(value, total, message):
            progress.append((value, total, message))

        async def work(client):
            return await client.call_tool("sse_echo", {"text": "sdk"}, progress_callback=on_progress)

        result = run_client(gateway.url, work)
        assert result.content[0].text == "sse:sdk"
        assert progress == [(1, 2, "step 1/2"), (2, 2, "step 2/2")]


def test_sdk_backend_progress_reaches_the_sdk_client(start_gateway):
    with sdk_backend("alpha", tools=("progress",)) as alpha:
        gateway = start_gateway({"name": "t", "backends": [backend_entry("alpha", alpha)]})
        progress: list[float] = []

        async def on_progress(value, total, message):
            progress.append(value)

        async def work(client):
            return await client.call_tool("alpha_progress", {"steps": 3}, progress_callback=on_progress)

        result = run_client(gateway.url, work)
        assert result.content[0].text == "done"
        assert progress == [1, 2, 3]


def test_plain_json_answers_stay_json(start_gateway):
    with restartable_backend("plain") as raw, sdk_backend("alpha", tools=("echo",)) as alpha:
        gateway = start_gateway({"name": "t", "backends": [backend_entry("raw", raw), backend_entry("alpha", alpha)]})
        sid = gateway.initialize()
        for name, expected in (("raw_echo", "plain:j"), ("alpha_echo", "alpha:j")):
            response = gateway.post(
                {"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {"name": name, "arguments": {"text": "j"}}},
                sid,
            )
            assert response.headers["Content-Type"].startswith("application/json"), name
            assert response.json()["id"] == 5
            assert _text(response.json()) == expected


# -- 11. / 12. laziness ----------------------------------------------------------------------


def test_opening_a_session_contacts_no_backend(start_gateway):
    with restartable_backend() as backend:
        gateway = start_gateway({"name": "t", "backends": [backend_entry("rs", backend)]})
        assert backend.received == []
        sid = gateway.initialize()
        assert gateway.rpc(sid, "ping") == {"jsonrpc": "2.0", "id": 1, "result": {}}
        time.sleep(0.2)  # the absence under test: a contact the session set off would come within this
        assert backend.received == []
        assert backend.initialize_count == 0

        assert _tool_names(gateway, sid) == ["rs_echo", "rs_sleep"]
        # A 2025 client session's backend session is a 2025 one where the backend can: initialize first.
        assert backend.methods()[:3] == ["initialize", "notifications/initialized", "tools/list"]


def test_process_starts_with_every_backend_down(start_gateway):
    gateway = start_gateway(
        {"name": "t", "backends": [{"name": "one", "url": closed_port_url()}, {"name": "two", "url": closed_port_url()}]}
    )
    response = requests.get(gateway.base + "/readyz", timeout=10)
    assert response.status_code == 200
    assert requests.get(gateway.base + "/healthz", timeout=10).status_code == 200
    # and a session can still be opened
    assert gateway.initialize()


def test_the_admin_pages_problems_show_a_warning_without_the_backends_url(start_gateway):
    # The log keeps the display URL (above); the page's recent problems, read by anyone
    # with the admin token, never show a backend's URL, whichever test logged before.
    from vmcp_actors.runtime import recent_problems

    with method_not_found_backend() as mnf:
        gateway = start_gateway({"name": "t", "backends": [{"name": "mnf", "url": mnf.mcp_url}]})
        assert _tool_names(gateway, gateway.initialize()) == ["mnf_still_here"]
    shown = [problem.message for problem in recent_problems() if "'mnf' at" in problem.message]
    assert shown and all(f"127.0.0.1:{mnf.port}" not in message and "<url>" in message for message in shown), shown
