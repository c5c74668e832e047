"""Sessions: aggregation across backends, determinism, concurrency, isolation, reaping."""

from __future__ import annotations

import asyncio
import threading

import anyio
import pykka

from tests.backends import (
    INTERNAL_ERROR,
    SHARED_README_URI,
    RawMcpBackend,
    RpcError,
    hanging_backend,
    restartable_backend,
    sdk_backend,
    text_result,
    tool_def,
)
from tests.gateway import admin_get, backend_entry, list_all, run_client, wait_until
from vmcp_actors.core import _aggregated as aggregated_module
from vmcp_actors.users import _actor as session_module

ADMIN_ENV, ADMIN_TOKEN = "SESSIONS_ADMIN_TOKEN", "sessions-adm1n-Vb7"


def _call(gateway, session_id, name, arguments=None, request_id=1):
    return gateway.rpc(session_id, "tools/call", {"name": name, "arguments": arguments or {}}, request_id=request_id)


def _text(answer: dict) -> str:
    assert "result" in answer, answer
    return answer["result"]["content"][0]["text"]


def _names(items: list[dict]) -> list[str]:
    return [item["name"] for item in items]


def _delete(gateway, session_id):
    import requests

    return requests.delete(gateway.url, headers={"Mcp-Session-Id": session_id}, timeout=10)


def _session_ids(gateway) -> set[str]:
    """The sessions the gateway holds, read from the admin state (touches none of them)."""
    return {row["id"] for row in admin_get(gateway, token=ADMIN_TOKEN).json()["sessions"]}


