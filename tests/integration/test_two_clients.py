"""Two clients at once, each with its own answers (issue 34: every 2025 client session is a
user of its own, with its own backend sessions).

Each cell runs two real clients (the official Python SDK's ``mcp.Client``), Ada and Bob,
at the same time (``asyncio.gather``): first straight to the backend, then through the
gateway. Each client answers the server's requests with its own callbacks, in words that
name it (Ada's model is ``ada-model``, her root ``file:///work/ada``). The direct run must
give each client exactly the cell's expected outcome, which names that client and no other
(so the test reads what the cell is about), and the gateway run must give each client what
the direct run gave it.

The callers: two client sessions of one anonymous person, and two OIDC users (tokens from
tests/idp.py). The backends (shared by the module's cells, both behind each gateway, whose
names it prefixes with ``<backend>_``): :class:`tests.asking_backends.PerSessionBackend`,
which keeps state per backend session and asks its client on the call's stream or on the
session's standalone stream (how the SDK sends ``ctx.session`` requests with no related
request: "outside the call"), and the resolver backend of tests/mrtr_backends.py, which asks
through resolvers (``input_required`` on 2026-07-28).

Two 2025 clients of one person shared one backend session before issue 34. The cells fail
on that design: a request a backend sends outside a call reaches the client whose stream
opened last (both calls meet at the backend first, so both are in flight), the shared
session's log level is the last one set and its out-of-call messages reach both clients,
a resource update for one session reaches every subscriber of the URI, and the call count
is the pair's. Where a client must not hear something, it waits for a fence first: a
message the backend sends on the same stream after both clients are done, so anything
misrouted on a shared stream arrives before it.

The 2026-07-28 cells (the SDK client's default mode) are those that revision serves
directly: the resolver backend's questions, per-request log levels and progress (it has no
back-channel for ``ctx.session`` and no sessions). One 2025 cell's clients declare no
sampling, elicitation or roots: each still has a backend session of its own directly.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import mcp
import pykka
import pytest
from mcp import types
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from tests.asking_backends import LOGGED_LEVELS, OTHER_URI, UPDATED_BY, WATCHED_URI, per_session_backend
from tests.gateway import QuickStopGatewayServer, backend_entry
from tests.idp import LocalIdP
from tests.mrtr_backends import mrtr_backend

pytestmark = [
    pytest.mark.timeout(60),
    # the SDK deprecates logging, sampling, roots and resources/subscribe for 2026-07-28
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:.*deprecated as of 2026-07-28"),
    pytest.mark.filterwarnings("ignore:.*removed as of 2026-07-28"),
]

ADA, BOB = "ada", "bob"
PEOPLE = (ADA, BOB)
SESSIONS, RESOLVER = "sessions", "resolver"  # the backends' names
LEGACY, AUTO = "legacy", "auto"  # the SDK client's modes: a 2025 session; 2026-07-28 (server/discover first)
ANONYMOUS, OIDC = "anonymous", "oidc"  # the callers: one anonymous person; two OIDC users
AUDIENCE = "vmcp"

LEVELS = {ADA: "error", BOB: "debug"}  # each client's log level
ELICITED = {ADA: {"name": "Ada", "count": 1, "ok": True, "colour": "red"},
            BOB: {"name": "Bob", "count": 2, "ok": False, "colour": "green"}}
SUBSCRIBED = {ADA: (WATCHED_URI,), BOB: (WATCHED_URI, OTHER_URI)}

CALL_TIMEOUT = 15  # seconds a client waits for one call (the product waits 10 s for a stream at most)
WAIT_TIMEOUT = 10  # seconds a client waits for a notification, or for the other client
RUN_TIMEOUT = 25  # seconds for one client's whole run (a cell runs twice within the 60 s test timeout)


# -- the module's backends and gateways ---------------------------------------------------


@pytest.fixture(autouse=True)
def stop_all_actors():
    """Overrides the conftest fixture: the module's gateways serve every cell, so their
    actors outlive a test; everything stops at the end of the module."""
    yield


@pytest.fixture(scope="module", autouse=True)
def stop_actors_after_module():
    yield
    pykka.ActorRegistry.stop_all(block=True, timeout=5)


class Served:
    """The backends, a gateway for anonymous callers and one for OIDC users, and the IdP."""

    def __init__(self) -> None:
        self.backends: dict[str, Any] = {}
        self.gateways: dict[str, QuickStopGatewayServer] = {}
        self.idp: LocalIdP | None = None

    def start(self) -> Served:
        self.backends[SESSIONS] = per_session_backend(SESSIONS)
        self.backends[RESOLVER] = mrtr_backend(RESOLVER)
        self.idp = LocalIdP().start()
        entries = [backend_entry(name, backend) for name, backend in self.backends.items()]
        self.gateways[ANONYMOUS] = QuickStopGatewayServer({"name": "two-clients", "backends": entries}).start()
        self.gateways[OIDC] = QuickStopGatewayServer({
            "name": "two-clients", "backends": entries,
            "incomingAuth": {"type": "oidc", "oidc": {"issuer": self.idp.issuer, "audience": AUDIENCE}}}).start()
        return self

    def stop(self) -> None:
        for gateway in self.gateways.values():
            gateway.stop()
        for backend in self.backends.values():
            backend.stop()
        if self.idp is not None:
            self.idp.stop()

    def headers(self, caller: str) -> dict[str, dict[str, str]]:
        """Each client's HTTP headers: an OIDC user's bearer token (sent directly too)."""
        if caller == ANONYMOUS:
            return {who: {} for who in PEOPLE}
        return {who: {"Authorization": f"Bearer {self.idp.issue_token(who, AUDIENCE)}"} for who in PEOPLE}


@pytest.fixture(scope="module")
def served():
    started = Served()
    try:
        yield started.start()
    finally:
        started.stop()


@dataclass(frozen=True)
class Target:
    """Where a run's clients connect, and the name a backend's tool has there."""

    urls: dict[str, str]  # backend name -> the URL its tools are called at (one URL through the gateway)
    headers: dict[str, dict[str, str]]
    prefixed: bool  # through the gateway: `<backend>_<tool>`

    def tool(self, backend: str, name: str) -> str:
        return f"{backend}_{name}" if self.prefixed else name


# -- one client of the pair ---------------------------------------------------------------


def _dump(value: Any) -> Any:
    return value.model_dump(by_alias=True, mode="json", exclude_none=True)


class Pair:
    """What the two clients of one run share: a name for their meetings at the backend
    (where a call waits for the other client's), and a barrier."""

    def __init__(self) -> None:
        self.meeting = uuid.uuid4().hex
        self._barrier = asyncio.Barrier(len(PEOPLE))

    async def together(self) -> None:
        """Until the other client got here too (a client that failed breaks it)."""
        await asyncio.wait_for(self._barrier.wait(), WAIT_TIMEOUT)

    async def broken(self) -> None:
        """A client failed: the other one stops waiting for it."""
        await self._barrier.abort()


class Client:
    """One client session of the pair, answering as ``who``: what it was asked and heard."""

    def __init__(self, who: str, target: Target) -> None:
        self.who = who
        self.target = target
        self.session: mcp.Client | None = None
        self.asked: list[dict[str, Any]] = []  # the server's requests, in arrival order
        self.heard: list[dict[str, Any]] = []  # log messages and resource updates, in arrival order
        self._more = asyncio.Event()
        self._standalone_open = asyncio.Event()  # the server answered the session's GET

    # -- the client's own answers -------------------------------------------------------

    async def sampling(self, context: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        text = params.messages[0].content.text
        self.asked.append({"method": "sampling/createMessage", "text": text})
        return types.CreateMessageResult(role="assistant", model=f"{self.who}-model",
                                         content=types.TextContent(type="text", text=f"{self.who} answers {text!r}"))

    async def elicitation(self, context: Any, params: Any) -> types.ElicitResult:
        self.asked.append({"method": "elicitation/create", "text": params.message})
        return types.ElicitResult(action="accept", content=ELICITED[self.who])

    async def roots(self, context: Any) -> types.ListRootsResult:
        self.asked.append({"method": "roots/list"})
        return types.ListRootsResult(roots=[types.Root(uri=f"file:///work/{self.who}", name=self.who)])

    async def on_message(self, message: Any) -> None:
        if isinstance(message, Exception):
            return
        dumped = _dump(message)
        if isinstance(dumped, dict) and dumped.get("method") in ("notifications/message",
                                                                 "notifications/resources/updated"):
            self.heard.append(dumped)
            self._more.set()

    async def on_response(self, response: Any) -> None:
        """An HTTP response hook: the SDK opens the standalone stream in the background."""
        if response.request.method == "GET" and response.status_code == 200:
            self._standalone_open.set()

    # -- steps ----------------------------------------------------------------------------

    async def streams_open(self) -> None:
        """Until the server answered the standalone stream: from then on what it sends
        outside a call reaches this client (through the gateway: once the gateway's own
        streams to the backends are open)."""
        await asyncio.wait_for(self._standalone_open.wait(), WAIT_TIMEOUT)

    async def call(self, backend: str, name: str, arguments: dict[str, Any], progress: bool = False) -> dict[str, Any]:
        seen: list[list[Any]] = []

        async def on_progress(value: float, total: float | None, message: str | None) -> None:
            seen.append([value, total, message])

        try:
            result = await asyncio.wait_for(self.session.call_tool(
                self.target.tool(backend, name), arguments,
                progress_callback=on_progress if progress else None), CALL_TIMEOUT)
        except mcp.MCPError as error:
            outcome: dict[str, Any] = {"error": _dump(error.error)}
        except TimeoutError:
            outcome = {"timeout": CALL_TIMEOUT}
        else:
            outcome = {"text": "".join(block.text for block in result.content if block.type == "text")}
            if result.is_error:
                outcome["isError"] = True
        if progress:
            outcome["progress"] = seen
        return outcome

    async def until(self, condition: Callable[[], bool]) -> bool:
        """Until ``condition`` holds of what was heard; False after WAIT_TIMEOUT."""

        async def wait() -> None:
            while not condition():
                self._more.clear()
                await self._more.wait()

        try:
            await asyncio.wait_for(wait(), WAIT_TIMEOUT)
        except TimeoutError:
            return False
        return True

    async def fence(self, pair: Pair) -> dict[str, Any]:
        """Once both clients are done: the backend's emergency log message on this
        client's standalone stream, heard. Whatever a shared stream carried for the other
        client came before it."""
        await pair.together()
        fenced = await self.call(SESSIONS, "fence", {"who": self.who})
        if not await self.until(lambda: [self.who, "emergency", f"{self.who} fence"] in self.logged()):
            return {**fenced, "heard": False}
        return fenced

    def logged(self) -> list[list[str]]:
        """The log messages heard, as [who, level, data], sorted: a call's stream and the
        standalone stream interleave as they will."""
        return sorted([self.who, note["params"]["level"], note["params"]["data"]]
                      for note in self.heard if note["method"] == "notifications/message")

    def updates(self) -> list[list[str]]:
        """The resource updates heard, in arrival order, as [uri, who the backend says caused it]."""
        return [[note["params"]["uri"], note["params"].get("_meta", {}).get(UPDATED_BY)]
                for note in self.heard if note["method"] == "notifications/resources/updated"]


# -- the cells ----------------------------------------------------------------------------

Play = Callable[[Client, Pair], Awaitable[dict[str, Any]]]


@dataclass(frozen=True)
class Cell:
    name: str
    mode: str  # LEGACY or AUTO
    backend: str  # the backend the clients connect to directly
    play: Play
    expected: Callable[[str], dict[str, Any]]  # who -> what that client must get, directly and through the gateway
    callbacks: bool = True  # the clients declare sampling, elicitation and roots (each answering as itself)

    @property
    def id(self) -> str:
        return f"{self.name}/{self.mode}"


def asking(what: str, where: str) -> tuple[Play, Callable[[str], dict[str, Any]]]:
    """The backend asks each client for ``what``, on the call's stream or outside it, while
    both calls are in flight (they meet at the backend first)."""

    async def play(client: Client, pair: Pair) -> dict[str, Any]:
        await client.streams_open()
        answer = await client.call(SESSIONS, "ask", {"who": client.who, "what": what, "where": where,
                                                     "meet_at": pair.meeting})
        return {"answer": answer, "asked": client.asked}

    def expected(who: str) -> dict[str, Any]:
        answer, asked = {
            "sampling": (f"{who}-model: {who} answers '{who} asks'",
                         {"method": "sampling/createMessage", "text": f"{who} asks"}),
            "elicitation": (f"accept: {ELICITED[who]}", {"method": "elicitation/create", "text": f"{who}, who are you?"}),
            "roots": (f"file:///work/{who}", {"method": "roots/list"}),
        }[what]
        return {"answer": {"text": f"{who} asked for {what} {where}: {answer}"}, "asked": [asked]}

    return play, expected


def resolved(tool: str, arguments: Callable[[str], dict[str, Any]], answer: Callable[[str], str],
             asked: Callable[[str], list[dict[str, Any]]]) -> tuple[Play, Callable[[str], dict[str, Any]]]:
    """The resolver backend asks each client inside its call (2026-07-28: input_required)."""

    async def play(client: Client, pair: Pair) -> dict[str, Any]:
        return {"answer": await client.call(RESOLVER, tool, arguments(client.who)), "asked": client.asked}

    def expected(who: str) -> dict[str, Any]:
        return {"answer": {"text": answer(who)}, "asked": asked(who)}

    return play, expected


def _logged(who: str, *, fence: bool) -> list[list[str]]:
    lines = [[who, level, f"{who} {level} {where}"] for level in LOGGED_LEVELS[LOGGED_LEVELS.index(LEVELS[who]):]
             for where in ("in the call", "outside the call")]
    return sorted(lines + ([[who, "emergency", f"{who} fence"]] if fence else []))


async def play_logging(client: Client, pair: Pair) -> dict[str, Any]:
    """Each client sets its own level; the backend logs at four levels in the call and
    outside it (the standalone stream); each client hears only its own, at its own level."""
    await client.streams_open()
    await client.session.set_logging_level(LEVELS[client.who])
    await pair.together()  # both levels are set before either client's call
    result = await client.call(SESSIONS, "logs", {"who": client.who})
    fenced = await client.fence(pair)
    return {"result": result, "fence": fenced, "logged": client.logged()}


def expected_logging(who: str) -> dict[str, Any]:
    return {"result": {"text": f"{who} logged"}, "fence": {"text": f"{who} fenced"}, "logged": _logged(who, fence=True)}


async def play_logging_per_request(client: Client, pair: Pair) -> dict[str, Any]:
    """2026-07-28: each client's level rides each of its requests (``log_level``)."""
    return {"result": await client.call(SESSIONS, "logs", {"who": client.who}), "logged": client.logged()}


def expected_logging_per_request(who: str) -> dict[str, Any]:
    # On 2026-07-28 the backend sends what it would send outside the call on the call's stream.
    return {"result": {"text": f"{who} logged"}, "logged": _logged(who, fence=False)}


async def play_subscriptions(client: Client, pair: Pair) -> dict[str, Any]:
    """Both subscribe to the watched resource, Bob to another one too. Twice, each calls
    ``touch_subscribed``: the backend tells the calling client's backend session of the
    URIs it subscribed (outside the call); the second round is the first's fence."""
    await client.streams_open()
    mine = SUBSCRIBED[client.who]
    for uri in mine:
        await client.session.subscribe_resource(uri)
    await pair.together()  # both subscribed before either touches
    touched = []
    for round_ in (1, 2):
        touched.append(await client.call(SESSIONS, "touch_subscribed", {"who": client.who}))
        if not await client.until(lambda: sum(by == client.who for _, by in client.updates()) >= round_ * len(mine)):
            touched.append({"heard": False})
        await pair.together()
    return {"touched": touched, "updates": client.updates()}


def expected_subscriptions(who: str) -> dict[str, Any]:
    updates = [[uri, who] for uri in SUBSCRIBED[who]]
    touched = {"text": f"{who} touched {len(SUBSCRIBED[who])}"}
    return {"touched": [touched, touched], "updates": updates + updates}


async def play_progress(client: Client, pair: Pair) -> dict[str, Any]:
    """Both calls report progress with the same progress token (each client's request id)
    while both are in flight."""
    return {"call": await client.call(SESSIONS, "progress_for", {"who": client.who, "steps": 3,
                                                                 "meet_at": pair.meeting}, progress=True)}


async def play_progress_legacy(client: Client, pair: Pair) -> dict[str, Any]:
    await client.streams_open()
    return await play_progress(client, pair)


def expected_progress(who: str) -> dict[str, Any]:
    return {"call": {"text": f"{who} progressed",
                     "progress": [[step, 3, f"{who} step {step}"] for step in (1, 2, 3)]}}


async def play_count(client: Client, pair: Pair) -> dict[str, Any]:
    """The backend counts each backend session's calls: each client's count is its own."""
    await client.streams_open()
    first = await client.call(SESSIONS, "count", {})
    await pair.together()  # both counted once before either counts again
    return {"counts": [first, await client.call(SESSIONS, "count", {})]}


def expected_count(who: str) -> dict[str, Any]:
    return {"counts": [{"text": "call 1 of this session"}, {"text": "call 2 of this session"}]}


def _cells() -> list[Cell]:
    cells = [Cell(f"{what}-{'in-call' if where == 'call' else 'outside-call'}", LEGACY, SESSIONS, *asking(what, where))
             for what in ("sampling", "elicitation", "roots") for where in ("call", "outside")]
    cells += [
        Cell("logging", LEGACY, SESSIONS, play_logging, expected_logging),
        Cell("subscriptions", LEGACY, SESSIONS, play_subscriptions, expected_subscriptions),
        Cell("progress", LEGACY, SESSIONS, play_progress_legacy, expected_progress),
        Cell("session-state", LEGACY, SESSIONS, play_count, expected_count),
        # Clients that take no requests from servers: a backend session each all the same.
        Cell("session-state-no-callbacks", LEGACY, SESSIONS, play_count, expected_count, callbacks=False),
        # 2026-07-28: the resolver backend's questions, per-request log levels, progress.
        Cell("sampling-in-call", AUTO, RESOLVER, *resolved(
            "summarize", lambda who: {"text": who}, lambda who: f"summary: {who} answers 'Summarize: {who}'",
            lambda who: [{"method": "sampling/createMessage", "text": f"Summarize: {who}"}])),
        Cell("elicitation-in-call", AUTO, RESOLVER, *resolved(
            "two_steps", lambda who: {}, lambda who: f"{ELICITED[who]['name']} likes {ELICITED[who]['colour']}",
            lambda who: [{"method": "elicitation/create", "text": "Your name?"},
                         {"method": "elicitation/create", "text": f"Favourite colour, {ELICITED[who]['name']}?"}])),
        Cell("roots-in-call", AUTO, RESOLVER, *resolved(
            "roots", lambda who: {}, lambda who: f"file:///work/{who}", lambda who: [{"method": "roots/list"}])),
        Cell("logging", AUTO, SESSIONS, play_logging_per_request, expected_logging_per_request),
        Cell("progress", AUTO, SESSIONS, play_progress, expected_progress),
    ]
    return cells


CELLS = _cells()


# -- running a pair -----------------------------------------------------------------------


def run_pair(cell: Cell, target: Target) -> dict[str, dict[str, Any]]:
    """Both clients at once, each playing the cell; each one's outcome."""

    async def connected(client: Client, pair: Pair) -> dict[str, Any]:
        http = create_mcp_http_client(headers=target.headers[client.who])
        http.event_hooks["response"].append(client.on_response)
        answers = {"sampling_callback": client.sampling, "elicitation_callback": client.elicitation,
                   "list_roots_callback": client.roots} if cell.callbacks else {}
        async with http, mcp.Client(streamable_http_client(target.urls[cell.backend], http_client=http),
                                    mode=cell.mode, message_handler=client.on_message, **answers,
                                    log_level=LEVELS[client.who] if cell.mode == AUTO else None) as session:
            client.session = session
            return await cell.play(client, pair)

    async def one(who: str, pair: Pair) -> dict[str, Any]:
        client = Client(who, target)
        try:
            return await asyncio.wait_for(connected(client, pair), RUN_TIMEOUT)
        except Exception as error:  # noqa: BLE001 - the outcome says what failed; the other client stops waiting
            await pair.broken()
            return {"failed": f"{type(error).__name__}: {error}", "asked": client.asked, "heard": client.heard}

    async def both() -> list[dict[str, Any]]:
        pair = Pair()
        return await asyncio.gather(*(one(who, pair) for who in PEOPLE))

    return dict(zip(PEOPLE, asyncio.run(both()), strict=True))


@pytest.mark.parametrize("caller", [ANONYMOUS, OIDC])
@pytest.mark.parametrize("cell", CELLS, ids=[cell.id for cell in CELLS])
def test_each_client_gets_its_own_answers(cell: Cell, caller: str, served: Served) -> None:
    headers = served.headers(caller)
    direct = run_pair(cell, Target({name: backend.mcp_url for name, backend in served.backends.items()},
                                   headers, prefixed=False))
    for who in PEOPLE:
        assert direct[who] == cell.expected(who), f"{cell.id}: directly, {who} got {direct[who]}"
    gateway = served.gateways[caller]
    through = run_pair(cell, Target({name: gateway.url for name in served.backends}, headers, prefixed=True))
    for who in PEOPLE:
        assert through[who] == direct[who], \
            f"{cell.id} ({caller}): through the gateway {who} got {through[who]}, directly {direct[who]}"
