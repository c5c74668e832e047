"""Code mode (issue 39) with real parts: ``execute_tool_script``, ``search_tools`` and
``get_tool_schema`` over official-SDK backends and the real stdio servers (server-memory from
npm, mcp-server-time from PyPI), driven by the SDK client in both modes and by raw HTTP in
both revisions: what each listing lists, scripts' fan-out, results and errors, one session's
results never in another's, 2026-07-28 tasks after ``taskAfter`` and 2025-11-25 tasks at
once, progress naming the inner call, and cancellation (of a task, of an inline call) reaching
the backend's call.

The SDK backend's ``hold(label)`` waits until the test releases its label and records when
it started and whether it was cancelled, so a test waits for those events, never for time.
"""

import asyncio
import json
import threading
from datetime import datetime
from typing import Any

import pytest
import requests

from tests.backends import sdk_backend
from tests.gateway import backend_entry, run_client, wait_until
from tests.stdio_servers import memory_server, need_stdio_servers, time_server
from tests.task_backends import client_capabilities, modern_rpc, poll_task

pytestmark = [pytest.mark.timeout(120), pytest.mark.filterwarnings("ignore::DeprecationWarning")]

SCRIPT_TOOLS = ["execute_tool_script", "search_tools", "get_tool_schema"]
PLAIN_TOOLS = ["plain_echo", "plain_sleep", "plain_fail", "plain_structured", "plain_hold", "plain_meet"]
ADMIN_ENV, ADMIN_TOKEN = "CODE_MODE_ADMIN_TOKEN", "code-mode-adm1n-token-Zx8"
SCRIPT_META = "vmcp-actors/script"
CLOCK_SLACK = 120  # seconds two get_current_time answers may be apart

# -- the backend's hold and meet tools: events a test waits for ----------------------------

_flags_lock = threading.Lock()
_flags: dict[tuple[str, str], threading.Event] = {}
_met: dict[str, list[str]] = {}


def flag(kind: str, label: str) -> threading.Event:
    """The event ``kind`` (started, released, cancelled) of the hold call labelled ``label``."""
    with _flags_lock:
        return _flags.setdefault((kind, label), threading.Event())


async def hold(label: str, seconds: float = 30.0) -> str:
    """Wait until the test releases the label (at most `seconds`), then answer 'released'."""
    import anyio

    flag("started", label).set()
    released = flag("released", label)
    try:
        for _ in range(int(seconds * 100)):
            if released.is_set():
                return "released"
            await anyio.sleep(0.01)
    except anyio.get_cancelled_exc_class():
        flag("cancelled", label).set()
        raise
    return "not released"


async def meet(group: str, who: str, count: int) -> str:
    """Wait until `count` callers have come to `group` (at most 10 s); answer who came."""
    import anyio
    from mcp.server.mcpserver.exceptions import ToolError

    with _flags_lock:
        _met.setdefault(group, []).append(who)
    for _ in range(1000):
        with _flags_lock:
            here = len(_met[group])
        if here >= count:
            return f"{who} met"
        await anyio.sleep(0.01)
    raise ToolError(f"{who} waited alone in {group}")


# -- fixtures and helpers ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def plain():
    served = sdk_backend("plain", ["echo", "sleep", "fail", "structured"], extra_tools=[hold, meet])
    yield served
    served.stop()


@pytest.fixture(scope="module")
def second():
    served = sdk_backend("second", ["whoami"])
    yield served
    served.stop()


@pytest.fixture
def gateway(start_gateway, monkeypatch, plain, second):
    """Factory: a gateway over both SDK backends with code mode on and the admin token set;
    ``codeMode`` fields as keywords, other top-level sections in ``sections``."""
    monkeypatch.setenv(ADMIN_ENV, ADMIN_TOKEN)

    def start(sections: dict | None = None, **code_mode):
        return start_gateway({"name": "code-mode", "admin": {"tokenEnv": ADMIN_ENV},
                              "backends": [backend_entry("plain", plain), backend_entry("second", second)],
                              "codeMode": {"enabled": True, **code_mode}, **(sections or {})})
    return start


