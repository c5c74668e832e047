"""Real stdio MCP servers behind the gateway (issue 23), compared with the same server
reached directly over stdio by the same SDK client in the same mode (``legacy``: the
2025-11-25 handshake; ``auto``: 2026-07-28 where the server speaks it).

* ``mcp-server-time`` (PyPI) as a ``shared`` stdio backend: the tools it lists and what
  ``convert_time`` answers, field for field; ``get_current_time`` by structure (the time of
  day moves between two calls).
* ``@modelcontextprotocol/server-memory`` (npm) as a ``perUser`` backend with
  ``MEMORY_FILE_PATH: <tmp>/{user}.json``: two OIDC users (``tests.idp.LocalIdP``; every
  anonymous caller is one user) each see only their own graph, kept in a file named by
  their digest; one user's flow answers as the server does directly.

``scripts/install-stdio-servers`` installs both servers (skipped without them, failed under CI).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.idp import LocalIdP
from tests.stdio_servers import memory_server, need_stdio_servers, time_server
from vmcp_actors.backends._stdio import user_digest

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]

MODES = ["legacy", "auto"]  # auto: 2026-07-28 (both servers speak it through mcp 2.x / the TS SDK)
AUDIENCE = "vmcp"
SERVER_INFO = "io.modelcontextprotocol/serverInfo"  # who answered: the gateway names itself, not its backend
CONVERSIONS = [  # convert_time's arguments: fixed, so both answers must be equal
    {"source_timezone": "Europe/Oslo", "time": "12:30", "target_timezone": "Asia/Tokyo"},
    {"source_timezone": "America/New_York", "time": "23:15", "target_timezone": "Australia/Sydney"},
    {"source_timezone": "Nowhere/Atlantis", "time": "10:00", "target_timezone": "Etc/UTC"},  # the server's error
]
CLOCK_SLACK = 120  # seconds two get_current_time answers may be apart


# -- clients ---------------------------------------------------------------------------------


def with_client(target: Any, work: Callable[[Any], Awaitable[Any]], mode: str, token: str | None = None) -> Any:
    """``work(client)`` with the official SDK client on ``target``: the gateway's URL (with a
    bearer token when given) or ``mcp.StdioServerParameters`` (the server directly)."""
    import httpx2
    import mcp
    from mcp.client.streamable_http import streamable_http_client

    async def main() -> Any:
        if isinstance(target, str):
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            async with httpx2.AsyncClient(headers=headers, timeout=30) as http, \
                    mcp.Client(streamable_http_client(target, http_client=http), mode=mode) as client:
                return await work(client)
        async with mcp.Client(target, mode=mode) as client:
            return await work(client)

    return asyncio.run(main())


def plain(result: Any) -> dict[str, Any]:
    """A result as JSON, without the answering server's name (the only field allowed to differ)."""
    dumped = result.model_dump(mode="json", exclude_none=True)
    meta = {key: value for key, value in dumped.pop("meta", {}).items() if key != SERVER_INFO}
    return {**dumped, "meta": meta} if meta else dumped


def unprefixed(tools: list[dict[str, Any]], backend: str) -> list[dict[str, Any]]:
    """The gateway's tool list as the backend names its tools (default conflict resolution
    prefixes ``<backend>_``)."""
    prefix = f"{backend}_"
    assert all(tool["name"].startswith(prefix) for tool in tools), [tool["name"] for tool in tools]
    return [{**tool, "name": tool["name"][len(prefix):]} for tool in tools]


# -- mcp-server-time, shared ------------------------------------------------------------------


def time_direct() -> Any:
    import mcp

    return mcp.StdioServerParameters(command=time_server(), args=[], env={})


def time_config() -> dict[str, Any]:
    return {"name": "stdio-real", "backends": [
        {"name": "time", "transport": "stdio", "command": time_server(), "args": [], "env": {}, "scope": "shared"}]}


async def time_session(client: Any, prefix: str) -> dict[str, Any]:
    """What the time server lists and answers: its tools, the fixed conversions, the time now."""
    listed = [tool.model_dump(mode="json", exclude_none=True) for tool in (await client.list_tools()).tools]
    conversions = [plain(await client.call_tool(f"{prefix}convert_time", arguments)) for arguments in CONVERSIONS]
    now = plain(await client.call_tool(f"{prefix}get_current_time", {"timezone": "Europe/Oslo"}))
    return {"tools": listed, "conversions": conversions, "now": now}


@pytest.mark.parametrize("mode", MODES)
def test_the_time_server_answers_through_the_gateway_as_it_does_directly(start_gateway, mode):
    need_stdio_servers()
    gateway = start_gateway(time_config())

    direct = with_client(time_direct(), lambda client: time_session(client, ""), mode)
    through = with_client(gateway.url, lambda client: time_session(client, "time_"), mode)

    assert [tool["name"] for tool in direct["tools"]] == ["get_current_time", "convert_time"]
    assert unprefixed(through["tools"], "time") == direct["tools"]
    assert through["conversions"] == direct["conversions"]
    assert [answer["is_error"] for answer in direct["conversions"]] == [False, False, True]
    assert direct["conversions"][0]["structured_content"]["time_difference"] == "+8.0h"

    now_direct, now_through = direct["now"], through["now"]
    assert now_through.keys() == now_direct.keys()
    assert [item["type"] for item in now_through["content"]] == [item["type"] for item in now_direct["content"]]
    shown_direct, shown_through = now_direct["structured_content"], now_through["structured_content"]
    assert shown_through.keys() == shown_direct.keys() == {"timezone", "datetime", "day_of_week", "is_dst"}
    assert shown_through["timezone"] == shown_direct["timezone"] == "Europe/Oslo"
    assert json.loads(now_through["content"][0]["text"]) == shown_through  # the text is the structured answer
    apart = datetime.fromisoformat(shown_through["datetime"]) - datetime.fromisoformat(shown_direct["datetime"])
    assert abs(apart.total_seconds()) < CLOCK_SLACK


