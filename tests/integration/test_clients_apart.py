"""Every 2025 client session apart (issue 34), with real servers and the official SDK client,
compared with the same client connected directly where the server decides what is right:

* ``@modelcontextprotocol/server-filesystem`` as a ``perSession`` stdio backend: two
  clients at once, each with its own roots, are each allowed their own directory, as
  directly; on a ``shared`` child no client is asked, the child keeps its command-line
  directory, and the gateway's log says why; sessions starting a shared child at once all
  get answers.
* ``@modelcontextprotocol/server-sequential-thinking`` (``perSession``): one thought history
  per client session.
* server-everything's progress reaches a 2026-07-28 client as it reaches a direct one.
* Backends that never answer ``initialize`` or exit at once, beside a good one, under
  ``discoveryBudget``: new sessions answer with the good backend's tools within the budget,
  the dead backends back off, a call of their tools names them, and a backend that joins
  late is announced with ``notifications/tools/list_changed``, as is a stdio child's own
  list change.
* A client's ``extensions`` capability reaches an HTTP backend and a perSession child as
  it does directly.

``scripts/install-stdio-servers`` and ``scripts/install-node-mcp`` install the Node servers
(skipped without them, failed under CI).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
import queue
import sys
import textwrap
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import mcp
import pytest
import requests
from mcp import types
from mcp.client import advertise

from tests.backends import SdkBackend, sdk_backend
from tests.gateway import StreamReader, admin_get, backend_entry, wait_until
from tests.stdio_servers import filesystem_server, need_stdio_servers, sequential_thinking_server

pytestmark = [
    pytest.mark.timeout(90),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]

T = TypeVar("T")
SERVER_INFO = "io.modelcontextprotocol/serverInfo"  # who answered: the gateway names itself, not its backend
ROOTS_WAIT = 20.0  # s a client waits to be asked for its roots: a child's early request may wait 10 s for its stream
STDERR_RELAY = "vmcp_actors.backends.stderr"  # the children's stderr, relayed: their words, not the gateway's


def run(work: Callable[[], Awaitable[T]], timeout: float = 60.0) -> T:
    try:
        return asyncio.run(asyncio.wait_for(work(), timeout))
    except BaseExceptionGroup as group:  # the SDK client's task groups wrap what the work raised
        raise leaf(group) from group


def leaf(error: BaseException) -> BaseException:
    """The first error inside (nested) exception groups."""
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    return error


def plain(result: Any) -> dict[str, Any]:
    """A result as JSON, without the answering server's name (the only field allowed to differ)."""
    dumped = result.model_dump(mode="json", exclude_none=True)
    meta = {key: value for key, value in dumped.pop("meta", {}).items() if key != SERVER_INFO}
    return {**dumped, "meta": meta} if meta else dumped


def stdio_params(command: tuple[str, list[str]], env: dict[str, str] | None = None) -> mcp.StdioServerParameters:
    """The same server, for a direct connection."""
    node, args = command
    return mcp.StdioServerParameters(command=node, args=args, env=env or {})


# -- server-filesystem: roots ------------------------------------------------------------------


class RootsClient:
    """A client whose only root is ``root``; ``asked`` is set when a server asks for it."""

    def __init__(self, root: Path):
        self.root = root
        self.asked = asyncio.Event()
        self.times_asked = 0

    async def roots(self, context: Any) -> types.ListRootsResult:
        self.times_asked += 1
        self.asked.set()
        return types.ListRootsResult(roots=[types.Root(uri=self.root.as_uri(), name=self.root.name)])

    def connect(self, target: Any) -> mcp.Client:
        return mcp.Client(target, mode="legacy", list_roots_callback=self.roots)


@pytest.fixture
def files(tmp_path: Path) -> Path:
    """``files`` with ``sub`` and ``other``, each holding a note naming it."""
    top = (tmp_path / "files").resolve()  # the server resolves symlinks: compare real paths
    for name in ("sub", "other"):
        (top / name).mkdir(parents=True)
        (top / name / "note.txt").write_text(f"the note in {name}\n")
    return top


