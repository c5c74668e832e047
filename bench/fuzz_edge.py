"""Not in run_all: a fuzz of the gateway's client edge (issue 35). Seeded random messages
at the MCP endpoint in both revisions the edge speaks, each answer judged; then this
process's threads and a plain call.

* Backends (in this process): an official-SDK server (``plain``: echo, fail, structured),
  the SDK's multi-round-trip server (``asker``, tests/mrtr_backends.py: its 2026-07-28
  ``input_required`` comes back to clients under the gateway's sealed ``requestState``) and
  an SDK server that elicits mid-call (``asking``, tests/asking_backends.py, pinned
  ``protocol: legacy``: a 2026-07-28 client's call to it is parked for the client's retry).
* The gateway: tests.gateway.GatewayServer (werkzeug, in this process, so its threads are
  ``threading.active_count()`` and ``/proc/self/task`` here), OIDC with tests/idp.py's
  LocalIdP, two identities (alice, bob).
* Per revision ``--messages`` cases (default 10,000), each one fuzzed message (a few also
  send set-up and follow-up steps: a parked call, a 2025 call that asks the client, a
  session to delete), from ``--workers`` client threads. Case ``n`` is drawn from
  ``random.Random(seed)`` with ``seed = run seed * 1,000,000 + revision * 500,000 + n``,
  so a bad answer names the seed that makes it again: ``--replay SEED``.

A bad answer (``judge``): no answer at all; an HTTP 5xx; a 200 whose body is not a
JSON-RPC 2.0 response (or an SSE stream of JSON-RPC messages ending in one); a JSON-RPC
error -32603 or with a code outside EXPECTED_CODES; a forged, unasked or tampered
continuation (or client answer) that is served instead of refused; a 200 answer to a
well-formed request whose id is not the request's (an HTTP refusal before the body is read
may say null); traceback text, a source path or a backend URL in a body; a follow-up step
that must be served and is not. After the run the thread count must come back to within
THREAD_MARGIN of the count before (a bounded poll), and a plain ``tools/call`` must still
be answered in both revisions.

    .venv/bin/python -m bench.fuzz_edge [--seed 35] [--messages 10000] [--workers 4] [--replay SEED ...]
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import copy
import json
import os
import random
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import requests

from bench._common import ROOT, Check, print_header, run_benchmark, table
from vmcp_actors.core._tasks import TASKS_EXTENSION
from vmcp_actors.protocol import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    REQUEST_TIMEOUT,
    RESOURCE_NOT_FOUND,
    iter_sse_events,
)
from vmcp_actors.protocol.mcp import (
    HEADER_MISMATCH,
    LATEST_PROTOCOL_VERSION,
    LOGGING_LEVELS,
    MISSING_REQUIRED_CLIENT_CAPABILITY,
    MODERN_PROTOCOL_VERSION,
    NAME_HEADER_PARAMS,
    UNSUPPORTED_PROTOCOL_VERSION,
    encode_header_value,
)
from vmcp_actors.protocol.mcp import META_CLIENT_CAPABILITIES as META_CAPABILITIES
from vmcp_actors.protocol.mcp import META_CLIENT_INFO, META_LOG_LEVEL
from vmcp_actors.protocol.mcp import META_PROTOCOL_VERSION as META_VERSION

LEGACY, MODERN = LATEST_PROTOCOL_VERSION, MODERN_PROTOCOL_VERSION
REVISIONS = (LEGACY, MODERN)
AUDIENCE = "vmcp"
IDENTITIES = ("alice", "bob")
SESSIONS_PER_IDENTITY = 2  # plain 2025 sessions (declaring nothing) per identity
STATES_PER_IDENTITY = 6  # real requestStates (asker_confirm) per identity
THREAD_MARGIN = 3
THREAD_WAIT = 60.0  # seconds the thread count may take to come back (a parked call lasts its 30 s deadline)
REQUEST_TIMEOUT_S = 40.0  # longer than the gateway's 30 s request deadline: a hang shows as one
SEED_STRIDE, REVISION_STRIDE = 1_000_000, 500_000
WATCHDOG = 590.0

# Codes a client of the edge may get: JSON-RPC's own but -32603, MCP's, the 2026-07-28 header
# and revision errors. -32603 (internal error) is always a bad answer.
EXPECTED_CODES = frozenset({PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS, RESOURCE_NOT_FOUND,
                            REQUEST_TIMEOUT, HEADER_MISMATCH, MISSING_REQUIRED_CLIENT_CAPABILITY,
                            UNSUPPORTED_PROTOCOL_VERSION})
# How a forged continuation or client answer may be refused ("-32602 or similar").
REFUSAL_CODES = frozenset({INVALID_PARAMS, INVALID_REQUEST, HEADER_MISMATCH, METHOD_NOT_FOUND})
# Messages that get a known bad answer (reported in docs/benchmarks.md, reproduced by
# tests/security/test_edge_fuzz.py, xfail strict): the suite's run draws them (the seeds
# stay the same) but does not send them. By name: what ``known_bad`` finds in a message.
# Fixed (each still reproduced there): "deep_json" (a body nested 1,000 deep: was HTTP 500),
# "lone_surrogate" (\ud800 in forwarded params: was -32603), "too_many_rounds" (a parked
# call retried past its 16 rounds with non-answers: was -32603, now -32602).
KNOWN_BAD: dict[str, str] = {}

JSON_TYPE = "application/json"
BOTH_ACCEPTED = "application/json, text/event-stream"
WATCHED_URI = "test://asking/watched"
# A bounded set of capability sets: each distinct relayed set is its own user (its own
# actors), so a fuzz drawing unbounded ones would measure user creation, not the edge.
CAPABILITY_SETS: tuple[dict[str, Any], ...] = (
    {}, {"elicitation": {}}, {"elicitation": {"form": {}}, "sampling": {}, "roots": {"listChanged": True}},
    {"extensions": {TASKS_EXTENSION: {}}}, {"elicitation": {}, "extensions": {TASKS_EXTENSION: {}}},
)
# Tools a fuzzed call may reach: none waits for the client (asking_* are reached only by the
# set-up steps that answer them).
SAFE_TOOLS = ("plain_echo", "plain_fail", "plain_structured", "asker_confirm", "asker_two_steps",
              "asker_summarize", "nope_nothing", "plain_echo ", "PLAIN_ECHO")
# What the warm-up starts users for: the sets above and what a fuzzed capability makes of
# them (a relayed capability that is not an object is dropped).
WARM_CAPABILITY_SETS = CAPABILITY_SETS + ({"sampling": {}, "roots": {"listChanged": True}},)
CONTINUED_TOOLS = ("asker_confirm", "plain_echo", "asking_ask_user", "asker_two_steps")
# The arguments a continued call repeats (a backend binds its requestState to them).
CONTINUED_ARGUMENTS = {"asker_confirm": {"item": "x"}, "plain_echo": {"text": "x"},
                       "asking_ask_user": {"question": "q"}}
LOG_LEVELS = LOGGING_LEVELS


class _NoId:
    def __repr__(self) -> str:
        return "<not a request>"


NOT_A_REQUEST = _NoId()


# ----------------------------------------------------------------------------------
# What is sent, and what comes back
# ----------------------------------------------------------------------------------


ANY, REFUSED, SERVED, ACCEPTED = "any", "refused", "served", "accepted"


@dataclass
class Send:
    """One HTTP request of a case and what its answer must be."""

    body: bytes | None
    headers: dict[str, Any]
    http_method: str = "POST"
    request_id: Any = NOT_A_REQUEST  # a well-formed request's id: a 200 answer carries it
    other_ids: tuple[Any, ...] = ()  # ids an answer to a malformed message may echo (null always may)
    expect: str = ANY  # REFUSED: a JSON-RPC error, never served; SERVED: a result; ACCEPTED: 202
    served_text: str | None = None  # what a served answer must contain
    forbidden_text: str | None = None  # what no answer may contain (a continuation honoured where none exists)
    fuzzed: bool = True  # the case's fuzzed message (else a set-up or follow-up step)
    chunked: bool = False  # the body without Content-Length (chunked transfer encoding)
    stream: bool = False  # read by the case as it streams; judged when the case says (Finish)


@dataclass
class Answer:
    status: int = 0
    content_type: str = ""
    body: bytes = b""
    failure: str | None = None  # the request got no answer (connection error, timeout)
    response: Any = None  # a streamed answer's open response
    read: list[str] = field(default_factory=list)  # a streamed answer's lines read so far
    session: str | None = None  # the Mcp-Session-Id header it carried

    def messages(self) -> list[dict[str, Any]]:
        """The answer's JSON-RPC messages (JSON or SSE), best effort, for the cases."""
        try:
            if self.content_type.startswith("text/event-stream"):
                return [json.loads(e.data) for e in iter_sse_events(self.body.decode().splitlines()) if e.data.strip()]
            return [json.loads(self.body)]
        except (ValueError, RecursionError):
            return []

    def final(self) -> dict[str, Any]:
        found = self.messages()
        return found[-1] if found and isinstance(found[-1], dict) else {}


@dataclass
class Finish:
    """A case's instruction: read the rest of a streamed answer and judge it now."""

    answer: Answer
    send: Send


Plan = Generator["Send | Finish", Answer, None]


@dataclass
class Case:
    seed: int
    revision: str
    category: str
    variant: str
    plan: Callable[[], Plan]


@dataclass
class Bad:
    case: Case
    send: Send
    answer: Answer
    problems: list[str]

    def describe(self, limit: int = 400) -> str:
        sent = (self.send.body or b"")[:limit]
        more = " ..." if len(self.send.body or b"") > limit else ""
        headers = {k: (v[:80] if isinstance(v, (str, bytes)) else v) for k, v in self.send.headers.items()}
        return (f"seed={self.case.seed} revision={self.case.revision} category={self.case.category} "
                f"variant={self.case.variant}: {'; '.join(self.problems)}\n"
                f"    request: {self.send.http_method} {headers} {sent!r}{more}\n"
                f"    answer: {self.answer.failure or self.answer.status} {self.answer.body[:limit]!r}")


# ----------------------------------------------------------------------------------
# Judging an answer
# ----------------------------------------------------------------------------------