# -- server-memory, perUser --------------------------------------------------------------------


@pytest.fixture
def idp():
    provider = LocalIdP("stdio-idp").start()
    yield provider
    provider.stop()


def memory_config(idp: LocalIdP, files: Path) -> dict[str, Any]:
    node, args = memory_server()
    return {"name": "stdio-real",
            "incomingAuth": {"type": "oidc", "oidc": {"issuer": idp.issuer, "audience": AUDIENCE}},
            "backends": [{"name": "memory", "transport": "stdio", "scope": "perUser", "command": node, "args": args,
                          "env": {"MEMORY_FILE_PATH": f"{files}/{{user}}.json"}}]}


def memory_direct(path: Path) -> Any:
    import mcp

    node, args = memory_server()
    return mcp.StdioServerParameters(command=node, args=args, env={"MEMORY_FILE_PATH": str(path)})


def entities(person: str) -> list[dict[str, Any]]:
    return [{"name": f"{person}-notebook", "entityType": "thing", "observations": [f"belongs to {person}"]},
            {"name": f"{person}-garden", "entityType": "place", "observations": [f"{person} grows beans"]}]


async def memory_flow(client: Any, prefix: str, person: str) -> list[dict[str, Any]]:
    """One user's session: create entities and a relation, observe, search, read the graph."""
    answers = [
        await client.call_tool(f"{prefix}create_entities", {"entities": entities(person)}),
        await client.call_tool(f"{prefix}create_relations", {"relations": [
            {"from": f"{person}-notebook", "to": f"{person}-garden", "relationType": "describes"}]}),
        await client.call_tool(f"{prefix}add_observations", {"observations": [
            {"entityName": f"{person}-garden", "contents": ["sunny"]}]}),
        await client.call_tool(f"{prefix}search_nodes", {"query": "beans"}),
        await client.call_tool(f"{prefix}read_graph", {}),
    ]
    return [plain(answer) for answer in answers]


def graph_of(answers: list[dict[str, Any]]) -> dict[str, Any]:
    """read_graph's structured answer (the flow's last)."""
    return answers[-1]["structured_content"]


@pytest.mark.parametrize("mode", MODES)
def test_per_user_memory_servers_keep_each_users_graph_in_a_file_of_their_own(start_gateway, idp, tmp_path, mode):
    need_stdio_servers()
    files = tmp_path / "users"
    files.mkdir()
    gateway = start_gateway(memory_config(idp, files))
    tokens = {person: idp.issue_token(person, AUDIENCE) for person in ("alice", "bob")}

    flows = {person: with_client(gateway.url, lambda client, person=person: memory_flow(client, "memory_", person),
                                 mode, tokens[person])
             for person in ("alice", "bob")}

    for person, other in (("alice", "bob"), ("bob", "alice")):
        graph = graph_of(flows[person])
        assert {entity["name"] for entity in graph["entities"]} == {f"{person}-notebook", f"{person}-garden"}
        assert graph["relations"] == [{"from": f"{person}-notebook", "to": f"{person}-garden",
                                       "relationType": "describes"}]
        assert other not in json.dumps(graph)
        # read again in a new session: the user's process (or its file) still has it, and nothing else
        again = with_client(gateway.url, lambda client: client.call_tool("memory_read_graph", {}), mode, tokens[person])
        assert plain(again)["structured_content"] == graph

    digests = {person: user_digest((idp.issuer, person)) for person in ("alice", "bob")}
    # each file where its {user} path says (a link into the sandbox's directory of that user's own)
    assert sorted(path.name for path in files.iterdir() if path.name != ".vmcp-sandbox") == \
        sorted(f"{digest}.json" for digest in digests.values())
    for person, other in (("alice", "bob"), ("bob", "alice")):
        stored = (files / f"{digests[person]}.json").read_text()
        assert f"{person}-garden" in stored and other not in stored

    # the same flow, directly: the same answers, the same file
    direct_file = tmp_path / "direct.json"
    direct = with_client(memory_direct(direct_file), lambda client: memory_flow(client, "", "alice"), mode)
    assert flows["alice"] == direct
    assert (files / f"{digests['alice']}.json").read_text() == direct_file.read_text()


@pytest.mark.parametrize("mode", MODES)
def test_the_memory_servers_tools_through_the_gateway_are_the_servers_own(start_gateway, idp, tmp_path, mode):
    need_stdio_servers()
    gateway = start_gateway(memory_config(idp, tmp_path))

    async def tools(client: Any) -> list[dict[str, Any]]:
        return [tool.model_dump(mode="json", exclude_none=True) for tool in (await client.list_tools()).tools]

    direct = with_client(memory_direct(tmp_path / "direct.json"), tools, mode)
    through = with_client(gateway.url, tools, mode, idp.issue_token("carol", AUDIENCE))
    assert "read_graph" in {tool["name"] for tool in direct}
    assert unprefixed(through, "memory") == direct
