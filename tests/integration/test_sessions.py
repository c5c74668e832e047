"""Sessions: aggregation across backends, determinism, concurrency, isolation, reaping."""

from __future__ import annotations

import threading
import time

import pykka

from tests.backends import (
    SHARED_README_URI,
    delayed_backend,
    hanging_backend,
    restartable_backend,
    sdk_backend,
)
from tests.gateway import backend_entry, list_all, run_client, wait_until
from vmcp_actors.users import _actor as session_module


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
    with delayed_backend(delay=0.0, name="first") as first, delayed_backend(delay=0.0, name="second") as second:
        config = {"name": "t", "backends": [backend_entry("first", first), backend_entry("second", second)]}
        orders = []
        for delay in (0.4, 0.0):
            first.delay = delay  # "first" answers last when delayed
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
                "operational": {"timeouts": {"default": "20s"}},
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
        hanging.wait_for("tools/call", timeout=5)

        started = time.monotonic()
        for i in range(5):
            assert _text(_call(gateway, sid, "good_echo", {"text": str(i)}, request_id=10 + i)) == f"good:{i}"
        assert _text(_call(gateway, other, "good_echo", {"text": "o"})) == "good:o"
        assert gateway.rpc(other, "ping") == {"jsonrpc": "2.0", "id": 1, "result": {}}
        assert time.monotonic() - started < 5.0
        assert stuck.is_alive()  # the hanging call was in flight all along

        hanging.hang = False  # release it: it completes normally
        stuck.join(timeout=10)
        assert _text(outcome["answer"]) == "hanging:zz"


def test_concurrent_calls_on_one_session_and_backend_overlap(start_gateway):
    with sdk_backend("alpha", tools=("sleep",)) as alpha:
        gateway = start_gateway({"name": "t", "backends": [backend_entry("alpha", alpha)]})
        sid = gateway.initialize()
        assert _names(list_all(gateway, sid, "tools/list", "tools")) == ["alpha_sleep"]

        answers: dict[int, dict] = {}

        def call(i):
            answers[i] = _call(gateway, sid, "alpha_sleep", {"seconds": 0.5}, request_id=i)

        threads = [threading.Thread(target=call, args=(i,)) for i in range(10)]
        started = time.monotonic()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
        elapsed = time.monotonic() - started
        assert sorted(answers) == list(range(10))
        assert all(_text(answers[i]) == "slept" and answers[i]["id"] == i for i in range(10)), answers
        assert elapsed < 3.0, elapsed


# -- 4. isolation ----------------------------------------------------------------------------------


def test_sessions_of_one_user_share_its_backend_session_until_the_last_one_ends(start_gateway):
    """One actor per user: two anonymous sessions are one user, so one backend session
    serves both; ending one keeps it for the other, ending the last ends it."""
    with restartable_backend() as raw:
        gateway = start_gateway({"name": "t", "backends": [backend_entry("rs", raw)]})
        one, two = gateway.initialize(), gateway.initialize()
        assert one != two
        assert _text(_call(gateway, one, "rs_echo", {"text": "1"})) == "restartable:1"
        assert _text(_call(gateway, two, "rs_echo", {"text": "2"})) == "restartable:2"
        assert raw.initialize_count == 1
        (backend_session,) = {m.session_id for m in raw.requests("tools/call")}

        response = _delete(gateway, one)
        assert response.status_code == 200
        gone = gateway.post({"jsonrpc": "2.0", "id": 3, "method": "tools/list"}, one)
        assert gone.status_code == 404
        assert _text(_call(gateway, two, "rs_echo", {"text": "still"})) == "restartable:still"
        assert raw.deleted_sessions == [] and raw.initialize_count == 1

        assert _delete(gateway, two).status_code == 200
        assert wait_until(lambda: raw.deleted_sessions, timeout=5) == [backend_session]
        assert raw.sessions == {}


# -- 5. reaping --------------------------------------------------------------------------------------


