"""Smoke tests for the test-suite backends in tests/backends.py (and the ASGI thread server)."""

import asyncio
import json
import threading
import time

import pytest
import requests

from tests.backends import (
    SHARED_README_URI,
    decode_cursor,
    delayed_backend,
    erroring_lists_backend,
    hanging_backend,
    method_not_found_backend,
    paged_backend,
    restartable_backend,
    sdk_backend,
    sse_backend,
)
from vmcp_actors.demo._serve import serve_asgi_in_thread  # noqa: E402

ACCEPT = "application/json, text/event-stream"
WAIT = 30.0  # for answers that take milliseconds: generous, so a loaded machine does not fail a test


# -- a tiny raw client ----------------------------------------------------------------


class RawClient:
    """Plain-requests MCP client: one session against a raw backend."""

    def __init__(self, backend, protocol_version="2025-06-18"):
        self.url = backend.mcp_url
        self.protocol_version = protocol_version
        self.session_id = None
        self.next_id = 1
        self.http = requests.Session()

    def post(self, payload, timeout=WAIT):
        headers = {"Accept": ACCEPT, "Content-Type": "application/json"}
        if self.session_id:
            headers["Mcp-Session-Id"] = self.session_id
            headers["MCP-Protocol-Version"] = self.protocol_version
        return self.http.post(self.url, data=json.dumps(payload), headers=headers, timeout=timeout)

    def initialize(self):
        response = self.request("initialize", {
            "protocolVersion": self.protocol_version,
            "capabilities": {},
            "clientInfo": {"name": "smoke", "version": "0"},
        })
        assert response.status_code == 200
        self.session_id = response.headers["Mcp-Session-Id"]
        assert self.notify("notifications/initialized").status_code == 202
        return response.json()["result"]

    def request(self, method, params=None, timeout=WAIT):
        payload = {"jsonrpc": "2.0", "id": self.next_id, "method": method}
        if params is not None:
            payload["params"] = params
        self.next_id += 1
        return self.post(payload, timeout=timeout)

    def result(self, method, params=None):
        response = self.request(method, params)
        assert response.status_code == 200, response.text
        body = response.json()
        assert "result" in body, body
        return body["result"]

    def notify(self, method, params=None):
        payload = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            payload["params"] = params
        return self.post(payload)

    def collect(self, method, key, params=None):
        """Follow nextCursor through every page; returns (items, pages)."""
        items, pages, cursor = [], 0, None
        while True:
            page_params = dict(params or {})
            if cursor is not None:
                page_params["cursor"] = cursor
            result = self.result(method, page_params or None)
            items.extend(result[key])
            pages += 1
            cursor = result.get("nextCursor")
            if cursor is None:
                return items, pages


@pytest.fixture
def started():
    """Call with a started backend; stops every one at teardown."""
    backends = []

    def track(backend):
        backends.append(backend)
        return backend

    yield track
    for backend in backends:
        backend.stop()


def run(coro):
    return asyncio.run(coro)


# -- ServedApp ----------------------------------------------------------------------


def test_served_app_serves_and_stops_idempotently():
    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"hi"})

    with serve_asgi_in_thread(app) as served:
        assert served.port > 0 and served.url == f"http://127.0.0.1:{served.port}"
        assert requests.get(served.url, timeout=WAIT).text == "hi"
    assert not served.running
    served.stop()  # idempotent
    with pytest.raises(requests.ConnectionError):
        requests.get(served.url, timeout=2)


# -- SDK backend -----------------------------------------------------------------------


def test_sdk_backend_via_official_client(started):
    import mcp
    from mcp.types import PromptReference

    backend = started(sdk_backend("alpha"))

    async def scenario():
        progress, logs = [], []

        async def on_log(params):
            logs.append(params)

        async with mcp.Client(backend.mcp_url, mode="legacy", logging_callback=on_log) as client:
            tools = {t.name for t in (await client.list_tools()).tools}
            assert tools == {"echo", "whoami", "sleep", "fail", "progress", "structured"}
            assert (await client.call_tool("echo", {"text": "hi"})).content[0].text == "alpha:hi"
            assert (await client.call_tool("whoami", {})).content[0].text == "alpha"
            assert (await client.call_tool("sleep", {"seconds": 0.01})).content[0].text == "slept"
            failed = await client.call_tool("fail", {})
            assert failed.is_error and "alpha failed on purpose" in failed.content[0].text
            structured = await client.call_tool("structured", {})
            assert structured.structured_content == {"backend": "alpha", "ok": True, "items": [1, 2, 3]}

            async def on_progress(value, total, message):
                progress.append((value, total, message))

            done = await client.call_tool("progress", {"steps": 3}, progress_callback=on_progress)
            assert done.content[0].text == "done"
            assert [p[0] for p in progress] == [1, 2, 3]
            assert len(logs) == 1 and "alpha progress finished" in str(logs[0].data)

            uris = {str(r.uri) for r in (await client.list_resources()).resources}
            assert uris == {"test://alpha/static", SHARED_README_URI}
            templates = [t.uri_template for t in (await client.list_resource_templates()).resource_templates]
            assert templates == ["test://alpha/items/{item}"]
            item = await client.read_resource("test://alpha/items/42")
            assert item.contents[0].text == "alpha item 42"
            assert (await client.read_resource(SHARED_README_URI)).contents[0].text.endswith("(served by alpha)")
            assert [p.name for p in (await client.list_prompts()).prompts] == ["greet"]
            greeting = await client.get_prompt("greet", {"who": "bob"})
            assert greeting.messages[0].content.text == "Hello bob, from alpha!"
            greet_ref = PromptReference(type="ref/prompt", name="greet")
            completion = await client.complete(greet_ref, {"name": "who", "value": "al"})
            assert completion.completion.values == ["alice", "albert"]

    run(scenario())