def admin_scripts(gateway) -> list[dict]:
    response = requests.get(gateway.base + "/admin/state", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
                            timeout=10)
    assert response.status_code == 200, response.text
    return response.json()["scripts"]


def script_args(script: str, data: dict | None = None) -> dict:
    """execute_tool_script's arguments."""
    return {"script": script} if data is None else {"script": script, "data": data}


def script_call(script: str, data: dict | None = None) -> dict:
    """A raw tools/call's params for execute_tool_script."""
    return {"name": "execute_tool_script", "arguments": script_args(script, data)}


def listed(url: str, mode: str = "legacy") -> list[str]:
    async def work(client):
        return [tool.name for tool in (await client.list_tools()).tools]
    return run_client(url, work, mode=mode)


def call(url: str, tool: str, arguments: dict, mode: str = "legacy") -> Any:
    async def work(client):
        return await client.call_tool(tool, arguments)
    return run_client(url, work, mode=mode)


def text_of(result: Any) -> str:
    return "\n".join(block.text for block in result.content if block.type == "text")


class SseCall:
    """A 2025-11-25 tools/call whose SSE answer is read message by message on a thread of
    its own (``done`` once the stream ends)."""

    def __init__(self, gateway, session_id: str, params: dict, request_id: Any = 1,
                 progress_token: str | None = None):
        self.events: list[dict] = []
        self.done = threading.Event()
        if progress_token is not None:
            params = {**params, "_meta": {"progressToken": progress_token}}
        message = {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}
        # The headers come with the first event (JSON or SSE is decided then): post on the thread.
        threading.Thread(target=self._read, args=(gateway, session_id, message), daemon=True).start()

    def _read(self, gateway, session_id: str, message: dict) -> None:
        from vmcp_actors.protocol.sse import iter_sse_events

        try:
            with gateway.post(message, session_id, stream=True) as response:
                if response.headers.get("Content-Type", "").startswith("application/json"):
                    self.events.append(response.json())
                    return
                for event in iter_sse_events(response.iter_lines()):
                    if event.data.strip():  # not the priming event
                        self.events.append(json.loads(event.data))
        finally:
            self.done.set()

    def wait_for(self, matches) -> dict:
        found = wait_until(lambda: next((event for event in list(self.events) if matches(event)), None), 10)
        assert found, self.events
        return found

    def answer(self) -> dict:
        assert self.done.wait(20), self.events
        return self.events[-1]


def status_reading(url: str, handle: str, message: str) -> dict:
    """The 2026-07-28 task once its statusMessage reads ``message`` (else the last one read)."""
    seen: list[dict] = []

    def reads() -> bool:
        answer = modern_rpc(url, "tasks/get", {"taskId": handle})
        assert "result" in answer, answer
        seen.append(answer["result"])
        return seen[-1]["statusMessage"] == message

    wait_until(reads, timeout=10)
    assert seen[-1]["statusMessage"] == message, seen[-1]
    return seen[-1]


def running_scripts(gateway) -> list[list[str]]:
    """The tools each script of the admin state is calling, once one is (else [])."""
    return wait_until(lambda: [row["running"] for row in admin_scripts(gateway) if row["running"]], timeout=10)


def held(label: str) -> str:
    """A script that holds the backend's call labelled ``label`` and returns its answer."""
    return f"answer = await call_tool('plain_hold', {{'label': '{label}'}})\n{{'held': answer}}"


# -- 1. the listing ------------------------------------------------------------------------------


def test_listing_scripts_lists_exactly_the_script_tool_and_its_helpers(gateway):
    url = gateway().url
    assert listed(url) == SCRIPT_TOOLS
    assert listed(url, mode="auto") == SCRIPT_TOOLS


def test_listing_all_lists_every_backend_tool_beside_the_three(gateway):
    names = listed(gateway(listing="all").url)
    assert sorted(names) == sorted(PLAIN_TOOLS + ["second_whoami"] + SCRIPT_TOOLS)
    assert names[-3:] == SCRIPT_TOOLS  # code mode's own after the tools below it