def _is_id(value: Any) -> bool:
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def _same_id(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b


def _rpc_problem(message: Any) -> str | None:
    """What makes ``message`` no JSON-RPC 2.0 message; None when it is one."""
    if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
        return "not a JSON-RPC 2.0 object"
    if "method" in message:
        return None if isinstance(message["method"], str) else "a method that is not a string"
    if "id" not in message or (("result" in message) == ("error" in message)):
        return "a response needs an id and exactly one of result and error"
    if "error" in message:
        error = message["error"]
        if not isinstance(error, dict) or not isinstance(error.get("message"), str) \
                or not isinstance(error.get("code"), int) or isinstance(error.get("code"), bool):
            return "an error without an integer code and a message"
    return None


def rpc_messages(answer: Answer) -> tuple[list[dict[str, Any]] | None, str]:
    """The JSON-RPC messages of an answer's body, or None and why it holds none."""
    text = answer.body.decode("utf-8", "replace")
    if answer.content_type.startswith("text/event-stream"):
        try:
            found = [json.loads(event.data) for event in iter_sse_events(text.splitlines()) if event.data.strip()]
        except ValueError:
            return None, "an SSE event whose data is not JSON"
        if not found:
            return None, "an SSE stream without messages"
        if "method" in found[-1]:
            return None, "an SSE stream that does not end in a response"
    elif answer.content_type.startswith(JSON_TYPE):
        try:
            found = [json.loads(text)]
        except ValueError:
            return None, "a JSON body that does not parse"
    else:
        return None, f"Content-Type {answer.content_type!r}"
    for message in found:
        problem = _rpc_problem(message)
        if problem is not None:
            return None, problem
    return found, ""


def judge(send: Send, answer: Answer, markers: Sequence[str]) -> list[str]:
    """Every way ``answer`` is a bad answer to ``send`` (empty: a good one)."""
    if answer.failure is not None:
        return [f"no answer: {answer.failure}"]
    problems: list[str] = []
    if answer.status >= 500:
        problems.append(f"HTTP {answer.status}")
    text = answer.body.decode("utf-8", "replace")
    problems += [f"the body shows {marker!r}" for marker in markers if marker in text]
    messages, why = rpc_messages(answer)
    if answer.status == 200 and send.http_method == "POST" and messages is None:
        problems.append(f"HTTP 200 without JSON-RPC: {why}")
    final = messages[-1] if messages else None
    for message in messages or ():
        error = message.get("error") if "method" not in message else None
        if error is not None:
            if error["code"] == INTERNAL_ERROR:
                problems.append(f"internal error -32603: {error.get('message')!r}")
            elif error["code"] not in EXPECTED_CODES:
                problems.append(f"unexpected error code {error['code']}: {error.get('message')!r}")
    if final is not None and "method" not in final:
        if send.request_id is not NOT_A_REQUEST:
            refused_unread = answer.status >= 400 and final["id"] is None
            if not _same_id(final["id"], send.request_id) and not refused_unread:
                problems.append(f"answer id {final['id']!r} is not the request's {send.request_id!r}")
        elif final["id"] is not None and not any(_same_id(final["id"], i) for i in send.other_ids):
            problems.append(f"answer id {final['id']!r} to a message without that id")
    served = answer.status < 300 and (final is None and answer.status == 202 or final is not None and "result" in final)
    if send.expect == REFUSED:
        if served:
            problems.append(f"served (HTTP {answer.status}) what must be refused")
        elif final is not None and "error" in final and final["error"]["code"] not in REFUSAL_CODES \
                and answer.status != 401:
            problems.append(f"refused with code {final['error']['code']}, not a refusal code")
    elif send.expect == SERVED:
        if not (answer.status == 200 and final is not None and "result" in final):
            problems.append(f"not served (HTTP {answer.status})")
        elif send.served_text is not None and send.served_text not in text:
            problems.append(f"served without {send.served_text!r}")
    elif send.expect == ACCEPTED and answer.status != 202:
        problems.append(f"not accepted (HTTP {answer.status}, wanted 202)")
    if send.forbidden_text is not None and send.forbidden_text in text:
        problems.append(f"answered {send.forbidden_text!r}: the input it carried was taken")
    return problems


# ----------------------------------------------------------------------------------
# The world the messages are made for
# ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class RealState:
    """A requestState the gateway sealed for an asker_confirm call of ``who`` (item ``x``)."""

    who: str
    state: str
    key: str  # the inputRequests key its answer goes under
    capabilities: dict[str, Any]


@dataclass
class EdgeContext:
    url: str
    tokens: dict[str, str]
    bad_tokens: tuple[str, ...]
    sessions: dict[str, list[str]]  # 2025 sessions declaring nothing, per identity
    asking_sessions: dict[str, str]  # a 2025 session declaring elicitation, per identity
    ended_session: str  # alice's, deleted
    states: dict[str, list[RealState]]
    markers: tuple[str, ...]  # what no body may show: backend URLs, tracebacks, source paths


def _modern_meta(capabilities: Mapping[str, Any]) -> dict[str, Any]:
    return {META_VERSION: MODERN, META_CAPABILITIES: dict(capabilities),
            META_CLIENT_INFO: {"name": "fuzz", "version": "1"}}


def _modern_headers(method: str, params: Any, token: str | None) -> dict[str, Any]:
    headers = {"Content-Type": JSON_TYPE, "Accept": BOTH_ACCEPTED, "MCP-Protocol-Version": MODERN,
               "Mcp-Method": method}
    named = NAME_HEADER_PARAMS.get(method)
    if named and isinstance(params, dict) and isinstance(params.get(named), str):
        headers["Mcp-Name"] = _header_value(params[named])
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return headers


def _header_value(value: str) -> str:
    """A value as a client mirrors it in a header (a lone surrogate: its UTF-8 bytes as they are)."""
    try:
        return encode_header_value(value)
    except UnicodeEncodeError:
        return "=?base64?" + base64.b64encode(value.encode("utf-8", "surrogatepass")).decode("ascii") + "?="


def _legacy_headers(token: str | None, session: str | None) -> dict[str, Any]:
    headers = {"Content-Type": JSON_TYPE, "Accept": BOTH_ACCEPTED}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    if session is not None:
        headers["Mcp-Session-Id"] = session
        headers["MCP-Protocol-Version"] = LEGACY
    return headers


def _direct(url: str, body: Any, headers: dict[str, Any]) -> requests.Response:
    response = requests.post(url, data=json.dumps(body), headers=headers, timeout=REQUEST_TIMEOUT_S)
    if response.status_code not in (200, 202):
        raise RuntimeError(f"set-up request failed: HTTP {response.status_code}: {response.text[:300]}")
    return response


def open_session(url: str, token: str, capabilities: Mapping[str, Any] | None = None) -> str:
    """A 2025 session opened the raw way (initialize, notifications/initialized)."""
    response = _direct(url, {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": LEGACY, "capabilities": dict(capabilities or {}),
        "clientInfo": {"name": "fuzz", "version": "1"}}}, _legacy_headers(token, None))
    session = response.headers["Mcp-Session-Id"]
    _direct(url, {"jsonrpc": "2.0", "method": "notifications/initialized"}, _legacy_headers(token, session))
    return session


def _plain_request(url: str, revision: str, token: str, method: str, request_id: int, params: dict[str, Any],
                   session: str | None, capabilities: Mapping[str, Any] | None) -> tuple[dict[str, Any], str]:
    """One well-formed request in ``revision`` (its _meta and headers, or the session's):
    the final JSON-RPC answer, and the response's text for an error message."""
    if revision == MODERN:
        params["_meta"] = _modern_meta(capabilities or {})
        headers = _modern_headers(method, params, token)
    else:
        headers = _legacy_headers(token, session)
    response = _direct(url, {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}, headers)
    answer = Answer(response.status_code, response.headers.get("Content-Type", ""), response.content).final()
    return answer, response.text[:300]


def echo_call(url: str, revision: str, token: str, text: str, session: str | None = None,
              capabilities: Mapping[str, Any] | None = None) -> str:
    """plain_echo through the gateway, the plain way; the text it answers."""
    answer, shown = _plain_request(url, revision, token, "tools/call", 7,
                                   {"name": "plain_echo", "arguments": {"text": text}}, session, capabilities)
    if answer.get("id") != 7 or "result" not in answer:
        raise RuntimeError(f"plain_echo was not answered: {shown}")
    return answer["result"]["content"][0]["text"]


def read_watched(url: str, revision: str, token: str, session: str | None = None,
                 capabilities: Mapping[str, Any] | None = None) -> None:
    """resources/read of the asking backend's resource: the user meets that backend too."""
    answer, shown = _plain_request(url, revision, token, "resources/read", 8, {"uri": WATCHED_URI}, session,
                                   capabilities)
    if "result" not in answer:
        raise RuntimeError(f"resources/read was not answered: {shown}")


def real_state(url: str, who: str, token: str, capabilities: Mapping[str, Any]) -> RealState:
    params = {"name": "asker_confirm", "arguments": {"item": "x"}, "_meta": _modern_meta(capabilities)}
    response = _direct(url, {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params},
                       _modern_headers("tools/call", params, token))
    result = response.json()["result"]
    if result.get("resultType") != "input_required":
        raise RuntimeError(f"asker_confirm did not ask: {result}")
    return RealState(who, result["requestState"], next(iter(result["inputRequests"])), dict(capabilities))


def prepare(url: str, idp: Any, backend_urls: Sequence[str]) -> EdgeContext:
    """Identities, their sessions and real requestStates; every user the fuzz reaches
    started (so the threads counted before are those a served user holds)."""
    tokens = {who: idp.issue_token(who, AUDIENCE, expires_in=3600) for who in IDENTITIES}
    bad_tokens = (idp.expired_token("alice", AUDIENCE), idp.token_signed_by_foreign_key("alice", AUDIENCE),
                  idp.unsigned_token("alice", AUDIENCE), idp.hmac_with_public_key_token("alice", AUDIENCE),
                  idp.token_with_unknown_kid("alice", AUDIENCE), idp.issue_token("alice", "another-audience"),
                  "not-a-token", tokens["alice"][:-4] + "AAAA")
    sessions = {who: [open_session(url, tokens[who]) for _ in range(SESSIONS_PER_IDENTITY)] for who in IDENTITIES}
    asking = {who: open_session(url, tokens[who], {"elicitation": {}}) for who in IDENTITIES}
    for who in IDENTITIES:
        for session in (*sessions[who], asking[who]):
            echo_call(url, LEGACY, tokens[who], "warm", session)
            read_watched(url, LEGACY, tokens[who], session)
        for capabilities in WARM_CAPABILITY_SETS:
            echo_call(url, MODERN, tokens[who], "warm", capabilities=capabilities)
            read_watched(url, MODERN, tokens[who], capabilities=capabilities)
    ended = open_session(url, tokens["alice"])
    requests.delete(url, headers=_legacy_headers(tokens["alice"], ended), timeout=REQUEST_TIMEOUT_S)
    states = {who: [real_state(url, who, tokens[who], CAPABILITY_SETS[1 + n % 2]) for n in range(STATES_PER_IDENTITY)]
              for who in IDENTITIES}
    markers = ["Traceback (most recent call last)", 'File "/', str(ROOT)]
    for backend_url in backend_urls:
        host_port = backend_url.split("://", 1)[-1].split("/", 1)[0]
        markers += [host_port, host_port.replace("127.0.0.1", "localhost")]
    return EdgeContext(url, tokens, bad_tokens, sessions, asking, ended, states, tuple(dict.fromkeys(markers)))