def test_sdk_backend_tool_subset_and_json_mode(started):
    import mcp

    backend = started(sdk_backend("beta", tools=["echo"], json_response=True))

    async def scenario():
        async with mcp.Client(backend.mcp_url, mode="legacy") as client:
            assert [t.name for t in (await client.list_tools()).tools] == ["echo"]
            assert (await client.call_tool("echo", {"text": "x"})).content[0].text == "beta:x"

    run(scenario())


# -- raw backends ---------------------------------------------------------------------


def test_raw_session_rules_and_recording(started):
    backend = started(restartable_backend())
    client = RawClient(backend, protocol_version="2025-03-26")
    init = client.initialize()
    assert init["protocolVersion"] == "2025-03-26"  # echoes the client's
    assert init["serverInfo"]["name"] == "restartable" and "tools" in init["capabilities"]
    assert client.result("ping") == {}
    assert client.result("tools/call", {"name": "echo", "arguments": {"text": "a"}})["content"][0]["text"] == (
        "restartable:a"
    )
    unknown = client.request("nope/nope").json()
    assert unknown["error"]["code"] == -32601

    # Recording: method, id, params, headers of interest.
    call = backend.requests("tools/call")[0]
    assert call.params["name"] == "echo" and call.session_id == client.session_id
    assert call.protocol_version == "2025-03-26" and call.headers["accept"] == ACCEPT
    ids = [m.id for m in backend.requests()]
    assert len(ids) == len(set(ids))
    assert backend.methods()[:2] == ["initialize", "notifications/initialized"]

    # No session header -> 400, unknown -> 404, GET -> 405.
    no_session = requests.post(backend.mcp_url, json={"jsonrpc": "2.0", "id": 9, "method": "ping"}, timeout=WAIT)
    assert no_session.status_code == 400
    assert requests.get(backend.mcp_url, timeout=WAIT).status_code == 405

    # Restart: the old session is gone; one re-initialize works again.
    assert backend.initialize_count == 1
    backend.forget_sessions()
    assert client.request("ping").status_code == 404
    client.initialize()
    assert backend.initialize_count == 2
    assert client.result("ping") == {}

    # DELETE ends the session.
    session_id = client.session_id
    assert requests.delete(backend.mcp_url, headers={"Mcp-Session-Id": session_id}, timeout=WAIT).status_code == 200
    assert backend.deleted_sessions == [session_id]
    assert requests.delete(backend.mcp_url, headers={"Mcp-Session-Id": session_id}, timeout=WAIT).status_code == 404
    assert client.request("ping").status_code == 404


def test_paged_backend_pages_everything(started):
    backend = started(paged_backend())
    client = RawClient(backend)
    caps = client.initialize()["capabilities"]
    assert set(caps) == {"tools", "prompts", "resources"}

    tools, pages = client.collect("tools/list", "tools")
    assert [t["name"] for t in tools] == [f"tool_{i:02d}" for i in range(23)] and pages == 5
    prompts, pages = client.collect("prompts/list", "prompts")
    assert len(prompts) == 7 and pages == 3
    resources, pages = client.collect("resources/list", "resources")
    assert len(resources) == 6 and pages == 2

    first = client.result("tools/list")
    assert decode_cursor(first["nextCursor"]) == 5  # opaque to clients, but an offset here
    assert client.request("tools/list", {"cursor": "garbage"}).json()["error"]["code"] == -32602
    result = client.result("tools/call", {"name": "tool_17", "arguments": {}})
    assert result == {"content": [{"type": "text", "text": "tool_17"}]}


def test_paged_backend_counts_and_capabilities(started):
    backend = started(paged_backend(total=4, page_size=10, prompts=0, resources=0))
    client = RawClient(backend)
    assert set(client.initialize()["capabilities"]) == {"tools"}
    result = client.result("tools/list")
    assert len(result["tools"]) == 4 and "nextCursor" not in result
    assert client.request("prompts/list").json()["error"]["code"] == -32601


def test_method_not_found_backend(started):
    backend = started(method_not_found_backend())
    client = RawClient(backend)
    assert set(client.initialize()["capabilities"]) == {"tools", "resources", "prompts"}
    for method in ("resources/list", "resources/templates/list", "prompts/list"):
        assert client.request(method).json()["error"]["code"] == -32601
    assert [t["name"] for t in client.result("tools/list")["tools"]] == ["still_here"]
    assert client.result("tools/call", {"name": "still_here"})["content"][0]["text"] == "still here"