def test_with_the_optimizer_the_script_tool_joins_find_tool_and_call_tool(gateway):
    url = gateway({"optimizer": {}}).url
    assert sorted(listed(url)) == ["call_tool", "execute_tool_script", "find_tool"]
    # a script's calls go under the optimizer: the backend's tools by their own names
    result = call(url, "execute_tool_script", script_args("await call_tool('plain_echo', {'text': 'opt'})"))
    assert not result.is_error, text_of(result)
    assert result.structured_content == {"result": "plain:opt"}


# -- 2. scripts over real servers -------------------------------------------------------------------


FAN_OUT = """
import asyncio
echoes = await asyncio.gather(*[call_tool('plain_echo', {'text': str(i)}) for i in range(12)])
met = await asyncio.gather(*[call_tool('plain_meet', {'group': data['group'], 'who': w, 'count': 3})
                             for w in ('a', 'b', 'c')])
shape = await call_tool('plain_structured', {})
{'echoes': [e['result'] for e in echoes], 'met': [m['result'] for m in met], 'shape': shape, 'data': data}
"""


def test_a_script_fans_out_in_order_and_returns_structured_content_as_a_dict(gateway):
    url = gateway().url
    result = call(url, "execute_tool_script", script_args(FAN_OUT, {"group": "fan-out"}))
    assert not result.is_error, text_of(result)
    assert result.structured_content == {
        "echoes": [f"plain:{i}" for i in range(12)],  # 12 calls, 8 at a time: in the script's order
        "met": ["a met", "b met", "c met"],  # the three meet calls were under way at once
        "shape": {"backend": "plain", "ok": True, "items": [1, 2, 3]},  # structuredContent, a dict
        "data": {"group": "fan-out"},
    }
    assert json.loads(result.content[0].text) == result.structured_content
    assert set(result.meta[SCRIPT_META]) == {"id"} and len(result.meta[SCRIPT_META]["id"]) == 12


CAUGHT = """
try:
    await call_tool('plain_fail', {})
    outcome = 'no error'
except RuntimeError as error:
    outcome = str(error)
{'caught': outcome, 'after': await call_tool('plain_echo', {'text': 'still here'})}
"""


def test_a_tool_error_raises_in_the_script_and_an_uncaught_one_is_the_calls_error(gateway):
    url = gateway().url
    caught = call(url, "execute_tool_script", script_args(CAUGHT))
    assert not caught.is_error, text_of(caught)
    assert caught.structured_content["caught"].startswith("plain_fail failed: ")
    assert "plain failed on purpose" in caught.structured_content["caught"]
    assert caught.structured_content["after"] == {"result": "plain:still here"}

    uncaught = call(url, "execute_tool_script", script_args("x = 1\nawait call_tool('plain_fail', {})\n'unreached'"))
    assert uncaught.is_error is True and uncaught.structured_content is None
    assert "RuntimeError: plain_fail failed:" in text_of(uncaught) and "plain failed on purpose" in text_of(uncaught)
    assert "unreached" not in text_of(uncaught)

    unknown = call(url, "execute_tool_script", script_args("await call_tool('plain_nothing', {})"))
    assert unknown.is_error is True and "Unknown tool: plain_nothing" in text_of(unknown)


MEMORY_SCRIPT = """
created = await call_tool('memory_create_entities', {'entities': data['entities']})
{'created': created, 'graph': await call_tool('memory_read_graph', {}),
 'found': await call_tool('memory_search_nodes', {'query': 'beans'})}
"""
TIME_SCRIPT = """
import asyncio
oslo, tokyo = await asyncio.gather(call_tool('time_get_current_time', {'timezone': 'Europe/Oslo'}),
                                   call_tool('time_get_current_time', {'timezone': 'Asia/Tokyo'}))
converted = await call_tool('time_convert_time', data['conversion'])
{'oslo': oslo, 'tokyo': tokyo, 'converted': converted}
"""
ENTITIES = [{"name": "garden", "entityType": "place", "observations": ["grows beans"]},
            {"name": "notebook", "entityType": "thing", "observations": ["lists seeds"]}]