class _HeldCalls:
    """An official-SDK tool, ``held``, that keeps every call in it until ``release`` is set and
    counts them: the backend's own view of how many calls are in flight (``now``, ``peak``)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.now = 0
        self.peak = 0
        self._lock = threading.Lock()

    async def held(self) -> str:
        """Wait until the test releases the call, then answer 'slept'."""
        with self._lock:
            self.now += 1
            self.peak = max(self.peak, self.now)
        try:
            with anyio.fail_after(30):  # a test that never releases still ends
                while not self.release.is_set():
                    await anyio.sleep(0.01)
        finally:
            with self._lock:
                self.now -= 1
        return "slept"


class _RecoveringBackend(RawMcpBackend):
    """A raw backend with ``echo(text)``. While ``down`` its tools/list fails at once; once
    up, every tools/list hangs until the test ends it: ``release`` answers every one (now and
    later), ``fail_held()`` fails those hanging now. A discovery of it is seen in flight."""

    def __init__(self, name: str) -> None:
        super().__init__(name, {"tools/list": self._list, "tools/call": self._call})
        self.down = True
        self.release = threading.Event()
        self._failing: list[threading.Event] = []
        self._holding = 0
        self._held_lock = threading.Lock()

    @property
    def holding(self) -> int:
        """How many tools/list requests hang now."""
        with self._held_lock:
            return self._holding

    def fail_held(self) -> None:
        with self._held_lock:
            for failing in self._failing:
                failing.set()

    def stop(self) -> None:
        self.release.set()  # nothing hangs past the backend's end
        super().stop()

    async def _list(self, call) -> dict:
        if self.down:
            raise RpcError(INTERNAL_ERROR, f"{self.name} is down")
        failing = threading.Event()
        with self._held_lock:
            self._failing.append(failing)
            self._holding += 1
        try:
            while not (self.release.is_set() or failing.is_set()):
                await asyncio.sleep(0.01)
        finally:
            with self._held_lock:
                self._holding -= 1
        if not self.release.is_set():
            raise RpcError(INTERNAL_ERROR, f"{self.name} is still down")
        return {"tools": [tool_def("echo", "Echo text back", text="string")]}

    def _call(self, call) -> dict:
        return text_result(f"{self.name}:{call.params['arguments']['text']}")


# -- 1. aggregation ---------------------------------------------------------------------------


def test_tools_are_prefixed_with_and_without_a_clash(start_gateway):
    with sdk_backend("alpha", tools=("echo", "structured")) as alpha, sdk_backend("beta", tools=("echo", "sleep")) as beta:
        gateway = start_gateway({"name": "t", "backends": [backend_entry("alpha", alpha), backend_entry("beta", beta)]})
        sid = gateway.initialize()
        names = _names(list_all(gateway, sid, "tools/list", "tools"))
        assert sorted(names) == ["alpha_echo", "alpha_structured", "beta_echo", "beta_sleep"]
        assert _text(_call(gateway, sid, "alpha_echo", {"text": "a"})) == "alpha:a"
        assert _text(_call(gateway, sid, "beta_echo", {"text": "b"})) == "beta:b"
        assert _text(_call(gateway, sid, "beta_sleep", {"seconds": 0})) == "slept"
        # unprefixed names are not callable
        assert "error" in _call(gateway, sid, "echo", {"text": "x"})


def test_custom_prefix_format(start_gateway):
    with sdk_backend("alpha", tools=("echo",)) as alpha, sdk_backend("beta", tools=("echo",)) as beta:
        gateway = start_gateway(
            {
                "name": "t",
                "backends": [backend_entry("alpha", alpha), backend_entry("beta", beta)],
                "aggregation": {"conflictResolution": "prefix", "conflictResolutionConfig": {"prefixFormat": "{workload}."}},
            }
        )
        sid = gateway.initialize()
        assert _names(list_all(gateway, sid, "tools/list", "tools")) == ["alpha.echo", "beta.echo"]
        assert _names(list_all(gateway, sid, "prompts/list", "prompts")) == ["alpha.greet", "beta.greet"]

        async def work(client):
            return (await client.call_tool("beta.echo", {"text": "dot"})).content[0].text

        assert run_client(gateway.url, work) == "beta:dot"


def test_resources_templates_and_prompts_are_aggregated_and_routed(start_gateway):
    with sdk_backend("alpha", tools=("echo",)) as alpha, sdk_backend("beta", tools=("echo",)) as beta:
        # beta configured first: the shared resource must still be served by alpha (sorted order)
        gateway = start_gateway({"name": "t", "backends": [backend_entry("beta", beta), backend_entry("alpha", alpha)]})
        sid = gateway.initialize()

        uris = [r["uri"] for r in list_all(gateway, sid, "resources/list", "resources")]
        assert uris.count(SHARED_README_URI) == 1
        assert sorted(uris) == sorted(["test://alpha/static", "test://beta/static", SHARED_README_URI])

        def read(uri):
            answer = gateway.rpc(sid, "resources/read", {"uri": uri})
            assert "result" in answer, answer
            return answer["result"]["contents"][0]["text"]

        assert read(SHARED_README_URI) == "shared readme (served by alpha)"
        assert read("test://beta/static") == "static resource of beta"
        assert read("test://alpha/static") == "static resource of alpha"

        templates = [t["uriTemplate"] for t in list_all(gateway, sid, "resources/templates/list", "resourceTemplates")]
        assert sorted(templates) == ["test://alpha/items/{item}", "test://beta/items/{item}"]
        assert read("test://beta/items/42") == "beta item 42"
        assert read("test://alpha/items/7") == "alpha item 7"
        missing = gateway.rpc(sid, "resources/read", {"uri": "test://nobody/here"})
        assert "error" in missing

        prompts = _names(list_all(gateway, sid, "prompts/list", "prompts"))
        assert prompts == ["alpha_greet", "beta_greet"]
        got = gateway.rpc(sid, "prompts/get", {"name": "beta_greet", "arguments": {"who": "bob"}})
        assert got["result"]["messages"][0]["content"]["text"] == "Hello bob, from beta!"


def test_shared_resource_goes_to_first_backend_in_sorted_order_whatever_the_config_order(start_gateway):
    with sdk_backend("alpha", tools=("echo",)) as alpha, sdk_backend("beta", tools=("echo",)) as beta:
        for order in ([alpha, beta], [beta, alpha]):
            gateway = start_gateway(
                {"name": "t", "backends": [backend_entry("alpha" if b is alpha else "beta", b) for b in order]}
            )
            sid = gateway.initialize()
            answer = gateway.rpc(sid, "resources/read", {"uri": SHARED_README_URI})
            assert answer["result"]["contents"][0]["text"] == "shared readme (served by alpha)"


def test_prompts_get_reaches_the_backend_with_the_original_name(start_gateway):
    with restartable_backend() as raw:
        raw.capabilities = {"tools": {}, "prompts": {}}
        raw.handlers["prompts/list"] = lambda call: {"prompts": [{"name": "hello", "description": "hi"}]}
        raw.handlers["prompts/get"] = lambda call: {
            "messages": [{"role": "user", "content": {"type": "text", "text": f"got {call.params['name']}"}}]
        }
        gateway = start_gateway({"name": "t", "backends": [backend_entry("raw", raw)]})
        sid = gateway.initialize()
        assert _names(list_all(gateway, sid, "prompts/list", "prompts")) == ["raw_hello"]
        got = gateway.rpc(sid, "prompts/get", {"name": "raw_hello", "arguments": {"x": "1"}})
        assert got["result"]["messages"][0]["content"]["text"] == "got hello"
        (received,) = raw.requests("prompts/get")
        assert received.params == {"name": "hello", "arguments": {"x": "1"}}


# -- 2. determinism ----------------------------------------------------------------------------


def test_config_order_does_not_change_the_lists(start_gateway):
    with sdk_backend("alpha") as alpha, sdk_backend("beta") as beta:
        results = []
        for entries in (
            [backend_entry("alpha", alpha), backend_entry("beta", beta)],
            [backend_entry("beta", beta), backend_entry("alpha", alpha)],
        ):
            gateway = start_gateway({"name": "t", "backends": entries})
            sid = gateway.initialize()
            results.append(
                {
                    method: list_all(gateway, sid, method, key)
                    for method, key in (
                        ("tools/list", "tools"),
                        ("resources/list", "resources"),
                        ("resources/templates/list", "resourceTemplates"),
                        ("prompts/list", "prompts"),
                    )
                }
            )
        assert results[0] == results[1]
        assert results[0]["tools/list"]  # not trivially equal


def test_a_slow_backend_does_not_change_the_order(start_gateway):
    with restartable_backend("first") as first, restartable_backend("second") as second:
        config = {"name": "t", "backends": [backend_entry("first", first), backend_entry("second", second)]}
        listed = first.handlers["tools/list"]
        slow = {"first": True}

        async def after_second(call):
            if slow["first"]:  # "first" answers last: once "second" was asked for its list, and a moment after
                with anyio.move_on_after(10):
                    while not second.requests("tools/list"):
                        await asyncio.sleep(0.01)
                await asyncio.sleep(0.05)
            return listed(call)

        first.handlers["tools/list"] = after_second
        orders = []
        for first_slow in (True, False):
            slow["first"] = first_slow
            second.clear_received()
            gateway = start_gateway(config)
            sid = gateway.initialize()
            orders.append(_names(list_all(gateway, sid, "tools/list", "tools")))
        assert orders[0] == orders[1] == ["first_echo", "first_sleep", "second_echo", "second_sleep"]


# -- 3. concurrency ------------------------------------------------------------------------------


def test_a_hanging_backend_does_not_block_other_backends_or_sessions(start_gateway):
    with hanging_backend(answer_initialize=True) as hanging, sdk_backend("good", tools=("echo",)) as good:
        gateway = start_gateway(
            {
                "name": "t",
                "backends": [backend_entry("hanging", hanging), backend_entry("good", good)],
                # Longer than the client's own 30 s: a call stuck behind the hanging one fails.
                "operational": {"timeouts": {"default": "60s"}},
            }
        )
        hanging.hang = False  # let discovery through, then hang every later request
        sid = gateway.initialize()
        other = gateway.initialize()
        assert "hanging_echo" in _names(list_all(gateway, sid, "tools/list", "tools"))
        assert "hanging_echo" in _names(list_all(gateway, other, "tools/list", "tools"))
        hanging.hang = True

        outcome: dict = {}
        stuck = threading.Thread(
            target=lambda: outcome.setdefault("answer", _call(gateway, sid, "hanging_echo", {"text": "zz"})), daemon=True
        )
        stuck.start()
        hanging.wait_for("tools/call", timeout=10)

        # The hanging call ends only when released below (or after its 60 s timeout): answers
        # that come while it is in flight were not queued behind it.
        for i in range(5):
            assert _text(_call(gateway, sid, "good_echo", {"text": str(i)}, request_id=10 + i)) == f"good:{i}"
        assert _text(_call(gateway, other, "good_echo", {"text": "o"})) == "good:o"
        assert gateway.rpc(other, "ping") == {"jsonrpc": "2.0", "id": 1, "result": {}}
        assert stuck.is_alive() and "answer" not in outcome  # the hanging call was in flight all along

        hanging.hang = False  # release it: it completes normally
        stuck.join(timeout=10)
        assert _text(outcome["answer"]) == "hanging:zz"


def test_concurrent_calls_on_one_session_and_backend_overlap(start_gateway):
    calls = _HeldCalls()
    with sdk_backend("alpha", tools=(), extra_tools=[calls.held]) as alpha:
        gateway = start_gateway({"name": "t", "backends": [backend_entry("alpha", alpha)]})
        sid = gateway.initialize()
        assert _names(list_all(gateway, sid, "tools/list", "tools")) == ["alpha_held"]

        answers: dict[int, dict] = {}

        def call(i):
            answers[i] = _call(gateway, sid, "alpha_held", request_id=i)

        threads = [threading.Thread(target=call, args=(i,)) for i in range(10)]
        for thread in threads:
            thread.start()
        try:
            # Every call is in the backend at once: none waits for another to end first.
            assert wait_until(lambda: calls.peak == 10, timeout=20), calls.peak
        finally:
            calls.release.set()
            for thread in threads:
                thread.join(timeout=30)
        assert sorted(answers) == list(range(10))
        assert all(_text(answers[i]) == "slept" and answers[i]["id"] == i for i in range(10)), answers


# -- 4. isolation ----------------------------------------------------------------------------------


def test_each_client_session_has_a_backend_session_of_its_own_ended_with_it(start_gateway):
    """Two anonymous client sessions are one person, yet each has its own backend session,
    as two direct clients would: ending one ends its backend session and leaves the other's."""
    with restartable_backend() as raw:
        gateway = start_gateway({"name": "t", "backends": [backend_entry("rs", raw)]})
        one, two = gateway.initialize(), gateway.initialize()
        assert one != two
        assert _text(_call(gateway, one, "rs_echo", {"text": "1"})) == "restartable:1"
        first = {m.session_id for m in raw.requests("tools/call")}
        assert _text(_call(gateway, two, "rs_echo", {"text": "2"})) == "restartable:2"
        second = {m.session_id for m in raw.requests("tools/call")} - first
        assert len(first) == 1 and len(second) == 1

        response = _delete(gateway, one)
        assert response.status_code == 200
        gone = gateway.post({"jsonrpc": "2.0", "id": 3, "method": "tools/list"}, one)
        assert gone.status_code == 404
        assert wait_until(lambda: raw.deleted_sessions, timeout=10) == list(first)
        assert _text(_call(gateway, two, "rs_echo", {"text": "still"})) == "restartable:still"
        assert {m.session_id for m in raw.requests("tools/call")} == first | second

        assert _delete(gateway, two).status_code == 200
        assert wait_until(lambda: len(raw.deleted_sessions) == 2, timeout=10)
        assert raw.deleted_sessions[1:] == list(second)
        assert raw.sessions == {}