# ----------------------------------------------------------------------------------
# Random values
# ----------------------------------------------------------------------------------


def random_text(rng: random.Random, most: int = 24) -> str:
    alphabet = rng.choice(("abcxyz", "aé中😀 \t\n\"\\/", "\x00\x01\x7f\u200b\ufeff\u202e",
                           "0123456789-_.", "\ud800\udfff"))
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, most)))


def wrong_value(rng: random.Random) -> Any:
    """A value of a random JSON type (and NaN, which Python's parser accepts)."""
    return rng.choice((
        lambda: None, lambda: True, lambda: False, lambda: 0, lambda: -1, lambda: 2 ** 63, lambda: 10 ** 40,
        lambda: -(10 ** 40), lambda: 1.5, lambda: -0.0, lambda: 1e308, lambda: float("nan"), lambda: float("inf"),
        lambda: "", lambda: random_text(rng), lambda: "x" * rng.choice((100, 10_000)), lambda: [],
        lambda: [None, 1, "a"], lambda: {}, lambda: {"": None}, lambda: {"a": {"b": [1, {"c": None}]}},
        lambda: {"_meta": {"x": 1}}, lambda: [[[[]]]],
    ))()


def random_id(rng: random.Random) -> Any:
    return rng.choice((lambda: rng.randint(0, 1000), lambda: rng.randint(-(2 ** 53), 2 ** 53),
                       lambda: 10 ** rng.randint(19, 40), lambda: random_text(rng, 12) or "id",
                       lambda: "0", lambda: rng.randint(1, 5)))()


def _dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), allow_nan=True).encode()


def _capabilities(rng: random.Random) -> dict[str, Any]:
    return copy.deepcopy(rng.choice(CAPABILITY_SETS))


def _token(rng: random.Random, ctx: EdgeContext) -> tuple[str, str]:
    who = "alice" if rng.random() < 0.7 else "bob"
    return who, ctx.tokens[who]


def _send(message: Any, headers: dict[str, Any], **options: Any) -> Send:
    """A JSON message as it is sent: a well-formed request's answer must carry its id."""
    return raw_send(_dumps(message), headers, **options)


def raw_send(body: bytes, headers: dict[str, Any], **options: Any) -> Send:
    """A body as it is sent. Its id as the server reads it (a surrogate pair is one
    character there): the answer to a well-formed request must carry it; an answer to
    anything else may carry it, or null."""
    try:
        message = json.loads(body)
    except (ValueError, RecursionError):
        message = None
    request_id = NOT_A_REQUEST
    other_ids: tuple[Any, ...] = ()
    if isinstance(message, dict):
        if message.get("jsonrpc") == "2.0" and isinstance(message.get("method"), str) and message["method"] \
                and "id" in message and _is_id(message["id"]) \
                and (message.get("params") is None or isinstance(message["params"], (dict, list))):
            request_id = message["id"]
        elif "id" in message:
            other_ids = (message["id"],)
    return Send(body, headers, request_id=request_id, other_ids=other_ids, **options)


def _one(send: Send) -> Callable[[], Plan]:
    def plan() -> Plan:
        yield send

    return plan


# ----------------------------------------------------------------------------------
# Messages of each kind
# ----------------------------------------------------------------------------------


def _arguments_for(rng: random.Random, tool: str) -> dict[str, Any]:
    if tool.startswith("plain_echo"):
        return {"text": random_text(rng)}
    if tool == "asker_confirm":
        return {"item": random_text(rng, 8)}
    if tool == "asker_summarize":
        return {"text": random_text(rng)}
    return {}


def valid_request(rng: random.Random, revision: str) -> tuple[str, dict[str, Any] | None]:
    """A method and params a client of ``revision`` may well send."""
    tool = rng.choice(SAFE_TOOLS)
    menu: list[Callable[[], tuple[str, dict[str, Any] | None]]] = [
        lambda: ("tools/list", rng.choice(({}, None, {"cursor": random_text(rng, 40)}))),
        lambda: ("tools/call", {"name": tool, "arguments": _arguments_for(rng, tool)}),
        lambda: ("tools/call", {"name": tool, "arguments": _arguments_for(rng, tool),
                                "_meta": {"progressToken": random_id(rng)}}),
        lambda: ("prompts/list", {}), lambda: ("resources/list", {}), lambda: ("resources/templates/list", {}),
        lambda: ("resources/read", {"uri": rng.choice((WATCHED_URI, "test://nope", random_text(rng)))}),
        lambda: ("prompts/get", {"name": random_text(rng, 12) or "p", "arguments": {}}),
        lambda: ("completion/complete", {"ref": {"type": "ref/prompt", "name": "x"},
                                         "argument": {"name": "a", "value": random_text(rng, 6)}}),
        lambda: ("tasks/list", {}), lambda: ("tasks/get", {"taskId": random_text(rng, 30) or "t"}),
        lambda: ("tasks/cancel", {"taskId": random_text(rng, 30) or "t"}),
        lambda: ("tools/call", {"name": "plain_echo", "arguments": {"text": "t"}, "task": {"ttl": 60_000}}),
    ]
    if revision == LEGACY:
        menu += [lambda: ("ping", None), lambda: ("logging/setLevel", {"level": rng.choice(LOG_LEVELS)})]
    else:
        menu += [lambda: ("server/discover", {}),
                 lambda: ("subscriptions/listen", {"notifications": {"taskIds": [str(n) for n in range(101)]}}),
                 lambda: ("subscriptions/listen",
                          {"notifications": rng.choice(("x", 5, [], {"resourceSubscriptions": 5}))})]
    return rng.choice(menu)()


def message_for(rng: random.Random, ctx: EdgeContext, revision: str, method: str, params: Any, *,
                request_id: Any = None, who: str | None = None, capabilities: dict[str, Any] | None = None,
                notification: bool = False, **options: Any) -> Send:
    """``method`` with ``params`` as a well-behaved client of ``revision`` sends it."""
    if who is None:
        who, token = _token(rng, ctx)
    else:
        token = ctx.tokens[who]
    message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    if not notification:
        message["id"] = random_id(rng) if request_id is None else request_id
    if revision == MODERN:
        params = dict(params) if isinstance(params, dict) else {}
        params["_meta"] = {**_modern_meta(capabilities if capabilities is not None else _capabilities(rng)),
                           **params.get("_meta", {})}
        headers = _modern_headers(method, params, token)
    else:
        headers = _legacy_headers(token, rng.choice(ctx.sessions[who]))
    if params is not None:
        message["params"] = params
    return _send(message, headers, **options)


def case_valid(rng: random.Random, ctx: EdgeContext, revision: str) -> tuple[str, Callable[[], Plan]]:
    method, params = valid_request(rng, revision)
    return method, _one(message_for(rng, ctx, revision, method, params))


def case_malformed_json(rng: random.Random, ctx: EdgeContext, revision: str) -> tuple[str, Callable[[], Plan]]:
    good = message_for(rng, ctx, revision, "tools/list", {})
    text = good.body or b""
    bodies = {
        "empty": b"", "brace": b"{", "truncated": text[: rng.randint(1, max(1, len(text) - 1))],
        "trailing_comma": text[:-1] + b",}", "trailing_garbage": text + b"xyz", "two_objects": text + text,
        "invalid_utf8": b'{"jsonrpc":"2.0","id":1,"method":"tools/list","x":"\xff\xfe"}',
        "random_bytes": bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 64))),
        "nan": b'{"jsonrpc":"2.0","id":NaN,"method":"tools/list"}',
        "scalar": rng.choice((b"null", b"1", b'"x"', b"true")),
        "utf16": text.decode().encode("utf-16"), "bom": b"\xef\xbb\xbf" + text,
        "duplicate_keys": b'{"jsonrpc":"2.0","id":1,"id":"2","method":"tools/list","method":"ping"}',
        "lone_surrogate": b'{"jsonrpc":"2.0","id":"\\ud800","method":"tools/\\udfff"}',
        "single_quotes": b"{'jsonrpc':'2.0','id':1,'method':'tools/list'}",
        "comment": b'{"jsonrpc":"2.0",/* x */"id":1,"method":"tools/list"}',
    }
    variant = rng.choice(sorted(bodies))
    return variant, _one(raw_send(bodies[variant], good.headers))


def case_envelope(rng: random.Random, ctx: EdgeContext, revision: str) -> tuple[str, Callable[[], Plan]]:
    method, params = valid_request(rng, revision)
    good = message_for(rng, ctx, revision, method, params)
    message = json.loads(good.body or b"{}")
    field_name = rng.choice(("jsonrpc", "id", "method", "params", "extra", "drop"))
    if field_name == "drop":
        dropped = rng.choice(("jsonrpc", "method", "id"))
        message.pop(dropped, None)
        variant = f"missing_{dropped}"
    elif field_name == "extra":
        message[rng.choice(("result", "error", "Jsonrpc", "id2", ""))] = wrong_value(rng)
        variant = "extra_member"
    else:
        message[field_name] = wrong_value(rng) if rng.random() < 0.8 else rng.choice(("1.0", "2", 2.0, "2.0 "))
        variant = f"wrong_{field_name}"
    return variant, _one(_send(message, good.headers))