CONVERSION = {"source_timezone": "Europe/Oslo", "time": "12:30", "target_timezone": "Asia/Tokyo"}


def masked(now: dict) -> dict:
    """get_current_time's answer without what moves between two calls."""
    return {key: value for key, value in now.items() if key not in ("datetime", "day_of_week")}


def test_scripts_over_server_memory_and_mcp_server_time_answer_as_direct_calls(start_gateway, tmp_path):
    need_stdio_servers()
    node, args = memory_server()
    url = start_gateway({"name": "code-mode", "codeMode": {"enabled": True, "listing": "all"}, "backends": [
        {"name": "memory", "transport": "stdio", "command": node, "args": args, "scope": "shared",
         "env": {"MEMORY_FILE_PATH": str(tmp_path / "memory.json")}},
        {"name": "time", "transport": "stdio", "command": time_server(), "args": [], "env": {}, "scope": "shared"},
    ]}).url

    async def work(client):
        memory = await client.call_tool("execute_tool_script", script_args(MEMORY_SCRIPT, {"entities": ENTITIES}))
        times = await client.call_tool("execute_tool_script", script_args(TIME_SCRIPT, {"conversion": CONVERSION}))
        direct = {name: (await client.call_tool(tool, arguments)).structured_content for name, tool, arguments in (
            ("graph", "memory_read_graph", {}), ("found", "memory_search_nodes", {"query": "beans"}),
            ("oslo", "time_get_current_time", {"timezone": "Europe/Oslo"}),
            ("tokyo", "time_get_current_time", {"timezone": "Asia/Tokyo"}),
            ("converted", "time_convert_time", CONVERSION))}
        return memory, times, direct

    memory, times, direct = run_client(url, work)
    assert not memory.is_error and not times.is_error, (text_of(memory), text_of(times))
    scripted = memory.structured_content
    assert scripted["created"] == {"entities": ENTITIES}
    assert scripted["graph"] == direct["graph"] == {"entities": ENTITIES, "relations": []}
    assert scripted["found"] == direct["found"] == {"entities": ENTITIES[:1], "relations": []}

    scripted = times.structured_content
    assert scripted["converted"] == direct["converted"]  # fixed arguments: field for field
    assert scripted["converted"]["time_difference"] == "+8.0h"
    for zone, name in (("oslo", "Europe/Oslo"), ("tokyo", "Asia/Tokyo")):
        assert masked(scripted[zone]) == masked(direct[zone]) and scripted[zone]["timezone"] == name
        assert scripted[zone].keys() == direct[zone].keys() == {"timezone", "datetime", "day_of_week", "is_dst"}
        apart = datetime.fromisoformat(direct[zone]["datetime"]) - datetime.fromisoformat(scripted[zone]["datetime"])
        assert 0 <= apart.total_seconds() < CLOCK_SLACK
        assert datetime.fromisoformat(scripted[zone]["datetime"]).utcoffset() == \
            datetime.fromisoformat(direct[zone]["datetime"]).utcoffset()


# -- 3. clients ----------------------------------------------------------------------------------------


MIXED = """
import asyncio
texts = await asyncio.gather(*[call_tool('plain_echo', {'text': t}) for t in data['texts']])
{'texts': [t['result'] for t in texts], 'who': await call_tool('second_whoami', {}),
 'shape': await call_tool('plain_structured', {}), 'count': len(texts)}
"""


def test_both_client_modes_get_the_same_script_result(gateway):
    url = gateway().url
    arguments = script_args(MIXED, {"texts": ["x", "y", "z"]})
    legacy, modern = (call(url, "execute_tool_script", arguments, mode=mode) for mode in ("legacy", "auto"))
    for result in (legacy, modern):
        assert not result.is_error, text_of(result)
        assert result.meta[SCRIPT_META]["id"]
    assert legacy.structured_content == modern.structured_content == {
        "texts": ["plain:x", "plain:y", "plain:z"], "who": {"result": "second"},
        "shape": {"backend": "plain", "ok": True, "items": [1, 2, 3]}, "count": 3}
    assert [block.model_dump() for block in legacy.content] == [block.model_dump() for block in modern.content]
    assert legacy.meta[SCRIPT_META]["id"] != modern.meta[SCRIPT_META]["id"]  # two runs