def filesystem_config(files: Path, scope: str) -> dict[str, Any]:
    node, args = filesystem_server(str(files))
    return {"name": "apart", "backends": [{"name": "files", "transport": "stdio", "command": node, "args": args,
                                           "scope": scope}]}


def allowed(text: str) -> str:
    """What ``list_allowed_directories`` answers for ``text`` (one directory)."""
    return f"Allowed directories:\n{text}"


async def allowed_now(client: mcp.Client, prefix: str) -> str:
    return (await client.call_tool(f"{prefix}list_allowed_directories", {})).content[0].text


async def allowed_once_asked(client: mcp.Client, asker: RootsClient, prefix: str) -> str:
    """``list_allowed_directories`` once the server asked for the client's roots and applied
    them (the server asks after ``initialize`` and applies the answer on its own time)."""
    try:
        await asyncio.wait_for(asker.asked.wait(), ROOTS_WAIT)
    except asyncio.TimeoutError:
        raise AssertionError(f"the server never asked the client with root {asker.root} for its roots "
                             f"(within {ROOTS_WAIT:g}s)") from None
    deadline = time.monotonic() + ROOTS_WAIT
    while True:
        text = await allowed_now(client, prefix)
        if text == allowed(str(asker.root)) or time.monotonic() > deadline:
            return text
        await asyncio.sleep(0.05)  # polling the server's state, as wait_until does


async def what_each_client_may_do(target: Callable[[], Any], prefix: str, clients: list[RootsClient],
                                  directories: Callable[[mcp.Client, RootsClient], Awaitable[str]]
                                  ) -> list[dict[str, Any]]:
    """Both clients connected at once (the second connects once the first has been answered:
    a shared child is started by one session; several starting it at once is a test of its
    own); then, for each: the directories it is allowed, and reading the note in its own
    root and in the other's."""
    first, second = clients

    async def observe(client: mcp.Client, asker: RootsClient, other: RootsClient) -> dict[str, Any]:
        return {"allowed": await directories(client, asker),
                "own": plain(await client.call_tool(f"{prefix}read_text_file", {"path": str(asker.root / "note.txt")})),
                "other": plain(await client.call_tool(f"{prefix}read_text_file",
                                                      {"path": str(other.root / "note.txt")}))}

    async with first.connect(target()) as one:
        await allowed_now(one, prefix)  # its server is up (and was told the client's capabilities)
        async with second.connect(target()) as two:
            return list(await asyncio.gather(observe(one, first, second), observe(two, second, first)))


def refusals(caplog: pytest.LogCaptureFixture, method: str) -> list[str]:
    """The gateway's own warnings about a backend's request ``method`` it refused."""
    return [record.getMessage() for record in caplog.records
            if record.name.startswith("vmcp_actors") and record.name != STDERR_RELAY
            and record.levelno >= logging.WARNING and method in record.getMessage()
            and "refused" in record.getMessage()]


def test_each_client_session_gets_a_filesystem_server_that_honours_its_own_roots(start_gateway, files, caplog):
    """perSession: each client's child asks that client for its roots (right after
    initialize, before the client's stream is there) and is allowed only that root, as a
    child the client starts itself would be."""
    need_stdio_servers()
    caplog.set_level(logging.INFO, logger="vmcp_actors")
    gateway = start_gateway(filesystem_config(files, "perSession"))
    server = stdio_params(filesystem_server(str(files)))

    def each_may_do(target: Callable[[], Any], prefix: str, clients: list[RootsClient]) -> list[dict[str, Any]]:
        return run(lambda: what_each_client_may_do(target, prefix, clients,
                                                   lambda client, asker: allowed_once_asked(client, asker, prefix)))

    direct = each_may_do(lambda: server, "", [RootsClient(files / "sub"), RootsClient(files / "other")])
    assert [seen["allowed"] for seen in direct] == [allowed(str(files / "sub")), allowed(str(files / "other"))]
    assert [seen["own"]["is_error"] for seen in direct] == [False, False]
    assert [seen["other"]["is_error"] for seen in direct] == [True, True]  # outside its roots: refused

    clients = [RootsClient(files / "sub"), RootsClient(files / "other")]
    assert each_may_do(lambda: gateway.url, "files_", clients) == direct
    assert [asker.times_asked for asker in clients] == [1, 1]
    assert refusals(caplog, "roots/list") == []