# Where each method's params may be given a wrong value (a path into params).
FIELD_PATHS = {
    "tools/call": (("name",), ("arguments",), ("arguments", "text"), ("_meta",), ("_meta", "progressToken"),
                   ("task",), ("task", "ttl")),
    "resources/read": (("uri",), ("_meta",)),
    "prompts/get": (("name",), ("arguments",)),
    "tools/list": (("cursor",),),
    "completion/complete": (("ref",), ("argument",), ("ref", "type")),
    "tasks/get": (("taskId",),),
    "logging/setLevel": (("level",),),
}
MODERN_META_PATHS = (("_meta",), ("_meta", META_VERSION), ("_meta", META_CAPABILITIES), ("_meta", META_CLIENT_INFO),
                     ("_meta", META_LOG_LEVEL), ("_meta", META_CAPABILITIES, "elicitation"),
                     ("_meta", META_CAPABILITIES, "extensions"), ("inputResponses",), ("requestState",))


def _set_at(target: dict[str, Any], path: Sequence[str], value: Any) -> None:
    for key in path[:-1]:
        if not isinstance(target.get(key), dict):
            target[key] = {}
        target = target[key]
    target[path[-1]] = value


def case_wrong_types(rng: random.Random, ctx: EdgeContext, revision: str) -> tuple[str, Callable[[], Plan]]:
    methods = [m for m in FIELD_PATHS if revision == LEGACY or m != "logging/setLevel"]
    method = rng.choice(methods)
    tool = rng.choice(SAFE_TOOLS)
    params: dict[str, Any] = {"tools/call": {"name": tool, "arguments": _arguments_for(rng, tool)},
                              "resources/read": {"uri": WATCHED_URI}, "prompts/get": {"name": "p"},
                              "tools/list": {}, "completion/complete": {"ref": {"type": "ref/prompt", "name": "x"},
                                                                        "argument": {"name": "a", "value": "v"}},
                              "tasks/get": {"taskId": "t"}, "logging/setLevel": {"level": "info"}}[method]
    send = message_for(rng, ctx, revision, method, params)
    message = json.loads(send.body or b"{}")
    paths = FIELD_PATHS[method] + (MODERN_META_PATHS if revision == MODERN else ())
    path = rng.choice(paths)
    value = wrong_value(rng)
    if path[:2] == ("_meta", META_CAPABILITIES) and len(path) == 3 and isinstance(value, dict):
        value = None  # a relayed capability's contents name a user: keep the set bounded
    _set_at(message["params"], path, value)
    headers = dict(send.headers)
    if revision == MODERN:  # the headers still mirror the body where they can
        headers = _modern_headers(method, message["params"], headers.get("Authorization", "")[7:] or None)
    return "/".join(path), _one(_send(message, headers))