TAGGED = """
import asyncio
first = await asyncio.gather(*[call_tool('plain_echo', {'text': data['tag'] + str(i)}) for i in range(6)])
met = await call_tool('plain_meet', {'group': data['group'], 'who': data['tag'], 'count': 2})
then = await asyncio.gather(*[call_tool('plain_echo', {'text': data['tag'] + str(i)}) for i in range(6, 10)])
{'tag': data['tag'], 'echoes': [e['result'] for e in first + then], 'met': met['result']}
"""


def test_two_sessions_running_scripts_at_once_each_get_only_their_own_results(gateway):
    import mcp

    url = gateway().url

    async def one(tag: str) -> Any:
        async with mcp.Client(url, mode="legacy") as client:
            return await client.call_tool("execute_tool_script", script_args(TAGGED, {"tag": tag, "group": "pair"}))

    async def both() -> list[Any]:
        return await asyncio.gather(one("left-"), one("right-"))

    results = asyncio.run(both())
    for result, tag in zip(results, ("left-", "right-")):
        assert not result.is_error, text_of(result)
        # meet answers only once both scripts were waiting in it: the two ran at the same time
        assert result.structured_content == {"tag": tag, "echoes": [f"plain:{tag}{i}" for i in range(10)],
                                             "met": f"{tag} met"}


# -- 4. the helpers ---------------------------------------------------------------------------------


def test_search_tools_finds_the_right_tool_and_get_tool_schema_reads_their_schemas(gateway):
    url = gateway(listing="all").url

    async def work(client):
        searches = {query: (await client.call_tool("search_tools", {"query": query})).structured_content["tools"]
                    for query in ("always fails", "structured output", "sleep then answer slept")}
        one = (await client.call_tool("search_tools", {"query": "backend name", "limit": 1})).structured_content
        schemas = await client.call_tool("get_tool_schema", {"names": ["plain_echo", "second_whoami", "plain_nope"]})
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
        return searches, one, schemas, tools

    searches, one, schemas, tools = run_client(url, work)
    assert searches["always fails"][0] == {"name": "plain_fail", "description": "Always fails (isError: true)."}
    assert searches["structured output"][0]["name"] == "plain_structured"
    assert searches["sleep then answer slept"][0]["name"] == "plain_sleep"
    assert all(found["name"] not in SCRIPT_TOOLS for hits in searches.values() for found in hits)
    assert len(one["tools"]) == 1
    assert not schemas.is_error
    answer = schemas.structured_content
    assert [tool["name"] for tool in answer["tools"]] == ["plain_echo", "second_whoami"]
    assert answer["unknown"] == ["plain_nope"]
    for tool in answer["tools"]:
        assert tool["inputSchema"] == tools[tool["name"]].input_schema  # what the listing says
        assert tool["description"] == tools[tool["name"]].description
    assert answer["tools"][0]["inputSchema"]["properties"]["text"]["type"] == "string"
    assert answer["tools"][0]["inputSchema"]["required"] == ["text"]


def test_code_mode_tools_bounds_what_scripts_find_and_call(gateway):
    url = gateway(tools=["plain_*"]).url

    async def work(client):
        found = await client.call_tool("search_tools", {"query": "the backend's name", "limit": 50})
        schemas = await client.call_tool("get_tool_schema", {"names": ["second_whoami", "plain_echo"]})
        script = await client.call_tool("execute_tool_script", script_args("await call_tool('second_whoami', {})"))
        return found, schemas, script

    found, schemas, script = run_client(url, work)
    names = [tool["name"] for tool in found.structured_content["tools"]]
    assert names and "second_whoami" not in names and all(name.startswith("plain_") for name in names)
    assert schemas.structured_content["unknown"] == ["second_whoami"]
    assert [tool["name"] for tool in schemas.structured_content["tools"]] == ["plain_echo"]
    assert script.is_error is True and "Unknown tool: second_whoami" in text_of(script)