def test_idle_sessions_are_reaped_and_their_actors_stopped(start_gateway):
    with restartable_backend() as raw:
        gateway = start_gateway(
            {"name": "t", "backends": [backend_entry("rs", raw)], "operational": {"sessionTTL": "300ms"}}
        )
        baseline = len(pykka.ActorRegistry.get_all())  # the gateway
        sid = gateway.initialize()
        assert _text(_call(gateway, sid, "rs_echo", {"text": "x"})) == "restartable:x"
        assert len(pykka.ActorRegistry.get_all()) == baseline + 2  # session + one backend connection
        (backend_session,) = raw.sessions

        time.sleep(1.0)
        response = gateway.post({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, sid)
        assert response.status_code == 404
        assert wait_until(lambda: len(pykka.ActorRegistry.get_all()) == baseline, timeout=5)
        assert wait_until(lambda: raw.deleted_sessions, timeout=5) == [backend_session]


def test_a_session_in_use_is_not_reaped(start_gateway):
    with restartable_backend() as raw:
        gateway = start_gateway(
            {"name": "t", "backends": [backend_entry("rs", raw)], "operational": {"sessionTTL": "300ms"}}
        )
        sid = gateway.initialize()
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            assert gateway.rpc(sid, "ping") == {"jsonrpc": "2.0", "id": 1, "result": {}}
            time.sleep(0.1)
        assert _text(_call(gateway, sid, "rs_echo", {"text": "alive"})) == "restartable:alive"
        assert raw.deleted_sessions == []


def test_a_session_with_a_call_in_flight_is_not_reaped(start_gateway):
    """A call that outlasts the TTL keeps its session: the session is busy, not idle."""
    with sdk_backend("alpha", tools=("sleep",)) as alpha:
        gateway = start_gateway(
            {"name": "t", "backends": [backend_entry("alpha", alpha)], "operational": {"sessionTTL": "300ms"}}
        )
        sid = gateway.initialize()
        assert _names(list_all(gateway, sid, "tools/list", "tools")) == ["alpha_sleep"]
        answer = _call(gateway, sid, "alpha_sleep", {"seconds": 1.0}, request_id=7)
        assert answer.get("result", {}).get("content", [{}])[0].get("text") == "slept", answer
        # and the session is still there right after the long call
        assert gateway.rpc(sid, "ping", request_id=8) == {"jsonrpc": "2.0", "id": 8, "result": {}}


def _alpha_and_hanging(start_gateway, alpha, hanging, hanging_timeout: str):
    """A gateway over a good backend and a hanging one with a short timeout; a new session id."""
    gateway = start_gateway({
        "name": "t",
        "backends": [backend_entry("alpha", alpha), backend_entry(hanging.name, hanging)],
        "operational": {"timeouts": {"perWorkload": {hanging.name: hanging_timeout}}},
    })
    return gateway, gateway.initialize()


def test_a_backend_that_failed_discovery_joins_the_session_when_it_recovers(start_gateway, monkeypatch):
    monkeypatch.setattr(session_module, "RETRY_FAILED_AFTER", 0.2)
    with sdk_backend("alpha", tools=("echo",)) as alpha, hanging_backend(name="flaky") as flaky:
        gateway, sid = _alpha_and_hanging(start_gateway, alpha, flaky, "200ms")
        first = gateway.rpc(sid, "tools/list")
        assert [t["name"] for t in first["result"]["tools"]] == ["alpha_echo"]

        flaky.hang = False  # the backend recovers
        time.sleep(0.3)
        # The retry runs in the background: requests meanwhile are served at once from the
        # current catalog, and once the retry lands the recovered backend's tools appear.
        started = time.monotonic()
        gateway.rpc(sid, "tools/list")
        assert time.monotonic() - started < 0.5

        def flaky_listed():
            names = [t["name"] for t in gateway.rpc(sid, "tools/list")["result"]["tools"]]
            return "flaky_echo" in names

        assert wait_until(flaky_listed, timeout=5)
        answer = gateway.rpc(sid, "tools/call", {"name": "flaky_echo", "arguments": {"text": "back"}})
        assert "error" not in answer


def test_a_hanging_backend_delays_no_request_after_the_first_discovery(start_gateway, monkeypatch):
    monkeypatch.setattr(session_module, "RETRY_FAILED_AFTER", 0.05)
    with sdk_backend("alpha", tools=("echo",)) as alpha, hanging_backend(name="stuck") as stuck:
        gateway, sid = _alpha_and_hanging(start_gateway, alpha, stuck, "300ms")
        gateway.rpc(sid, "tools/list")  # pays for the first discovery once
        for _ in range(5):
            time.sleep(0.1)
            started = time.monotonic()
            answer = gateway.rpc(sid, "tools/call", {"name": "alpha_echo", "arguments": {"text": "x"}})
            assert "error" not in answer
            assert time.monotonic() - started < 0.25  # retries of 'stuck' run in the background


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