def test_a_shared_filesystem_server_asks_no_client_for_roots_and_the_log_says_why(start_gateway, files, caplog):
    """shared: one child serves both clients, so its roots request, which no client's call
    carries, is refused; the child keeps its command-line directory for everyone (what
    perSession is for), and the gateway logs the refusal in its own words."""
    need_stdio_servers()
    caplog.set_level(logging.INFO, logger="vmcp_actors")
    gateway = start_gateway(filesystem_config(files, "shared"))
    clients = [RootsClient(files / "sub"), RootsClient(files / "other")]

    async def through() -> list[dict[str, Any]]:
        return await what_each_client_may_do(lambda: gateway.url, "files_", clients,
                                             lambda client, asker: allowed_now(client, "files_"))

    seen = run(through)
    assert [asker.times_asked for asker in clients] == [0, 0]
    assert [each["allowed"] for each in seen] == [allowed(str(files))] * 2  # nobody's own root
    assert [each["other"]["is_error"] for each in seen] == [False, False]  # each may read the other's note
    assert wait_until(lambda: refusals(caplog, "roots/list"), 5), \
        ("no warning of the gateway's says it refused the shared child's roots/list; what the child said: "
         f"{[r.getMessage() for r in caplog.records if r.name == STDERR_RELAY]}")
    assert all("'files'" in message for message in refusals(caplog, "roots/list"))


def test_sessions_starting_a_shared_child_at_once_all_get_answers(start_gateway, files):
    """Four new sessions whose first requests reach a shared child that is not running yet:
    one starts and initializes it, the others wait for that and are answered too."""
    need_stdio_servers()
    gateway = start_gateway(filesystem_config(files, "shared"))

    async def one() -> str:
        async with mcp.Client(gateway.url, mode="legacy") as client:
            return await allowed_now(client, "files_")

    async def at_once() -> list[Any]:
        answers = await asyncio.gather(*(one() for _ in range(4)), return_exceptions=True)
        return [repr(leaf(answer)) if isinstance(answer, BaseException) else answer for answer in answers]

    assert run(at_once) == [allowed(str(files))] * 4


# -- server-sequential-thinking: one history per session ---------------------------------------


THINKING_ENV = {"DISABLE_THOUGHT_LOGGING": "true"}


def thought(number: int) -> dict[str, Any]:
    return {"thought": f"thought {number}", "nextThoughtNeeded": True, "thoughtNumber": number, "totalThoughts": 5}


def test_each_client_session_keeps_its_own_sequential_thinking_history(start_gateway):
    """perSession: a session's first thought is the first of its history, however many the
    session beside it (still open) has made, as with a server of its own."""
    need_stdio_servers()
    node, args = sequential_thinking_server()
    gateway = start_gateway({"name": "apart", "backends": [
        {"name": "thinking", "transport": "stdio", "command": node, "args": args, "env": THINKING_ENV,
         "scope": "perSession"}]})
    tool = "thinking_sequentialthinking"

    async def directly() -> dict[str, Any]:
        async with mcp.Client(stdio_params((node, args), THINKING_ENV), mode="legacy") as client:
            return plain(await client.call_tool("sequentialthinking", thought(1)))

    async def through() -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any]]:
        async with mcp.Client(gateway.url, mode="legacy") as busy:
            made = [plain(await busy.call_tool(tool, thought(number))) for number in (1, 2)]
            async with mcp.Client(gateway.url, mode="legacy") as fresh:
                first = plain(await fresh.call_tool(tool, thought(1)))
            third = plain(await busy.call_tool(tool, thought(3)))
        return made, first, third

    made, first, third = run(through)
    history = [answer["structured_content"]["thoughtHistoryLength"] for answer in (*made, third)]
    assert history == [1, 2, 3]  # the busy session's history went on, untouched by the fresh one
    assert first["structured_content"]["thoughtHistoryLength"] == 1
    assert first == run(directly)


# -- server-everything: progress to a 2026-07-28 client ----------------------------------------