# -- 5. tasks ----------------------------------------------------------------------------------------


def test_a_quick_2026_script_answers_directly_and_a_held_one_becomes_a_task(gateway):
    # taskAfter well past a quick script's time on a loaded machine (one of 200 ms went over
    # under load 8); the held one cannot end before its release, so it is a task all the same.
    url = gateway(taskAfter="3s").url
    quick = modern_rpc(url, "tools/call", script_call("await call_tool('plain_echo', {'text': 'now'})"))
    assert quick["result"]["resultType"] == "complete" and "taskId" not in quick["result"]
    assert quick["result"]["structuredContent"] == {"result": "plain:now"}  # the tool's own structured answer

    created = modern_rpc(url, "tools/call", script_call(held("task-1")))
    assert created["result"]["resultType"] == "task", created  # the held call cannot end before the release
    handle = created["result"]["taskId"]
    assert flag("started", "task-1").wait(10)
    working = status_reading(url, handle, "calling plain_hold (0 of 1 tool calls done)")
    assert working["status"] == "working", working

    flag("released", "task-1").set()
    done = poll_task(url, handle, "completed", timeout=10)
    assert done["status"] == "completed", done
    assert done["result"]["structuredContent"] == {"held": {"result": "released"}}
    assert done["result"]["isError"] is False


def test_a_2026_client_without_tasks_waits_for_the_answer(gateway):
    url = gateway(taskAfter="200ms").url
    releaser = threading.Thread(target=lambda: flag("started", "no-task").wait(10)
                                and flag("released", "no-task").set(), daemon=True)
    releaser.start()  # lets the call go once the backend holds it
    answer = modern_rpc(url, "tools/call", script_call(held("no-task")), capabilities=client_capabilities(tasks=False))
    releaser.join(10)
    assert answer["result"]["resultType"] == "complete" and "taskId" not in answer["result"], answer
    assert answer["result"]["structuredContent"] == {"held": {"result": "released"}}


def test_cancelling_a_2026_script_task_cancels_its_backend_call(gateway):
    served = gateway(taskAfter="200ms")
    created = modern_rpc(served.url, "tools/call", script_call(held("task-cancel")))
    assert created["result"]["resultType"] == "task", created
    handle = created["result"]["taskId"]
    assert flag("started", "task-cancel").wait(10)
    assert running_scripts(served) == [["plain_hold"]]
    (row,) = admin_scripts(served)
    assert row["toolCalls"] == 1 and row["user"] == "anonymous" and "script" in row

    assert modern_rpc(served.url, "tasks/cancel", {"taskId": handle})["result"]["resultType"] == "complete"
    assert flag("cancelled", "task-cancel").wait(10)  # the backend's call was cancelled, not left to run
    assert poll_task(served.url, handle, "cancelled", timeout=10)["status"] == "cancelled"
    assert wait_until(lambda: admin_scripts(served) == [], timeout=10)


def test_a_2025_client_asking_for_a_task_gets_one_at_once_and_tasks_result_gives_the_script_result(gateway):
    served = gateway()  # taskAfter 2 s: a 2025 task comes at once all the same
    session = served.initialize()
    created = served.rpc(session, "tools/call", {**script_call(held("legacy-task")), "task": {"ttl": 60000}})
    task = created["result"]["task"]  # at once: the held call cannot end before the release
    assert task["status"] == "working" and task["ttl"] == 60000
    assert flag("started", "legacy-task").wait(10)
    assert wait_until(lambda: served.rpc(session, "tasks/get", {"taskId": task["taskId"]})["result"]["statusMessage"]
                      == "calling plain_hold (0 of 1 tool calls done)", timeout=10)

    flag("released", "legacy-task").set()
    result = served.rpc(session, "tasks/result", {"taskId": task["taskId"]})["result"]  # waits for the end
    assert result["structuredContent"] == {"held": {"result": "released"}} and result["isError"] is False
    assert result["_meta"]["io.modelcontextprotocol/related-task"] == {"taskId": task["taskId"]}
    assert len(result["_meta"]["vmcp-actors/script"]["id"]) == 12  # the run's id, as an inline result names it
    assert served.rpc(session, "tasks/get", {"taskId": task["taskId"]})["result"]["status"] == "completed"