def _deep(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def case_huge_deep(rng: random.Random, ctx: EdgeContext, revision: str) -> tuple[str, Callable[[], Plan]]:
    send = message_for(rng, ctx, revision, "tools/call", {"name": "plain_echo", "arguments": {"text": "t"}})
    message = json.loads(send.body or b"{}")
    variant = rng.choice(("deep_body", "deep_params", "long_text", "long_name", "long_method", "long_id",
                          "many_keys", "wide_array", "over_limit", "long_header", "many_headers"))
    headers = dict(send.headers)
    body: bytes
    if variant in ("deep_body", "deep_params"):
        depth = rng.choice((10, 100, 500, 900, 1000, 2000, 20_000, 200_000))
        if variant == "deep_body":
            body = _deep(depth)
        else:
            message["params"]["arguments"]["deep"] = "@DEEP@"
            body = _dumps(message).replace(b'"@DEEP@"', _deep(depth))
        if depth >= 1000:
            variant += "_beyond_1000"
    elif variant == "long_text":
        message["params"]["arguments"]["text"] = "y" * rng.choice((65_536, 1_000_000))
        body = _dumps(message)
    elif variant == "long_name":
        message["params"]["name"] = "n" * rng.choice((129, 65_536))
        body = _dumps(message)
        if revision == MODERN:
            headers["Mcp-Name"] = message["params"]["name"]
    elif variant == "long_method":
        message["method"] = "m" * rng.choice((1000, 65_536))
        body = _dumps(message)
        if revision == MODERN:
            headers["Mcp-Method"] = message["method"][:60_000]
    elif variant == "long_id":
        message["id"] = "i" * rng.choice((1000, 1_000_000))
        body = _dumps(message)
    elif variant == "many_keys":
        message["params"]["arguments"].update({f"k{n}": n for n in range(50_000)})
        body = _dumps(message)
    elif variant == "wide_array":
        message["params"]["arguments"]["wide"] = list(range(200_000))
        body = _dumps(message)
    elif variant == "over_limit":
        body = _dumps(message)[:-1] + b',"pad":"' + b"p" * (4 * 1024 * 1024) + b'"}'
    elif variant == "long_header":
        headers[rng.choice(("Mcp-Session-Id", "Authorization", "X-Long", "Mcp-Param-Text"))] = "h" * 70_000
        body = _dumps(message)
    else:
        headers.update({f"Mcp-Param-P{n}": str(n) for n in range(300)})
        body = _dumps(message)
    return variant, _one(raw_send(body, headers))


def case_batch(rng: random.Random, ctx: EdgeContext, revision: str) -> tuple[str, Callable[[], Plan]]:
    one = message_for(rng, ctx, revision, "tools/list", {})
    item = json.loads(one.body or b"{}")
    variant = rng.choice(("empty", "one", "two", "notification", "nested", "scalars"))
    batch = {"empty": [], "one": [item], "two": [item, {**item, "id": "b2"}],
             "notification": [{"jsonrpc": "2.0", "method": "notifications/initialized"}],
             "nested": [[item]], "scalars": [1, "x", None]}[variant]
    return variant, _one(Send(_dumps(batch), one.headers))


def case_unknown_method(rng: random.Random, ctx: EdgeContext, revision: str) -> tuple[str, Callable[[], Plan]]:
    method = rng.choice(("tools/CALL", "tools/call ", "rpc.discover", "../admin", "tools", "/", "notifications/x",
                         "tasks/result", "resources/delete", "sampling/createMessage", "elicitation/create",
                         "roots/list", random_text(rng, 30) or "?", "x" * 300))
    send = message_for(rng, ctx, revision, method, rng.choice(({}, None, {"name": "plain_echo"})))
    if revision == MODERN:
        send.headers["Mcp-Method"] = _header_value(method)
    return "unknown", _one(send)


def case_notification(rng: random.Random, ctx: EdgeContext, revision: str) -> tuple[str, Callable[[], Plan]]:
    method = rng.choice(("notifications/initialized", "notifications/cancelled", "notifications/progress",
                         "notifications/roots/list_changed", "notifications/message", "notifications/whatever",
                         "tools/call", "initialize"))
    params = rng.choice((None, {}, {"requestId": random_id(rng), "reason": wrong_value(rng)},
                         {"progressToken": random_id(rng), "progress": wrong_value(rng)}, {"level": wrong_value(rng)}))
    return method, _one(message_for(rng, ctx, revision, method, params, notification=True))


def case_client_response(rng: random.Random, ctx: EdgeContext, revision: str) -> tuple[str, Callable[[], Plan]]:
    base = message_for(rng, ctx, revision, "tools/list", {})
    variant = rng.choice(("result", "error", "malformed_error", "both"))
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": random_id(rng)}
    if variant in ("result", "both"):
        message["result"] = rng.choice(({"action": "accept", "content": {}}, {"roots": []}, wrong_value(rng)))
    if variant in ("error", "both"):
        message["error"] = {"code": -1, "message": "no"}
    if variant == "malformed_error":
        message["error"] = wrong_value(rng)
    # No request of the gateway waits for these clients' answers (their sessions declare nothing).
    return variant, _one(_send(message, base.headers, expect=REFUSED))


ACCEPTS = ("", "*/*", JSON_TYPE, "text/event-stream", "text/html", "application/json;q=0, text/event-stream",
           "application/*, text/*", "garbage;;;", "application/json, text/event-stream;q=0")
CONTENT_TYPES = ("", "text/plain", "application/json; charset=utf-16", "application/json-seq", "multipart/form-data",
                 "APPLICATION/JSON", "application/json; charset=utf-8", "application/x-www-form-urlencoded", "x")
VERSIONS = ("", "garbage", "2024-11-05", "2025-03-26", "2025-06-18", LEGACY, MODERN, "2026-07-29", "9999-99-99",
            "2025-11-25 ", "2026-07-28,2025-11-25")


def case_headers(rng: random.Random, ctx: EdgeContext, revision: str) -> tuple[str, Callable[[], Plan]]:
    method, params = valid_request(rng, revision)
    send = message_for(rng, ctx, revision, method, params)
    headers = send.headers
    what = rng.choice(("Accept", "Content-Type", "Authorization", "Origin", "Host", "MCP-Protocol-Version",
                       "Mcp-Method", "Mcp-Name", "Mcp-Param", "Mcp-Session-Id", "utf8_bytes", "drop_all"))
    if what == "Accept":
        headers["Accept"] = rng.choice(ACCEPTS)
    elif what == "Content-Type":
        headers["Content-Type"] = rng.choice(CONTENT_TYPES)
    elif what == "Authorization":
        headers["Authorization"] = rng.choice((*(f"Bearer {t}" for t in ctx.bad_tokens), "", "Bearer", "Basic YTpi",
                                               f"bearer {ctx.tokens['alice']}", f"Bearer  {ctx.tokens['bob']}"))
    elif what == "Origin":
        headers["Origin"] = rng.choice(("http://evil.example", "null", "http://127.0.0.1.evil.example"))
    elif what == "Host":
        headers["Host"] = rng.choice(("evil.example", "127.0.0.1:1", "localhost.evil.example"))
    elif what == "MCP-Protocol-Version":
        headers["MCP-Protocol-Version"] = rng.choice(VERSIONS)
    elif what == "Mcp-Method":
        headers["Mcp-Method"] = rng.choice(("", "tools/list", "TOOLS/CALL", method + " ",
                                            "=?base64?dG9vbHMvbGlzdA==?="))
    elif what == "Mcp-Name":
        headers["Mcp-Name"] = rng.choice(("", "other", "=?base64?!!!?=", "=?base64?cGxhaW5fZWNobw==?=", "plain_echo"))
    elif what == "Mcp-Param":
        headers[f"Mcp-Param-{rng.choice(('Text', 'Region', 'X', ''))}"] = rng.choice(("", "v", "=?base64?%%?="))
    elif what == "Mcp-Session-Id":
        headers["Mcp-Session-Id"] = rng.choice((ctx.sessions["bob"][0], ctx.ended_session, "x"))
    elif what == "utf8_bytes":
        headers[rng.choice(("Mcp-Name", "Mcp-Session-Id", "MCP-Protocol-Version", "Authorization"))] = \
            "".join(rng.choice("aé中😀ß") for _ in range(rng.randint(1, 10))).encode()
    else:
        headers.clear()
    return what, _one(send)


def case_session(rng: random.Random, ctx: EdgeContext, revision: str) -> tuple[str, Callable[[], Plan]]:
    """2025: requests on sessions that are not the caller's (or not sessions at all)."""
    method, params = valid_request(rng, revision)
    send = message_for(rng, ctx, LEGACY, method, params, who="alice")
    real = ctx.sessions["alice"][0]
    variants = {
        "missing": None, "random_hex": rng.randbytes(16).hex(), "uuid": "3f2a4c1e-0000-4000-8000-000000000000",
        "flipped": real[:-1] + ("A" if real[-1] != "A" else "B"), "truncated": real[: len(real) // 2],
        "other_identity": ctx.sessions["bob"][0], "ended": ctx.ended_session, "long": real * 40,
        "with_spaces": f"{real} ", "lowercase": real.lower(), "empty": "",
    }
    variant = rng.choice(sorted(variants))
    if variants[variant] is None:
        send.headers.pop("Mcp-Session-Id")
    else:
        send.headers["Mcp-Session-Id"] = variants[variant]
    http_method = rng.choice(("POST", "POST", "POST", "GET", "DELETE"))
    if http_method != "POST":
        send.http_method, send.body, send.request_id = http_method, None, NOT_A_REQUEST
        if variant in ("with_spaces", "lowercase"):  # could name the real session: keep it open
            variant = "random_hex"
            send.headers["Mcp-Session-Id"] = variants["random_hex"]
        variant = f"{http_method}_{variant}"
    return variant, _one(send)


def case_initialize(rng: random.Random, ctx: EdgeContext, revision: str) -> tuple[str, Callable[[], Plan]]:
    """2025: initialize with random fields; a session it opens is deleted at once."""
    params: dict[str, Any] = {"protocolVersion": rng.choice((*VERSIONS, None, 20251125)),
                              "capabilities": rng.choice(({}, wrong_value(rng))),
                              "clientInfo": rng.choice(({"name": "fuzz", "version": "1"}, wrong_value(rng)))}
    variant = rng.choice(("fields", "no_params", "with_session", "with_version_header", "params_list"))
    who, token = _token(rng, ctx)
    headers = _legacy_headers(token, None)
    body_params: Any = params
    if variant == "no_params":
        body_params = None
    elif variant == "params_list":
        body_params = [params]
    elif variant == "with_session":
        headers["Mcp-Session-Id"] = rng.choice(ctx.sessions[who])
    elif variant == "with_version_header":
        headers["MCP-Protocol-Version"] = rng.choice(VERSIONS)
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": random_id(rng), "method": "initialize"}
    if body_params is not None:
        message["params"] = body_params
    first = _send(message, headers)

    def plan() -> Plan:
        answer = yield first
        if answer.status == 200 and answer.session:
            yield Send(None, _legacy_headers(token, answer.session), http_method="DELETE", fuzzed=False)

    return variant, plan


def case_http_method(rng: random.Random, ctx: EdgeContext, revision: str) -> tuple[str, Callable[[], Plan]]:
    send = message_for(rng, ctx, revision, "tools/list", {})
    method = rng.choice(("PUT", "PATCH", "OPTIONS", "HEAD", "GET", "DELETE"))
    if method in ("GET", "DELETE") and revision == LEGACY:
        send.headers["Mcp-Session-Id"] = rng.randbytes(8).hex()  # never a live session: no stream, nothing ended
    send.http_method, send.request_id = method, NOT_A_REQUEST
    return method, _one(send)


def case_chunked(rng: random.Random, ctx: EdgeContext, revision: str) -> tuple[str, Callable[[], Plan]]:
    method, params = valid_request(rng, revision)
    send = message_for(rng, ctx, revision, method, params)
    send.chunked = True
    variant = rng.choice(("whole", "truncated", "over_limit"))
    if variant == "truncated":
        send.body = (send.body or b"")[:-3]
        send.request_id = NOT_A_REQUEST
    elif variant == "over_limit":
        send.body = (send.body or b"") + b" " * (4 * 1024 * 1024 + 1)
        send.request_id = NOT_A_REQUEST
    return variant, _one(send)


def case_meta(rng: random.Random, ctx: EdgeContext, revision: str) -> tuple[str, Callable[[], Plan]]:
    """2026-07-28: the _meta envelope missing, partial, of another revision, with extras."""
    method, params = valid_request(rng, MODERN)
    send = message_for(rng, ctx, MODERN, method, params)
    message = json.loads(send.body or b"{}")
    meta = message["params"]["_meta"]
    variant = rng.choice(("missing", "no_version", "no_capabilities", "legacy_version", "unknown_version",
                          "log_level", "extra_keys", "version_mismatch_header", "no_client_info"))
    if variant == "missing":
        del message["params"]["_meta"]
    elif variant == "no_version":
        del meta[META_VERSION]
    elif variant == "no_capabilities":
        del meta[META_CAPABILITIES]
    elif variant == "no_client_info":
        del meta[META_CLIENT_INFO]
    elif variant in ("legacy_version", "unknown_version"):
        meta[META_VERSION] = LEGACY if variant == "legacy_version" else rng.choice(("2027-01-01", "x", ""))
        send.headers["MCP-Protocol-Version"] = meta[META_VERSION]
    elif variant == "log_level":
        meta[META_LOG_LEVEL] = rng.choice((*LOG_LEVELS, "verbose", "", "DEBUG"))
    elif variant == "extra_keys":
        meta.update({"io.modelcontextprotocol/unknown": wrong_value(rng), "progressToken": random_id(rng),
                     "trace": {"x": wrong_value(rng)}})
    else:
        send.headers["MCP-Protocol-Version"] = rng.choice((LEGACY, "2026-07-29"))
    return variant, _one(_send(message, send.headers))


def case_removed_method(rng: random.Random, ctx: EdgeContext, revision: str) -> tuple[str, Callable[[], Plan]]:
    method = rng.choice(("initialize", "ping", "logging/setLevel", "resources/subscribe", "resources/unsubscribe"))
    params = {"protocolVersion": MODERN, "capabilities": {}, "clientInfo": {"name": "f", "version": "1"},
              "level": "info", "uri": WATCHED_URI}
    return method, _one(message_for(rng, ctx, MODERN, method, params))


def _continued(rng: random.Random, ctx: EdgeContext, tool: str, who: str, *, state: Any = None,
               responses: Any = None, capabilities: dict[str, Any] | None = None, method: str = "tools/call",
               arguments: dict[str, Any] | None = None, **options: Any) -> Send:
    params: dict[str, Any] = {"name": tool, "arguments": dict(CONTINUED_ARGUMENTS.get(tool, {}))
                              if arguments is None else arguments}
    if method == "resources/read":
        params = {"uri": tool}
    if responses is not None:
        params["inputResponses"] = responses
    if state is not None:
        params["requestState"] = state
    return message_for(rng, ctx, MODERN, method, params, who=who,
                       capabilities=capabilities if capabilities is not None else {"elicitation": {}}, **options)


def _random_responses(rng: random.Random) -> dict[str, Any]:
    return rng.choice(({}, {"anything": {"action": "accept"}},
                       {"tests.mrtr_backends:build_mrtr_server.<locals>.ask_confirmation":
                        {"action": "accept", "content": {"ok": True}}},
                       {"input-000000-1": {"action": "accept", "content": {"name": "n"}}},
                       {random_text(rng, 8): wrong_value(rng)}))


def _forged_state(rng: random.Random, ctx: EdgeContext) -> str:
    real = rng.choice(ctx.states["alice"]).state
    return rng.choice((
        "", "x", "forged", "null", "{}", base64.urlsafe_b64encode(rng.randbytes(rng.randint(1, 300))).decode(),
        "A" * len(real), real.split(".")[0] if "." in real else real[:10],
        base64.urlsafe_b64encode(b'{"k":"b","b":"asker","s":null,"u":["x","alice",""],"m":"tools/call"}').decode(),
        "eyJhbGciOiJub25lIn0.eyJrIjoiYiJ9.",
    ))


def case_continuation_forged(rng: random.Random, ctx: EdgeContext, revision: str) -> tuple[str, Callable[[], Plan]]:
    who, _ = _token(rng, ctx)
    tool = rng.choice(CONTINUED_TOOLS)
    variant = rng.choice(("state_only", "state_and_responses", "prompts_get", "resources_read"))
    method = {"prompts_get": "prompts/get", "resources_read": "resources/read"}.get(variant, "tools/call")
    responses = None if variant == "state_only" else _random_responses(rng)
    return variant, _one(_continued(rng, ctx, WATCHED_URI if method == "resources/read" else tool, who,
                                    state=_forged_state(rng, ctx), responses=responses, method=method,
                                    expect=REFUSED))


def case_continuation_unasked(rng: random.Random, ctx: EdgeContext, revision: str) -> tuple[str, Callable[[], Plan]]:
    who, _ = _token(rng, ctx)
    variant = rng.choice(("tools_call", "prompts_get", "resources_read", "tools_list", "null_state"))
    method = {"prompts_get": "prompts/get", "resources_read": "resources/read", "tools_list": "tools/list"}.get(
        variant, "tools/call")
    send = _continued(rng, ctx, WATCHED_URI if method == "resources/read" else rng.choice(CONTINUED_TOOLS), who,
                      responses=_random_responses(rng), method=method, expect=REFUSED)
    if variant == "null_state":
        message = json.loads(send.body or b"{}")
        message["params"]["requestState"] = None
        send = _send(message, send.headers, expect=REFUSED)
    return variant, _one(send)


def _unsealed_bytes(state: str) -> bytes:
    return base64.urlsafe_b64decode(state + "=" * (-len(state) % 4))


def _sealed_text(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _tampered(rng: random.Random, state: str) -> tuple[str, str]:
    """A sealed state whose bytes are changed (a variant name, the new text)."""
    raw = bytearray(_unsealed_bytes(state))
    variant = rng.choice(("bit_flipped", "byte_flipped", "two_bytes_flipped", "nonce_flipped", "tag_flipped",
                          "truncated", "extended", "swapped_halves", "char_changed"))
    if variant in ("bit_flipped", "byte_flipped", "nonce_flipped", "tag_flipped"):
        at = {"nonce_flipped": rng.randrange(12), "tag_flipped": len(raw) - 1 - rng.randrange(16)}.get(
            variant, rng.randrange(len(raw)))
        raw[at] ^= 0xFF if variant == "byte_flipped" else 1 << rng.randrange(8)
    elif variant == "two_bytes_flipped":
        for at in rng.sample(range(len(raw)), 2):
            raw[at] ^= 1 << rng.randrange(8)
    elif variant == "truncated":
        raw = raw[: rng.randrange(len(raw))]
    elif variant == "extended":
        raw += rng.randbytes(rng.randint(1, 16))
    elif variant == "swapped_halves":
        raw = raw[len(raw) // 2:] + raw[: len(raw) // 2]
    else:  # a character of the text, not the last one (whose low bits may be unused)
        at = rng.randrange(len(state) - 1)
        alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
        return variant, state[:at] + rng.choice([c for c in alphabet if c != state[at]]) + state[at + 1:]
    return variant, _sealed_text(bytes(raw))


def _reencoded(rng: random.Random, state: str) -> tuple[str, str]:
    """The same sealed bytes in other text: base64 that a lenient decoder reads alike."""
    variant = rng.choice(("extra_padding", "standard_alphabet", "unused_bits"))
    if variant == "extra_padding":
        return variant, state + "=" * rng.randint(1, 3)
    if variant == "standard_alphabet":
        return variant, base64.b64encode(_unsealed_bytes(state)).decode()
    spare = {2: 4, 3: 2}.get(len(state) % 4, 0)  # unused low bits in the last character
    if not spare:
        return variant, state + "=="
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    last = alphabet.index(state[-1])
    return variant, state[:-1] + alphabet[last ^ rng.randrange(1, 1 << spare)]


def case_continuation_tampered(rng: random.Random, ctx: EdgeContext, revision: str) -> tuple[str, Callable[[], Plan]]:
    """A real sealed requestState, altered or brought by someone it was not made for."""
    real = rng.choice(ctx.states["alice"])
    answer = {real.key: {"action": "accept", "content": {"ok": True}}}
    how = rng.choice(("bytes", "bytes", "bytes", "other_identity", "other_tool", "other_method", "other_item",
                      "reencoded"))
    if how == "bytes":
        variant, state = _tampered(rng, real.state)
        send = _continued(rng, ctx, "asker_confirm", "alice", state=state, responses=answer,
                          capabilities=real.capabilities, expect=REFUSED)
    elif how == "reencoded":
        # Not tampering: the sealed bytes are the gateway's own. Counted, not judged as forged.
        variant, state = _reencoded(rng, real.state)
        variant = "reencoded_" + variant
        send = _continued(rng, ctx, "asker_confirm", "alice", state=state, responses=answer,
                          capabilities=real.capabilities)
    elif how == "other_identity":
        variant = "other_identity"
        send = _continued(rng, ctx, "asker_confirm", "bob", state=real.state, responses=answer,
                          capabilities=real.capabilities, expect=REFUSED)
    elif how == "other_tool":
        variant = "other_tool"
        send = _continued(rng, ctx, rng.choice(("plain_echo", "asker_two_steps", "asking_ask_user")), "alice",
                          state=real.state, responses=answer, capabilities=real.capabilities, expect=REFUSED)
    elif how == "other_method":
        variant = "other_method"
        send = _continued(rng, ctx, "asker_confirm", "alice", state=real.state, responses=answer,
                          method="prompts/get", capabilities=real.capabilities, expect=REFUSED)
    else:
        # The same caller, tool and state, other arguments: the gateway sealed the target,
        # not the arguments; the backend's own state decides (served or refused, never -32603).
        variant = "other_item"
        send = _continued(rng, ctx, "asker_confirm", "alice", state=real.state, responses=answer,
                          capabilities=real.capabilities, arguments={"item": rng.choice(("y", "", "x "))})
    return variant, _one(send)


def case_continuation_real(rng: random.Random, ctx: EdgeContext, revision: str) -> tuple[str, Callable[[], Plan]]:
    """A real requestState with its answer (served), replayed (a backend's state may be:
    the backend decides), or with answers that are not the ones asked for."""
    who, _ = _token(rng, ctx)
    real = rng.choice(ctx.states[who])
    variant = rng.choice(("answered", "declined", "wrong_key", "malformed_answer", "no_answers",
                          "other_capabilities"))
    responses = {"answered": {real.key: {"action": "accept", "content": {"ok": True}}},
                 "declined": {real.key: {"action": "decline"}},
                 "wrong_key": {"other": {"action": "accept", "content": {"ok": True}}},
                 "malformed_answer": {real.key: wrong_value(rng)}, "no_answers": {},
                 "other_capabilities": {real.key: {"action": "accept", "content": {"ok": True}}}}[variant]
    expect, text = {"answered": (SERVED, "confirmed x"), "declined": (SERVED, "declined")}.get(variant, (ANY, None))
    # The caller's other capability set is the same caller (a state is sealed to issuer,
    # subject and passthrough headers): served or refused, never -32603.
    capabilities = CAPABILITY_SETS[3 + rng.randrange(2)] if variant == "other_capabilities" else real.capabilities
    return variant, _one(_continued(rng, ctx, "asker_confirm", who, state=real.state, responses=responses,
                                    capabilities=capabilities, expect=expect, served_text=text))


def _park(rng: random.Random, ctx: EdgeContext, who: str) -> Send:
    return _continued(rng, ctx, "asking_ask_user", who, expect=SERVED, served_text="input_required", fuzzed=False)


def case_parked(rng: random.Random, ctx: EdgeContext, revision: str) -> tuple[str, Callable[[], Plan]]:
    """A call parked for the client's retry (a legacy backend elicits): forged retries are
    refused and leave it waiting, the real one is served once."""
    who = "alice"
    variant = rng.choice(("replayed", "other_identity", "tampered", "other_tool", "unasked_retry",
                          "wrong_answers", "too_many_rounds"))
    first = _park(rng, ctx, who)

    def plan() -> Plan:
        asked = (yield first).final().get("result", {})
        state, keys = asked.get("requestState"), list(asked.get("inputRequests", {}))
        if not isinstance(state, str) or not keys:
            return  # judged already: not served
        right = {keys[0]: {"action": "accept", "content": {"name": "fz", "count": 3}}}

        def retry(**options: Any) -> Send:
            return _continued(rng, ctx, "asking_ask_user", who, state=state, responses=right, **options)

        if variant == "replayed":
            yield retry(expect=SERVED, served_text="accepted: fz x3", fuzzed=False)
            yield retry(expect=REFUSED)
            return
        if variant == "other_identity":
            yield _continued(rng, ctx, "asking_ask_user", "bob", state=state, responses=right, expect=REFUSED)
        elif variant == "tampered":
            yield _continued(rng, ctx, "asking_ask_user", who, state=_tampered(rng, state)[1], responses=right,
                             expect=REFUSED)
        elif variant == "other_tool":
            yield _continued(rng, ctx, rng.choice(("asking_ask_url", "plain_echo")), who, state=state,
                             responses=right, expect=REFUSED)
        elif variant == "unasked_retry":
            yield _continued(rng, ctx, "asking_ask_user", who, responses=right, expect=REFUSED)
        else:
            rounds = 1 if variant == "wrong_answers" else 17  # the gateway allows 16 input rounds
            for _ in range(rounds):
                again = yield _continued(rng, ctx, "asking_ask_user", who, state=state,
                                         responses={keys[0]: {"action": "maybe"}, "nope": {"action": "accept"}})
                state = again.final().get("result", {}).get("requestState", state)
            if variant == "too_many_rounds":
                return
        yield _continued(rng, ctx, "asking_ask_user", who, state=state, responses=right, expect=SERVED,
                         served_text="accepted: fz x3", fuzzed=False)

    return variant, plan


def case_client_answer(rng: random.Random, ctx: EdgeContext, revision: str) -> tuple[str, Callable[[], Plan]]:
    """2025: a call that asks the client (elicitation on its stream): answers from another
    session, another identity, malformed or to another id are refused; the right one is
    accepted once and the call goes on."""
    who = rng.choice(IDENTITIES)
    other = "bob" if who == "alice" else "alice"
    session = ctx.asking_sessions[who]
    variant = rng.choice(("other_session", "other_identity", "other_token", "malformed", "wrong_id", "replayed"))
    call = message_for(rng, ctx, LEGACY, "tools/call", {"name": "asking_ask_user", "arguments": {"question": "q"}},
                       who=who, stream=True, expect=SERVED, served_text="accepted: fz x3", fuzzed=False)
    call.headers["Mcp-Session-Id"] = session

    def answer_to(request_id: Any, result: Any, token: str, in_session: str, **options: Any) -> Send:
        return _send({"jsonrpc": "2.0", "id": request_id, "result": result}, _legacy_headers(token, in_session),
                     **options)

    def plan() -> Plan:
        streamed = yield call
        if streamed.response is None:
            return  # judged already: no answer
        asked = _read_until_request(streamed)
        if asked is None:
            yield Finish(streamed, call)
            return
        right = {"action": "accept", "content": {"name": "fz", "count": 3}}
        asked_id = asked["id"]
        if variant == "other_session":
            yield answer_to(asked_id, right, ctx.tokens[who], ctx.sessions[who][0], expect=REFUSED)
        elif variant == "other_identity":
            yield answer_to(asked_id, right, ctx.tokens[other], ctx.asking_sessions[other], expect=REFUSED)
        elif variant == "other_token":
            yield answer_to(asked_id, right, ctx.tokens[other], session, expect=REFUSED)
        elif variant == "malformed":
            yield answer_to(asked_id, rng.choice(({"action": "maybe"}, {"action": "accept", "content": 5},
                                                  wrong_value(rng))), ctx.tokens[who], session, expect=REFUSED)
        elif variant == "wrong_id":
            yield answer_to(rng.choice((asked_id + 1000 if isinstance(asked_id, int) else "x", str(asked_id))),
                            right, ctx.tokens[who], session, expect=REFUSED)
        yield answer_to(asked_id, right, ctx.tokens[who], session, expect=ACCEPTED, fuzzed=variant != "replayed")
        yield Finish(streamed, call)
        if variant == "replayed":
            yield answer_to(asked_id, right, ctx.tokens[who], session, expect=REFUSED)

    return variant, plan


def case_session_continuation(rng: random.Random, ctx: EdgeContext,
                              revision: str) -> tuple[str, Callable[[], Plan]]:
    """2025: a session has no continuations; input and a real requestState in a call's
    params must not stand in for asking (the session declared no elicitation)."""
    who, _ = _token(rng, ctx)
    real = rng.choice(ctx.states[who])
    variant = rng.choice(("real_state", "forged_state", "no_state"))
    params: dict[str, Any] = {"name": "asker_confirm", "arguments": {"item": "x"},
                              "inputResponses": {real.key: {"action": "accept", "content": {"ok": True}}}}
    if variant != "no_state":
        params["requestState"] = real.state if variant == "real_state" else _forged_state(rng, ctx)
    return variant, _one(message_for(rng, ctx, LEGACY, "tools/call", params, who=who, forbidden_text="confirmed"))


def case_subscription(rng: random.Random, ctx: EdgeContext, revision: str) -> tuple[str, Callable[[], Plan]]:
    """2025: subscribe to a resource, then unsubscribe (a subscription is state the
    session keeps, threads included, until it ends)."""
    who = rng.choice(IDENTITIES)
    session = rng.choice(ctx.sessions[who])
    uri = rng.choice((WATCHED_URI, "test://nope", random_text(rng)))

    def plan() -> Plan:
        for method in ("resources/subscribe", "resources/unsubscribe"):
            send = message_for(rng, ctx, LEGACY, method, {"uri": uri}, who=who, fuzzed=method.endswith("/subscribe"))
            send.headers["Mcp-Session-Id"] = session
            yield send

    return "subscribe_unsubscribe", plan


Builder = Callable[[random.Random, EdgeContext, str], tuple[str, Callable[[], Plan]]]
# (category, weight, builder) per revision: what share of the cases each kind of message is.
COMMON: tuple[tuple[str, int, Builder], ...] = (
    ("valid", 14, case_valid), ("malformed_json", 7, case_malformed_json), ("envelope", 8, case_envelope),
    ("wrong_types", 12, case_wrong_types), ("huge_deep", 5, case_huge_deep), ("batch", 3, case_batch),
    ("unknown_method", 4, case_unknown_method), ("notification", 5, case_notification),
    ("client_response", 3, case_client_response), ("headers", 10, case_headers), ("http_method", 2, case_http_method),
    ("chunked", 2, case_chunked),
)
CATEGORIES: dict[str, tuple[tuple[str, int, Builder], ...]] = {
    LEGACY: COMMON + (("session", 9, case_session), ("initialize", 4, case_initialize),
                      ("client_answer", 2, case_client_answer), ("subscription", 1, case_subscription),
                      ("session_continuation", 2, case_session_continuation)),
    MODERN: COMMON + (("meta", 7, case_meta), ("removed_method", 2, case_removed_method),
                      ("continuation_forged", 5, case_continuation_forged),
                      ("continuation_unasked", 4, case_continuation_unasked),
                      ("continuation_tampered", 5, case_continuation_tampered),
                      ("continuation_real", 2, case_continuation_real), ("parked", 1, case_parked)),
}


def case_seed(run_seed: int, revision: str, index: int) -> int:
    return run_seed * SEED_STRIDE + REVISIONS.index(revision) * REVISION_STRIDE + index


def make_case(seed: int, ctx: EdgeContext) -> Case:
    """Case ``seed``: the same message for the same seed (the world's ids aside)."""
    revision = REVISIONS[(seed // REVISION_STRIDE) % 2]
    rng = random.Random(seed)
    kinds = CATEGORIES[revision]
    category, _, builder = rng.choices(kinds, weights=[weight for _, weight, _ in kinds])[0]
    variant, plan = builder(rng, ctx, revision)
    return Case(seed, revision, category, variant, plan)


# ----------------------------------------------------------------------------------
# Sending
# ----------------------------------------------------------------------------------


def _chunks(body: bytes) -> Iterator[bytes]:
    for at in range(0, len(body), 65536):
        yield body[at:at + 65536]


def exchange(http: requests.Session, url: str, send: Send) -> Answer:
    data: Any = _chunks(send.body or b"") if send.chunked else send.body
    try:
        response = http.request(send.http_method, url, data=data, headers=send.headers, timeout=REQUEST_TIMEOUT_S,
                                stream=send.stream, allow_redirects=False)
    except requests.RequestException as error:
        return Answer(failure=f"{error.__class__.__name__}: {str(error)[:200]}")
    answer = Answer(response.status_code, response.headers.get("Content-Type", ""))
    if send.stream:
        answer.response = response
        return answer
    answer.body = response.content
    answer.session = response.headers.get("Mcp-Session-Id")  # an initialize's (the case deletes it)
    return answer


def _read_until_request(answer: Answer) -> dict[str, Any] | None:
    """Read a streamed 2025 answer up to the gateway's request for the client."""
    if answer.response is None or not answer.content_type.startswith("text/event-stream"):
        return None
    lines = answer.response.iter_lines(decode_unicode=True)
    answer.response.lines = lines  # the rest is read from the same iterator
    data: list[str] = []
    for line in lines:
        answer.read.append(line)
        if line.startswith("data:"):
            data.append(line[5:].lstrip(" "))
        elif line == "" and data:
            text, data = "\n".join(data), []
            if not text.strip():
                continue  # the priming event: an id and a retry, no message
            try:
                message = json.loads(text)
            except ValueError:
                return None
            if isinstance(message, dict) and "method" in message and "id" in message:
                return message
    return None


def _finish(answer: Answer) -> None:
    """The rest of a streamed answer, into ``answer.body``."""
    response = answer.response
    if response is None:
        return
    try:
        lines = getattr(response, "lines", None)
        rest = list(lines) if lines is not None else response.text.splitlines()
        answer.body = "\n".join(answer.read + rest).encode() + b"\n"
        answer.read = []
    except requests.RequestException as error:
        answer.failure = f"the stream broke: {error.__class__.__name__}"
    finally:
        response.close()
        answer.response = None


# ----------------------------------------------------------------------------------
# Running
# ----------------------------------------------------------------------------------


@dataclass
class Tally:
    """What a run did, and every bad answer (with the seed that makes it again)."""

    cases: Counter = field(default_factory=Counter)  # (revision, category)
    variants: Counter = field(default_factory=Counter)  # (revision, category, variant)
    statuses: Counter = field(default_factory=Counter)  # (revision, HTTP status or "none")
    codes: Counter = field(default_factory=Counter)  # (revision, JSON-RPC error code of the answer)
    requests: int = 0
    skipped: Counter = field(default_factory=Counter)  # (revision, KNOWN_BAD name): cases not sent
    bad: list[Bad] = field(default_factory=list)
    reencoded: Counter = field(default_factory=Counter)  # a real state in other base64 text: served / refused
    lock: threading.Lock = field(default_factory=threading.Lock)

    def cases_of(self, revision: str) -> int:
        return sum(n for (rev, _), n in self.cases.items() if rev == revision)


def run_case(http: requests.Session, ctx: EdgeContext, case: Case, tally: Tally,
             on_exchange: Callable[[Send, Answer, list[str]], None] | None = None,
             skip: frozenset[str] = frozenset()) -> None:
    """Send the case's steps, judging each answer; a step that would get a known bad answer
    named in ``skip`` ends the case unsent."""
    plan = case.plan()
    streamed: list[Answer] = []
    try:
        step = next(plan)
        while True:
            if isinstance(step, Finish):
                _finish(step.answer)
                send, answer = step.send, step.answer
            else:
                bug = known_bad(case, step) if skip else None
                if bug in skip:
                    with tally.lock:
                        tally.skipped[(case.revision, bug)] += 1
                    return
                send, answer = step, exchange(http, ctx.url, step)
                if answer.response is not None:
                    streamed.append(answer)
            if not send.stream or answer.response is None:
                problems = judge(send, answer, ctx.markers)
                with tally.lock:
                    if case.variant.startswith("reencoded_") and send.fuzzed:
                        tally.reencoded["served" if answer.status == 200 and "result" in answer.final()
                                        else "refused"] += 1
                    tally.requests += 1
                    tally.statuses[(case.revision, answer.status or "none")] += 1
                    error = answer.final().get("error")
                    if isinstance(error, dict) and "code" in error:
                        tally.codes[(case.revision, error["code"])] += 1
                    if problems:
                        tally.bad.append(Bad(case, send, answer, problems))
                if on_exchange is not None:
                    on_exchange(send, answer, problems)
            step = plan.send(answer)
    except StopIteration:
        pass
    finally:
        plan.close()
        for answer in streamed:
            if answer.response is not None:
                answer.response.close()


def run_fuzz(ctx: EdgeContext, run_seed: int, per_revision: int, workers: int,
             skip: frozenset[str] = frozenset()) -> Tally:
    """``per_revision`` cases of each revision from ``workers`` threads; cases that would
    get a known bad answer named in ``skip`` are drawn (the seeds stay the same), not sent."""
    tally = Tally()
    seeds = iter([case_seed(run_seed, revision, n) for n in range(per_revision) for revision in REVISIONS])
    seeds_lock = threading.Lock()
    failures: list[BaseException] = []

    def work() -> None:
        with requests.Session() as http:
            while True:
                with seeds_lock:
                    seed = next(seeds, None)
                if seed is None:
                    return
                try:
                    case = make_case(seed, ctx)
                    with tally.lock:
                        tally.cases[(case.revision, case.category)] += 1
                        tally.variants[(case.revision, case.category, case.variant)] += 1
                    run_case(http, ctx, case, tally, skip=skip)
                except Exception as error:  # noqa: BLE001 - a broken case is reported with its seed
                    failures.append(RuntimeError(f"the harness broke on case seed={seed}: {error!r}"))
                    return

    threads = [threading.Thread(target=work, name=f"fuzz-client-{n}", daemon=True) for n in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise failures[0]
    return tally


def thread_names() -> Counter:
    """This process's threads by name, numbers taken out (``Thread-12 (x)`` is ``Thread-N (x)``)."""
    import re

    return Counter(re.sub(r"\d+", "N", thread.name) for thread in threading.enumerate())


def thread_counts() -> tuple[int, int]:
    """This process's threads: Python's count and the kernel's (/proc/self/task)."""
    return threading.active_count(), len(os.listdir("/proc/self/task"))


def settled_thread_counts(timeout: float = 10.0) -> tuple[int, int]:
    """The counts once no connection thread of the werkzeug server is left (the set-up's
    connections closed): what the process holds between requests."""
    deadline = time.monotonic() + timeout
    while any(t.name.endswith("(process_request_thread)") for t in threading.enumerate()) \
            and time.monotonic() < deadline:
        time.sleep(0.02)
    return thread_counts()


def wait_for_threads(before: tuple[int, int], margin: int = THREAD_MARGIN,
                     timeout: float = THREAD_WAIT) -> tuple[int, int]:
    """Poll until both counts are within ``margin`` of ``before`` (or ``timeout`` passes);
    the last counts."""
    deadline = time.monotonic() + timeout
    while True:
        now = thread_counts()
        if all(n <= b + margin for n, b in zip(now, before)) or time.monotonic() > deadline:
            return now
        time.sleep(0.05)


def still_serves(ctx: EdgeContext) -> list[str]:
    """A plain tools/call in both revisions, after the fuzz: what went wrong (empty: fine)."""
    problems = []
    session = open_session(ctx.url, ctx.tokens["alice"])
    try:
        for revision in REVISIONS:
            text = f"after-fuzz-{revision}"
            try:
                got = echo_call(ctx.url, revision, ctx.tokens["alice"], text, session, {"elicitation": {}})
            except RuntimeError as error:
                problems.append(f"{revision}: {error}")
                continue
            if got != f"plain:{text}":
                problems.append(f"{revision}: answered {got!r}")
    finally:
        requests.delete(ctx.url, headers=_legacy_headers(ctx.tokens["alice"], session), timeout=REQUEST_TIMEOUT_S)
    return problems


# ----------------------------------------------------------------------------------
# The stack: backends, identity provider, gateway config
# ----------------------------------------------------------------------------------


@contextlib.contextmanager
def fuzz_backends() -> Iterator[dict[str, Any]]:
    """The three backends (started; stopped on exit), by name."""
    from tests.asking_backends import asking_backend
    from tests.backends import sdk_backend
    from tests.mrtr_backends import mrtr_backend

    with contextlib.ExitStack() as stack:
        yield {"plain": stack.enter_context(sdk_backend("plain", ["echo", "fail", "structured"])),
               "asker": stack.enter_context(mrtr_backend("asker")),
               "asking": stack.enter_context(asking_backend("asking"))}


def gateway_config(backends: Mapping[str, Any], idp: Any) -> dict[str, Any]:
    from tests.gateway import backend_entry

    return {"name": "fuzz", "backends": [backend_entry("plain", backends["plain"]),
                                         backend_entry("asker", backends["asker"]),
                                         backend_entry("asking", backends["asking"], "legacy")],
            "incomingAuth": {"type": "oidc", "oidc": {"issuer": idp.issuer, "audience": AUDIENCE}}}


def backend_urls(backends: Mapping[str, Any]) -> list[str]:
    return [backend.url for backend in backends.values()]


# ----------------------------------------------------------------------------------
# The benchmark
# ----------------------------------------------------------------------------------


def _lone_surrogate_in(value: Any) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if any("\ud800" <= c <= "\udfff" for c in item):
                return True
        elif isinstance(item, dict):
            stack += list(item.keys()) + list(item.values())
        elif isinstance(item, list):
            stack += item
    return False


def known_bad(case: Case, send: Send) -> str | None:
    """Which known bad answer ``send`` would get (a KNOWN_BAD name), or None."""
    name = None
    if case.variant.endswith("_beyond_1000"):
        name = "deep_json"
    elif case.variant == "too_many_rounds":
        name = "too_many_rounds"
    else:
        try:
            message = json.loads(send.body or b"null")
        except (ValueError, RecursionError):
            return None
        params = message.get("params") if isinstance(message, dict) else None
        name = "lone_surrogate" if _lone_surrogate_in(params) else None
    return name if name in KNOWN_BAD else None


def _quiet_logs() -> None:
    import logging

    logging.getLogger("werkzeug").setLevel(logging.CRITICAL)  # no access log line, no 431 line per request
    logging.getLogger("mcp").setLevel(logging.CRITICAL)  # the SDK backends' refusals of the fuzz
    # The gateway logs refusals (INFO), what it cannot serve (WARNING) and unhandled errors
    # (ERROR, with a traceback): here each of those is an answer, judged and counted.
    logging.getLogger("vmcp_actors").setLevel(logging.CRITICAL)


def summary_rows(tally: Tally) -> list[tuple[str, str, str]]:
    categories = sorted({category for _, category in tally.cases})
    rows = [(category, *(f"{tally.cases[(rev, category)]:,}" if (rev, category) in tally.cases else "-"
                         for rev in REVISIONS)) for category in categories]
    rows.append(("total", *(f"{tally.cases_of(rev):,}" for rev in REVISIONS)))
    return rows


def body(args: argparse.Namespace) -> list[Check]:
    from tests.gateway import GatewayServer
    from tests.idp import LocalIdP

    _quiet_logs()
    print_header("client edge fuzz (issue 35)", "werkzeug",
                 [f"seed {args.seed}, {args.messages:,} cases per revision ({', '.join(REVISIONS)}), "
                  f"{args.workers} client threads",
                  "backends: plain (SDK echo), asker (SDK multi-round-trip), asking (SDK elicitation, legacy); "
                  "OIDC (tests/idp.py), identities alice and bob"])
    with contextlib.ExitStack() as stack:
        idp = stack.enter_context(LocalIdP("fuzz-idp"))
        backends = stack.enter_context(fuzz_backends())
        gateway = GatewayServer(gateway_config(backends, idp)).start()
        stack.callback(gateway.stop)
        ctx = prepare(gateway.url, idp, backend_urls(backends))
        if args.replay:
            return replay(ctx, args.replay)
        before = settled_thread_counts()
        names_before = thread_names()
        started = time.perf_counter()
        tally = run_fuzz(ctx, args.seed, args.messages, args.workers)
        elapsed = time.perf_counter() - started
        after = wait_for_threads(before)
        names_after = thread_names()
        serving = still_serves(ctx)
        print(table(["category", *REVISIONS], summary_rows(tally)))
        print()
        print(f"requests sent: {tally.requests:,} (the cases' messages and their set-up and follow-up steps)")
        for revision in REVISIONS:
            statuses = sorted(((str(s), n) for (rev, s), n in tally.statuses.items() if rev == revision))
            print(f"HTTP statuses, {revision}: " + ", ".join(f"{s}: {n:,}" for s, n in statuses))
            codes = sorted((code, n) for (rev, code), n in tally.codes.items() if rev == revision)
            print(f"JSON-RPC error codes, {revision}: " + ", ".join(f"{c}: {n:,}" for c, n in codes))
        print(f"real requestStates re-encoded (the same sealed bytes in other base64 text): "
              f"{tally.reencoded['served']} served, {tally.reencoded['refused']} refused")
        print(f"elapsed: {elapsed:.1f} s ({tally.requests / elapsed:,.0f} requests/s)")
        print(f"threads (threading.active_count, /proc/self/task): before {before[0]}, {before[1]}; "
              f"after {after[0]}, {after[1]}")
        more, fewer = names_after - names_before, names_before - names_after
        if more or fewer:
            print(f"threads by name, after - before: +{dict(more)} -{dict(fewer)}")
        print(f"a plain tools/call afterwards: {'answered in both revisions' if not serving else serving}")
        by_kind = Counter((bad.case.revision, bad.case.category, bad.case.variant) for bad in tally.bad)
        print(f"\nbad answers: {len(tally.bad)}")
        by_bug = Counter(known_bad(bad.case, bad.send) or "not a known bug" for bad in tally.bad)
        for name, n in sorted(by_bug.items()):
            print(f"  {n:5d}  {name}: {KNOWN_BAD.get(name, 'new: see below')}")
        print("by kind of case:")
        for (revision, category, variant), n in sorted(by_kind.items()):
            seeds = sorted({bad.case.seed for bad in tally.bad if (bad.case.revision, bad.case.category,
                                                                   bad.case.variant) == (revision, category, variant)})
            print(f"  {n:5d}  {revision} {category}/{variant}  (seeds {', '.join(map(str, seeds[:8]))}"
                  f"{', ...' if len(seeds) > 8 else ''})")
        unknown = [bad for bad in tally.bad if known_bad(bad.case, bad.send) is None]
        known = [bad for bad in tally.bad if known_bad(bad.case, bad.send) is not None]
        for bad in unknown + known[:args.show]:  # every new one, and the first few known
            print("  " + bad.describe())
    return [Check("bad answers", str(len(tally.bad)), "0", not tally.bad),
            Check("threads after the run (active_count, /proc/self/task)", f"{after[0]}, {after[1]}",
                  f"<= {before[0] + THREAD_MARGIN}, {before[1] + THREAD_MARGIN}",
                  all(n <= b + THREAD_MARGIN for n, b in zip(after, before))),
            Check("a plain tools/call afterwards, both revisions", "answered" if not serving else "; ".join(serving),
                  "answered", not serving)]


def replay(ctx: EdgeContext, seeds: Sequence[int]) -> list[Check]:
    """Send the cases of ``seeds`` again, one by one, showing every exchange."""
    tally = Tally()

    def show(send: Send, answer: Answer, problems: list[str]) -> None:
        headers = {k: (v[:80] if isinstance(v, (str, bytes)) else v) for k, v in send.headers.items()}
        print(f"  {'fuzzed' if send.fuzzed else 'step'}: {send.http_method} {headers}")
        print(f"    body: {(send.body or b'')[:600]!r}{' ...' if len(send.body or b'') > 600 else ''}")
        print(f"    answer: {answer.failure or answer.status} {answer.body[:600]!r}")
        print(f"    {'BAD: ' + '; '.join(problems) if problems else 'ok'}")

    with requests.Session() as http:
        for seed in seeds:
            case = make_case(seed, ctx)
            print(f"seed={seed} revision={case.revision} category={case.category} variant={case.variant}")
            run_case(http, ctx, case, tally, show)
    return [Check("bad answers (replayed)", str(len(tally.bad)), "0", not tally.bad)]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=35, help="the run's seed (default 35)")
    parser.add_argument("--messages", type=int, default=10_000, help="cases per revision (default 10,000)")
    parser.add_argument("--workers", type=int, default=4, help="client threads (default 4)")
    parser.add_argument("--show", type=int, default=10,
                        help="known bad answers shown in full (default 10; every other one is)")
    parser.add_argument("--replay", type=int, nargs="*", default=[], help="send only these case seeds, verbosely")
    args = parser.parse_args(argv)
    run_benchmark(lambda: body(args), watchdog=WATCHDOG)


if __name__ == "__main__":
    main(sys.argv[1:])