def test_server_everythings_progress_reaches_a_2026_client_as_it_reaches_a_direct_one(start_gateway, everything):
    gateway = start_gateway({"name": "apart", "backends": [backend_entry("everything", everything)]})

    async def long_operation(target: str, name: str) -> tuple[str, list[tuple], dict[str, Any]]:
        heard: list[tuple] = []

        async def progress(done: float, total: float | None, message: str | None) -> None:
            heard.append((done, total, message))

        async with mcp.Client(target) as client:  # the default mode: 2026-07-28 where the server speaks it
            result = await client.call_tool(name, {"duration": 0.3, "steps": 3}, progress_callback=progress)
            return client.session.protocol_version, heard, plain(result)

    direct_version, direct_heard, direct = run(lambda: long_operation(everything.mcp_url,
                                                                      "trigger-long-running-operation"))
    version, heard, through = run(lambda: long_operation(gateway.url, "everything_trigger-long-running-operation"))
    assert version == "2026-07-28"
    assert direct_version != version  # server-everything speaks the 2025 revisions only: the gateway bridges
    assert direct_heard == [(1, 3, None), (2, 3, None), (3, 3, None)]
    assert heard == direct_heard
    assert through == direct


# -- dead and slow backends under a discovery budget --------------------------------------------


HANGING = "import sys\nfor _line in sys.stdin:  # reads every request, answers none\n    pass\n"
EXITING = "raise SystemExit(3)\n"
# Answers initialize only once the cue file exists (the test decides when it joins), then one tool.
JOINING_LATE = textwrap.dedent('''
    import json, os, sys, time
    cue = sys.argv[1]
    for line in sys.stdin:
        message = json.loads(line)
        method, ident = message.get("method"), message.get("id")
        if ident is None:
            continue
        if method == "initialize":
            deadline = time.monotonic() + 60
            while not os.path.exists(cue) and time.monotonic() < deadline:
                time.sleep(0.02)
            result = {"protocolVersion": message["params"]["protocolVersion"], "capabilities": {"tools": {}},
                      "serverInfo": {"name": "late", "version": "1"}}
        elif method == "tools/list":
            result = {"tools": [{"name": "joined", "inputSchema": {"type": "object"}}]}
        elif method == "tools/call":
            result = {"content": [{"type": "text", "text": "joined late"}]}
        else:
            result = {}
        sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": ident, "result": result}) + "\\n")
        sys.stdout.flush()
''')


def next_heard(reader: StreamReader, timeout: float) -> dict[str, Any]:
    """The next message on a stream (AssertionError when none comes within ``timeout``)."""
    try:
        return reader.next(timeout=timeout)
    except queue.Empty:
        raise AssertionError(f"the session's stream heard nothing within {timeout:g}s") from None