# -- 6. progress -----------------------------------------------------------------------------------------


def test_a_2025_call_with_a_progress_token_hears_which_inner_tool_is_running(gateway):
    served = gateway()
    session = served.initialize()
    script = "import asyncio\nawait asyncio.gather(call_tool('plain_echo', {'text': 'p'}), " \
             "call_tool('plain_hold', {'label': 'progress'}))"
    streamed = SseCall(served, session, script_call(script), request_id=7, progress_token="tok-1")
    naming = streamed.wait_for(lambda message: "calling plain_hold" in message.get("params", {}).get("message", ""))
    assert naming["method"] == "notifications/progress" and naming["params"]["progressToken"] == "tok-1"
    flag("released", "progress").set()
    answer = streamed.answer()
    assert answer["id"] == 7 and answer["result"]["structuredContent"] == {
        "result": [{"result": "plain:p"}, {"result": "released"}]}

    progress = [message["params"] for message in streamed.events if message.get("method") == "notifications/progress"]
    assert all(params["progressToken"] == "tok-1" for params in progress)
    values = [params["progress"] for params in progress]
    assert values == sorted(set(values)), values  # each notification's progress above the last (the spec's MUST)
    assert progress[-1]["message"] == "running (2 of 2 tool calls done)"


# -- 7. cancelling an inline call ---------------------------------------------------------------------------


def test_cancelling_an_inline_2025_script_call_stops_the_script_and_its_backend_call(gateway):
    served = gateway()
    session = served.initialize()
    streamed = SseCall(served, session, script_call(held("inline-cancel")), request_id="script-1")
    assert flag("started", "inline-cancel").wait(10)
    assert running_scripts(served) == [["plain_hold"]]

    cancelled = served.post({"jsonrpc": "2.0", "method": "notifications/cancelled",
                             "params": {"requestId": "script-1", "reason": "changed my mind"}}, session)
    assert cancelled.status_code == 202
    assert flag("cancelled", "inline-cancel").wait(10)  # the backend's call was cancelled
    assert wait_until(lambda: admin_scripts(served) == [], timeout=10)  # and the script stopped
    assert streamed.done.wait(10)
    assert all("id" not in message for message in streamed.events)  # no answer to a cancelled call
    assert served.rpc(session, "ping", request_id=2)["result"] == {}


def test_a_call_the_gateway_stops_waiting_for_is_cancelled_at_its_backend(gateway):
    """MCP: a sender that gives up at its timeout sends notifications/cancelled. A client's
    own call past the backend's timeout, and a script's call past toolCallTimeout, alike."""
    served = gateway({"operational": {"timeouts": {"default": "1s"}}}, toolCallTimeout="1s")
    session = served.initialize()

    def discovered() -> bool:  # the backends' handshakes have the same 1 s: a loaded machine may need another go
        schema = served.rpc(session, "tools/call", {"name": "get_tool_schema", "arguments": {"names": ["plain_hold"]}})
        return "plain_hold" in json.dumps(schema.get("result", {}).get("structuredContent", {}))

    assert wait_until(discovered, timeout=30, interval=0.2)
    direct = served.rpc(session, "tools/call", {"name": "plain_hold", "arguments": {"label": "timed-out-direct"}})
    assert direct["error"]["code"] == -32001
    assert flag("cancelled", "timed-out-direct").wait(10)  # not left running at the backend
    script = "try:\n    await call_tool('plain_hold', {'label': 'timed-out-inner'})\nexcept RuntimeError as e:\n    said = str(e)\nsaid"
    answer = served.rpc(session, "tools/call", {"name": "execute_tool_script", "arguments": script_args(script)})
    said = answer["result"]["content"][0]["text"]
    assert "(error -32001)" in said and said.endswith("(codeMode.toolCallTimeout: 1s)")
    assert flag("cancelled", "timed-out-inner").wait(10)