# -- 5. reaping --------------------------------------------------------------------------------------


# Short, yet far longer than the pause between two requests of a test, even under load.
SESSION_TTL = "600ms"


def _reaping_gateway(start_gateway, monkeypatch, backend, name: str):
    """A gateway that reaps sessions idle for SESSION_TTL, with an admin view of its sessions."""
    monkeypatch.setenv(ADMIN_ENV, ADMIN_TOKEN)
    return start_gateway({"name": "t", "backends": [backend_entry(name, backend)],
                          "operational": {"sessionTTL": SESSION_TTL}, "admin": {"tokenEnv": ADMIN_ENV}})


def test_idle_sessions_are_reaped_and_their_actors_stopped(start_gateway):
    with restartable_backend() as raw:
        gateway = start_gateway(
            {"name": "t", "backends": [backend_entry("rs", raw)], "operational": {"sessionTTL": SESSION_TTL}}
        )
        baseline = len(pykka.ActorRegistry.get_all())  # the gateway
        sid = gateway.initialize()
        assert _text(_call(gateway, sid, "rs_echo", {"text": "x"})) == "restartable:x"
        assert len(pykka.ActorRegistry.get_all()) == baseline + 2  # session + one backend connection
        (backend_session,) = raw.sessions

        # Left alone past its TTL, the session is reaped: its actors stop (watched without a
        # request, which would use the session), then it is gone for its client too.
        assert wait_until(lambda: len(pykka.ActorRegistry.get_all()) == baseline, timeout=10)
        response = gateway.post({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, sid)
        assert response.status_code == 404
        assert wait_until(lambda: raw.deleted_sessions, timeout=10) == [backend_session]


def test_a_session_in_use_is_not_reaped(start_gateway, monkeypatch):
    with restartable_backend() as raw:
        gateway = _reaping_gateway(start_gateway, monkeypatch, raw, "rs")
        sid = gateway.initialize()
        idle = gateway.initialize()  # younger than sid, and never used
        pings: list = []
        stop = threading.Event()

        def use() -> None:  # sid pinged back to back: used all the time
            while not stop.is_set():
                try:
                    pings.append(gateway.rpc(sid, "ping"))
                except Exception as error:  # noqa: BLE001 - checked below
                    pings.append(repr(error))

        pinger = threading.Thread(target=use)
        pinger.start()
        try:
            # Once the reaper took the idle session, sid would have gone too, had sessions
            # gone by age rather than by use (sid is the older).
            assert wait_until(lambda: idle not in _session_ids(gateway), timeout=20)
        finally:
            stop.set()
            pinger.join(timeout=30)
        assert pings and all(ping == {"jsonrpc": "2.0", "id": 1, "result": {}} for ping in pings), pings[-3:]
        assert _text(_call(gateway, sid, "rs_echo", {"text": "alive"})) == "restartable:alive"
        assert raw.deleted_sessions == []


def test_a_session_with_a_call_in_flight_is_not_reaped(start_gateway, monkeypatch):
    """A call that outlasts the TTL keeps its session: the session is busy, not idle."""
    calls = _HeldCalls()
    with sdk_backend("alpha", tools=(), extra_tools=[calls.held]) as alpha:
        gateway = _reaping_gateway(start_gateway, monkeypatch, alpha, "alpha")
        sid = gateway.initialize()
        assert _names(list_all(gateway, sid, "tools/list", "tools")) == ["alpha_held"]
        answer: dict = {}
        call = threading.Thread(target=lambda: answer.update(_call(gateway, sid, "alpha_held", request_id=7)))
        call.start()
        try:
            assert wait_until(lambda: calls.now == 1, timeout=10)  # the call is in the backend
            idle = gateway.initialize()  # used last after sid was, then left alone
            # Once the reaper took the idle session, sid (idle for longer, but for its call)
            # would have gone too.
            assert wait_until(lambda: idle not in _session_ids(gateway), timeout=10)
            assert sid in _session_ids(gateway)
        finally:
            calls.release.set()
            call.join(timeout=30)
        assert answer.get("result", {}).get("content", [{}])[0].get("text") == "slept", answer
        # and the session is still there right after the long call
        assert gateway.rpc(sid, "ping", request_id=8) == {"jsonrpc": "2.0", "id": 8, "result": {}}


def _alpha_and(start_gateway, alpha, other):
    """A gateway over a good backend and another one; a new session id. The backends' timeout
    is longer than the client's own 30 s: a request that waits for a hanging one fails."""
    gateway = start_gateway({"name": "t", "backends": [backend_entry("alpha", alpha), backend_entry(other.name, other)],
                             "operational": {"timeouts": {"default": "60s"}}})
    return gateway, gateway.initialize()


def _quick_retries(monkeypatch) -> None:
    """A backend missing from the catalog is retried on the next request (as soon as it may
    be), and every request may remind the user of it."""
    monkeypatch.setattr(session_module, "RETRY_FAILED_AFTER", 0.05)
    monkeypatch.setattr(aggregated_module, "REMIND_RETRY_EVERY", 0.01)


def _tool_names(gateway, sid) -> list[str]:
    answer = gateway.rpc(sid, "tools/list")
    assert "result" in answer, answer
    return [t["name"] for t in answer["result"]["tools"]]


def test_a_backend_that_failed_discovery_joins_the_session_when_it_recovers(start_gateway, monkeypatch):
    _quick_retries(monkeypatch)
    with sdk_backend("alpha", tools=("echo",)) as alpha, _RecoveringBackend("flaky").start() as flaky:
        gateway, sid = _alpha_and(start_gateway, alpha, flaky)
        assert _tool_names(gateway, sid) == ["alpha_echo"]  # flaky failed its discovery

        flaky.down = False  # the backend recovers; its lists hang until released
        # The retry runs in the background: a request reminds the user, the retry goes out,
        # and requests meanwhile are served at once from the current catalog (a request that
        # waited for the retry would wait for the release below: the client gives up first).
        assert wait_until(lambda: _tool_names(gateway, sid) == ["alpha_echo"] and flaky.holding == 1, timeout=10)
        assert _tool_names(gateway, sid) == ["alpha_echo"] and flaky.holding == 1

        flaky.release.set()  # once the retry lands, the recovered backend's tools appear
        assert wait_until(lambda: "flaky_echo" in _tool_names(gateway, sid), timeout=10)
        answer = gateway.rpc(sid, "tools/call", {"name": "flaky_echo", "arguments": {"text": "back"}})
        assert _text(answer) == "flaky:back"


def test_a_hanging_backend_delays_no_request_after_the_first_discovery(start_gateway, monkeypatch):
    _quick_retries(monkeypatch)
    with sdk_backend("alpha", tools=("echo",)) as alpha, _RecoveringBackend("stuck").start() as stuck:
        gateway, sid = _alpha_and(start_gateway, alpha, stuck)

        def echoed() -> bool:
            answer = gateway.rpc(sid, "tools/call", {"name": "alpha_echo", "arguments": {"text": "x"}})
            assert "error" not in answer, answer
            return True

        assert _tool_names(gateway, sid) == ["alpha_echo"]  # the first discovery: stuck fails it at once
        stuck.down = False  # from now on stuck hangs: each retry of it stays in flight until failed
        for retry in range(1, 4):
            # A call reminds the user of stuck; its retry goes out and hangs...
            assert wait_until(lambda: echoed() and len(stuck.requests("tools/list")) == 1 + retry, timeout=10)
            # ...and calls go on being answered while it does (a call that waited for it
            # would wait until fail_held below: the client gives up first).
            for _ in range(3):
                assert echoed()
            assert stuck.holding == 1
            stuck.fail_held()  # that retry fails; a later call reminds the user again
            assert wait_until(lambda: stuck.holding == 0, timeout=10)


def _template_completing_backend(name: str):
    """An official-SDK backend whose completion handler answers for its own resource template."""
    from mcp.server.mcpserver import MCPServer
    from mcp.types import Completion, ResourceTemplateReference

    from vmcp_actors.demo._serve import serve_asgi_in_thread

    server = MCPServer(name, log_level="WARNING")

    @server.resource(f"{name}://rows/{{row}}")
    def row(row: str) -> str:
        return f"{name} row {row}"

    @server.completion()
    async def complete(ref, argument, context):
        if isinstance(ref, ResourceTemplateReference) and argument.name == "row":
            return Completion(values=[f"{name}-{argument.value}1", f"{name}-{argument.value}2"], has_more=False)
        return None

    return serve_asgi_in_thread(server.streamable_http_app(), name=name)


def test_completion_for_a_resource_template_is_routed_to_the_backend_that_owns_it(start_gateway):
    alpha, beta = _template_completing_backend("alpha"), _template_completing_backend("beta")
    try:
        gateway = start_gateway({"name": "t", "backends": [backend_entry("alpha", alpha), backend_entry("beta", beta)]})
        sid = gateway.initialize()
        templates = [t["uriTemplate"] for t in gateway.rpc(sid, "resources/templates/list")["result"]["resourceTemplates"]]
        assert templates == ["alpha://rows/{row}", "beta://rows/{row}"]
        answer = gateway.rpc(sid, "completion/complete", {
            "ref": {"type": "ref/resource", "uri": "beta://rows/{row}"}, "argument": {"name": "row", "value": "x"}})
        assert answer["result"]["completion"]["values"] == ["beta-x1", "beta-x2"]
        unknown = gateway.rpc(sid, "completion/complete", {
            "ref": {"type": "ref/resource", "uri": "gamma://rows/{row}"}, "argument": {"name": "row", "value": "x"}})
        assert unknown["error"]["code"] == -32002
        read = gateway.rpc(sid, "resources/read", {"uri": "beta://rows/7"})
        assert read["result"]["contents"][0]["text"] == "beta row 7"
    finally:
        alpha.stop()
        beta.stop()