def script(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / f"{name}.py"
    path.write_text(text, encoding="utf-8")
    return str(path)


def stdio_entry(name: str, path: str, scope: str, *args: str) -> dict[str, Any]:
    return {"name": name, "transport": "stdio", "command": sys.executable, "args": [path, *args], "scope": scope}


@pytest.fixture
def good():
    backend = sdk_backend("good", tools=["echo"])
    yield backend
    backend.stop()


def dead_backends_config(tmp_path: Path, good: Any, scope: str, budget: float, stuck_timeout: float) -> dict[str, Any]:
    """``good`` beside ``hang`` (never answers initialize) and ``dead`` (exits at once)."""
    return {"name": "apart",
            "backends": [backend_entry("good", good),
                         stdio_entry("hang", script(tmp_path, "hang", HANGING), scope),
                         stdio_entry("dead", script(tmp_path, "dead", EXITING), scope)],
            "aggregation": {"conflictResolution": "prefix"},  # hang_x, dead_x: names the tools would have
            "operational": {"discoveryBudget": {"default": f"{budget:g}s"},
                            "timeouts": {"perWorkload": {name: f"{stuck_timeout:g}s" for name in ("hang", "dead")}}}}


async def unknown_tool_error(client: mcp.Client, name: str) -> mcp.MCPError:
    try:
        await client.call_tool(name, {})
    except mcp.MCPError as error:
        return error
    raise AssertionError(f"calling {name} did not fail")


def names_backend(error: mcp.MCPError, backend: str) -> bool:
    """The error says the tool may be ``backend``'s, which is not available now."""
    data = error.error.data if isinstance(error.error.data, dict) else {}
    return f"backend {backend!r}" in error.error.message and backend in data.get("unavailableBackends", ())


BUDGET = 1.0  # s: discoveryBudget.default
STUCK_TIMEOUT = 10.0  # s: the dead backends' timeout, what a session waits without a budget or a back-off


@pytest.mark.parametrize("scope", ["shared", "perSession"])
def test_new_sessions_answer_within_the_budget_while_backends_are_dead_and_calls_name_them(
        start_gateway, good, tmp_path, scope, monkeypatch):
    """Ten new sessions in a row, each a user of its own: each lists the good backend's tools
    within the budget (plus a margin), and after the first the dead backends fail at once
    (their handshakes back off across sessions) instead of each session waiting the budget
    again. A call of a dead backend's tool says which backends are missing, and the admin
    state shows the one backing off."""
    monkeypatch.setenv("APART_ADMIN_TOKEN", "apart-admin-token")
    gateway = start_gateway({**dead_backends_config(tmp_path, good, scope, BUDGET, STUCK_TIMEOUT),
                             "admin": {"tokenEnv": "APART_ADMIN_TOKEN"}})

    async def session(last: bool) -> tuple[float, list[str], list[mcp.MCPError]]:
        async with mcp.Client(gateway.url, mode="legacy") as client:
            started = time.monotonic()
            listed = [tool.name for tool in (await client.list_tools()).tools]
            took = time.monotonic() - started
            errors = [await unknown_tool_error(client, name) for name in ("hang_x", "dead_x")] if last else []
            return took, listed, errors

    async def sessions() -> list[tuple[float, list[str], list[mcp.MCPError]]]:
        return [await session(last=number == 9) for number in range(10)]

    seen = run(sessions, timeout=80)
    took = [round(each[0], 2) for each in seen]
    assert [each[1] for each in seen] == [["good_echo"]] * 10
    assert all(seconds < BUDGET + 3 for seconds in took), took
    assert sum(took) < 5 * STUCK_TIMEOUT, took  # all ten waiting out the stuck handshake: 10 × STUCK_TIMEOUT
    assert len([seconds for seconds in took if seconds < BUDGET]) >= 5, took  # most did not wait the budget
    hang_error, dead_error = seen[-1][2]
    assert names_backend(hang_error, "hang"), hang_error.error
    assert names_backend(dead_error, "dead"), dead_error.error
    backing_off = admin_get(gateway, token="apart-admin-token").json()["backendBackoff"]
    assert "dead" in backing_off and backing_off["dead"]["failures"] >= 1, backing_off


def test_a_sessions_later_requests_do_not_wait_the_budget_again_while_a_handshake_hangs(
        start_gateway, good, tmp_path):
    """The first session answers its tools/list when the budget ends, while the stuck
    handshake goes on (for its timeout). Its next requests are answered from what was
    found: a good tool's call and a second list do not wait the budget again, and a call
    of a missing backend's tool (which waits for the discovery under way, as a client of
    the starting server would: here until the stuck handshake's 12 s timeout) names the
    backends missing now."""
    budget = 4.0  # a list that waits it twice (8 s) is told apart from one that waits it once, under load too
    gateway = start_gateway(dead_backends_config(tmp_path, good, "perSession", budget, 12.0))

    async def first_session() -> dict[str, Any]:
        async with mcp.Client(gateway.url, mode="legacy") as client:
            seen: dict[str, Any] = {}
            started = time.monotonic()
            seen["listed"] = [tool.name for tool in (await client.list_tools()).tools]
            seen["list took"] = time.monotonic() - started
            started = time.monotonic()
            seen["echo"] = (await client.call_tool("good_echo", {"text": "hi"})).content[0].text
            seen["call took"] = time.monotonic() - started
            seen["errors"] = [await unknown_tool_error(client, name) for name in ("hang_x", "dead_x")]
            started = time.monotonic()
            seen["listed again"] = [tool.name for tool in (await client.list_tools()).tools]
            seen["list again took"] = time.monotonic() - started
            return seen

    seen = run(first_session, timeout=85)
    timings = {key: round(value, 2) for key, value in seen.items() if key.endswith("took")}
    assert seen["listed"] == seen["listed again"] == ["good_echo"]
    assert seen["echo"] == "good:hi"
    assert seen["list took"] < budget + 2, timings
    # Waiting the budget again would take it (4 s) each time; what was found answers at once
    # (half the budget: a margin for a loaded machine, where one call took 1.2 s).
    assert seen["call took"] < budget / 2, timings
    assert seen["list again took"] < budget / 2, timings
    hang_error, dead_error = seen["errors"]
    assert names_backend(hang_error, "hang"), hang_error.error
    assert names_backend(dead_error, "dead"), dead_error.error


def late_joiner(start_gateway: Any, good: SdkBackend, tmp_path: Path) -> tuple[Any, Path]:
    """A gateway (discovery budget 1 s) over ``good`` and a perSession child, ``late``, that
    answers initialize once the returned cue file exists."""
    cue = tmp_path / "join-now"
    return start_gateway({"name": "apart",
                          "backends": [backend_entry("good", good),
                                       {**stdio_entry("late", script(tmp_path, "late", JOINING_LATE), "perSession",
                                                      str(cue)),
                                        "sandbox": {"writable": [str(tmp_path)]}}],  # where its cue comes
                          "operational": {"discoveryBudget": {"default": "1s"}}}), cue


def test_a_backend_that_joins_after_the_budget_is_announced_on_the_sessions_stream(start_gateway, good, tmp_path):
    """tools/list answers with the good backend when the 1 s budget ends; the late one joins
    once its initialize is answered (on the test's cue), and the session's GET stream hears
    notifications/tools/list_changed; the next list has its tool, and it can be called."""
    gateway, cue = late_joiner(start_gateway, good, tmp_path)
    session = gateway.initialize()

    listed = gateway.rpc(session, "tools/list")
    assert [tool["name"] for tool in listed["result"]["tools"]] == ["good_echo"]
    stream = requests.get(gateway.url, headers={"Accept": "text/event-stream", "Mcp-Session-Id": session},
                          stream=True, timeout=30)  # answered once the backends' streams are open (or 5 s later)
    reader = StreamReader(stream)
    try:
        assert stream.status_code == 200
        cue.touch()
        heard = next_heard(reader, 20)
    finally:
        reader.close()
    assert heard == {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}
    listed = gateway.rpc(session, "tools/list")
    assert [tool["name"] for tool in listed["result"]["tools"]] == ["good_echo", "late_joined"]
    called = gateway.rpc(session, "tools/call", {"name": "late_joined", "arguments": {}})
    assert called["result"]["content"] == [{"type": "text", "text": "joined late"}]


def test_a_call_of_a_tool_whose_backend_is_still_starting_waits_for_it(start_gateway, good, tmp_path, caplog):
    """The list was answered when the 1 s budget ended, without the late backend; a call of
    its tool then waits for the discovery under way (as a client connected to the starting
    server would wait for it), instead of answering "Unknown tool"."""
    caplog.set_level(logging.DEBUG, logger="vmcp_actors.core._dispatch")
    gateway, cue = late_joiner(start_gateway, good, tmp_path)
    session = gateway.initialize()
    listed = gateway.rpc(session, "tools/list")
    assert [tool["name"] for tool in listed["result"]["tools"]] == ["good_echo"]
    answers: queue.Queue[dict[str, Any]] = queue.Queue()
    caller = threading.Thread(target=lambda: answers.put(
        gateway.rpc(session, "tools/call", {"name": "late_joined", "arguments": {}})))
    caller.start()
    try:
        assert wait_until(lambda: "tools/call of 'late_joined' waits for the discovery under way" in caplog.text,
                          timeout=20)
    finally:
        cue.touch()
        caller.join(30)
    called = answers.get(timeout=1)
    assert called["result"]["content"] == [{"type": "text", "text": "joined late"}], called


# Adds a tool with each call, and says so (notifications/tools/list_changed) after its answer:
# outside any call, as servers do.
CHANGING = textwrap.dedent('''
    import json, sys
    tools = [{"name": "change", "inputSchema": {"type": "object"}}]
    for line in sys.stdin:
        message = json.loads(line)
        method, ident = message.get("method"), message.get("id")
        if ident is None:
            continue
        if method == "initialize":
            result = {"protocolVersion": message["params"]["protocolVersion"],
                      "capabilities": {"tools": {"listChanged": True}}, "serverInfo": {"name": "changing", "version": "1"}}
        elif method == "tools/list":
            result = {"tools": tools}
        elif method == "tools/call":
            tools = tools + [{"name": f"added{len(tools)}", "inputSchema": {"type": "object"}}]
            result = {"content": [{"type": "text", "text": "changed"}]}
        else:
            result = {}
        sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": ident, "result": result}) + "\\n")
        if method == "tools/call":
            sys.stdout.write(json.dumps({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}) + "\\n")
        sys.stdout.flush()
''')


@pytest.mark.parametrize("scope", ["shared", "perSession"])
def test_a_stdio_childs_own_list_change_reaches_the_sessions_stream_and_its_next_list(start_gateway, tmp_path, scope):
    """A child that changes its tools says so outside any call: the session with a GET
    stream open hears it, and its next list has the new tool."""
    gateway = start_gateway({"name": "apart", "backends": [
        stdio_entry("changing", script(tmp_path, "changing", CHANGING), scope)]})
    session = gateway.initialize()
    assert [tool["name"] for tool in gateway.rpc(session, "tools/list")["result"]["tools"]] == ["changing_change"]
    stream = requests.get(gateway.url, headers={"Accept": "text/event-stream", "Mcp-Session-Id": session},
                          stream=True, timeout=30)
    reader = StreamReader(stream)
    try:
        assert stream.status_code == 200
        called = gateway.rpc(session, "tools/call", {"name": "changing_change", "arguments": {}})
        assert called["result"]["content"] == [{"type": "text", "text": "changed"}]
        heard = next_heard(reader, 10)
    finally:
        reader.close()
    assert heard == {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}
    assert wait_until(lambda: "changing_added1" in {
        tool["name"] for tool in gateway.rpc(session, "tools/list")["result"]["tools"]}, 10)


# -- client capabilities: extensions --------------------------------------------------------------


SEEN_SERVER = textwrap.dedent('''
    import json
    from mcp.server.mcpserver import Context, MCPServer

    server = MCPServer("seen", log_level="WARNING")

    @server.tool()
    def seen(ctx: Context) -> str:
        """The capabilities this server was told its client has."""
        capabilities = ctx.client_capabilities
        return json.dumps(capabilities.model_dump(mode="json", by_alias=True, exclude_none=True)
                          if capabilities is not None else None)

    if __name__ == "__main__":
        server.run()
''')
UI = "io.modelcontextprotocol/ui"
UI_SETTINGS = {"mimeTypes": ["text/html;profile=mcp-app"]}


@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_a_clients_extensions_reach_an_http_backend_and_a_per_session_child_as_directly(
        start_gateway, tmp_path, mode):
    path = script(tmp_path, "seen", SEEN_SERVER)
    spec = importlib.util.spec_from_file_location("seen_server", path)  # the same server, in this process, over HTTP
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    http = SdkBackend("http", module.server).start()
    try:
        gateway = start_gateway({"name": "apart",
                                 "backends": [backend_entry("http", http), stdio_entry("child", path, "perSession")],
                                 # a Python child may take seconds to start under load: wait for it
                                 "operational": {"discoveryBudget": {"default": "20s"}}})

        async def told(target: Any, tool: str) -> Any:
            async with mcp.Client(target, mode=mode, extensions=[advertise(UI, UI_SETTINGS)]) as client:
                return json.loads((await client.call_tool(tool, {})).content[0].text)

        direct_http = run(lambda: told(http.mcp_url, "seen"))
        direct_child = run(lambda: told(mcp.StdioServerParameters(command=sys.executable, args=[path]), "seen"))
        assert direct_http == direct_child == {"extensions": {UI: UI_SETTINGS}}
        assert run(lambda: told(gateway.url, "http_seen")) == direct_http
        assert run(lambda: told(gateway.url, "child_seen")) == direct_child
    finally:
        http.stop()