@pytest.mark.parametrize("code", [-32603, -32602])
def test_erroring_lists_backend_jsonrpc(started, code):
    backend = started(erroring_lists_backend(code=code))
    client = RawClient(backend)
    assert "resources" in client.initialize()["capabilities"]
    assert client.request("resources/list").json()["error"]["code"] == code
    assert client.result("resources/templates/list") == {"resourceTemplates": []}
    assert client.result("tools/list")["tools"]


def test_erroring_lists_backend_http_status(started):
    backend = started(erroring_lists_backend(http_status=500))
    client = RawClient(backend)
    client.initialize()
    assert client.request("resources/list").status_code == 500


def test_delayed_backend_overlaps_concurrent_requests(started):
    backend = started(delayed_backend(delay=0.0, name="slow"))
    client = RawClient(backend)
    client.initialize()
    backend.clear_received()
    backend.delay = 1.0  # the handshake was not delayed; the five calls are
    results = []
    received_at_first_answer = []  # how many calls the backend held when the first one was answered
    lock = threading.Lock()
    together = threading.Barrier(5, timeout=WAIT)

    def call(i):
        other = RawClient(backend)
        other.session_id = client.session_id
        together.wait()
        body = other.request("tools/call", {"name": "echo", "arguments": {"text": str(i)}}).json()
        with lock:
            if not received_at_first_answer:
                received_at_first_answer.append(len(backend.requests("tools/call")))
            results.append(body["result"]["content"][0]["text"])

    start = time.monotonic()
    threads = [threading.Thread(target=call, args=(i,)) for i in range(5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT)
    elapsed = time.monotonic() - start
    assert sorted(results) == [f"slow:{i}" for i in range(5)]
    assert elapsed >= 1.0, elapsed  # each one waited its delay
    # The five overlap: all of them were in the backend, waiting, before any was answered.
    assert received_at_first_answer == [5]
    backend.delay = 0.0
    slept = client.result("tools/call", {"name": "sleep", "arguments": {"seconds": 0.05}})
    assert slept["content"][0]["text"] == "slept"


def test_hanging_backend_never_answers_and_stops_promptly():
    backend = hanging_backend()
    try:
        with pytest.raises(requests.Timeout):
            RawClient(backend).request("initialize", {"protocolVersion": "2025-06-18"}, timeout=0.3)
        backend.wait_for("initialize", timeout=WAIT)
        assert backend.methods() == ["initialize"]  # recorded although never answered

        # A request still in flight while stopping must not hold stop() up.
        pending = threading.Thread(
            target=lambda: _swallow(lambda: RawClient(backend).request("initialize", {}, timeout=60)), daemon=True
        )
        pending.start()
        backend.wait_for("initialize", count=2, timeout=WAIT)
    finally:
        start = time.monotonic()
        backend.stop()
        # Held up, stop() would join the server thread for 5 s, then force it and join again.
        assert time.monotonic() - start < 4.0
    pending.join(WAIT)  # well before its own 60 s timeout: it ended because the backend stopped
    assert not pending.is_alive()


def test_hanging_backend_can_answer_the_handshake(started):
    backend = started(hanging_backend(answer_initialize=True))
    client = RawClient(backend)
    client.initialize()
    with pytest.raises(requests.Timeout):
        client.request("tools/list", timeout=0.3)
    backend.hang = False
    assert client.result("tools/list")["tools"]


def test_sse_backend_streams_progress_log_then_result(started):
    backend = started(sse_backend())
    client = RawClient(backend)
    client.initialize()
    assert client.request("tools/list").headers["content-type"].startswith("application/json")
    request_id = client.next_id
    params = {"name": "echo", "arguments": {"text": "hi"}, "_meta": {"progressToken": "tok"}}
    response = client.request("tools/call", params)
    assert response.headers["content-type"].startswith("text/event-stream")
    events = [json.loads(line[len("data: "):]) for line in response.text.splitlines() if line.startswith("data: ")]
    assert [e.get("method") for e in events] == [
        "notifications/progress", "notifications/progress", "notifications/message", None,
    ]
    assert all(e["params"]["progressToken"] == "tok" for e in events[:2])
    assert events[-1]["id"] == request_id and events[-1]["result"]["content"][0]["text"] == "sse:hi"


def test_sse_backend_via_official_client(started):
    import mcp

    backend = started(sse_backend())

    async def scenario():
        progress = []

        async def on_progress(value, total, message):
            progress.append(value)

        async with mcp.Client(backend.mcp_url, mode="legacy") as client:
            result = await client.call_tool("echo", {"text": "x"}, progress_callback=on_progress)
            assert result.content[0].text == "sse:x"
        assert progress == [1, 2]

    run(scenario())


def _swallow(fn):
    try:
        fn()
    except requests.RequestException:
        pass
