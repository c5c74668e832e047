"""The door every backend tools/call passes (issue 35, ``core/_admitted.py``): through the
stack a call reaches its backend; a way in that skips a deciding layer (a new entry point, a
layer that forgets) is refused at ``AggregatedBackends`` and nothing is sent."""

from __future__ import annotations

import concurrent.futures as cf
from types import MappingProxyType
from typing import Any

import pytest

from tests.memory_core import soon
from tests.unit.test_one_view import caps, published
from vmcp_actors.concurrency import resolved
from vmcp_actors.config import config_from_mapping
from vmcp_actors.core import _admitted
from vmcp_actors.core._aggregated import AggregatedBackends
from vmcp_actors.core._catalog import build_catalog
from vmcp_actors.core._interface import Continuation
from vmcp_actors.decorators import stack
from vmcp_actors.protocol import INTERNAL_ERROR, JsonRpcError

DOWN: dict[str, str] = {}


class RecordingChannel:
    """A backend session that records what would be sent to it."""

    personal = None  # no person connects it

    def __init__(self) -> None:
        self.sent: list[tuple[str, Any]] = []

    def speaks_modern(self) -> bool:
        return False

    def capabilities(self) -> dict[str, Any]:
        return {}  # no tasks: a call is not awaited as one

    def request(self, identity, method, params, deadline, headers=None):
        self.sent.append((method, params))

        def exchange():
            return {"content": [{"type": "text", "text": "ok"}]}
            yield  # a generator: an exchange with no events

        return exchange()

    def submit(self, identity, method, params, deadline, headers=None) -> cf.Future[Any]:
        self.sent.append((method, params))
        return resolved({"content": []})


CONFIG = {
    "name": "door",
    "backends": [{"name": "a", "url": "http://127.0.0.1:1/mcp"}],
    "incomingAuth": {"authz": {"type": "cedar", "policies": ['permit(principal, action, resource);']}},
    "rateLimiting": {"tools": [{"name": "a_x", "shared": {"maxTokens": 100, "refillPeriod": "1h"}}]},
    # every layer in the stack: a filter (that hides nothing here) and a composite tool
    "aggregation": {"tools": [{"workload": "a", "filter": ["x", "y"]}]},
    "compositeTools": [{"name": "combo", "description": "calls a.x", "parameters": {"type": "object", "properties": {}},
                        "steps": [{"id": "s", "tool": "a.x"}]}],
}


@pytest.fixture
def built():
    config = config_from_mapping(CONFIG)
    channel = RecordingChannel()
    board, user = published(build_catalog({"a": caps("a", "x", "y")}, DOWN, config.aggregation))
    backends = AggregatedBackends(user, MappingProxyType({"a": channel}), board)
    from vmcp_actors.limits import MemoryBuckets, RateLimiter  # noqa: PLC0415

    limiter = RateLimiter(config.rate_limiting, MemoryBuckets())
    outermost, composites = stack(config, limiter=limiter).build(backends, {})
    return outermost, composites, backends, channel


def _drive(exchange) -> Any:
    try:
        while True:
            next(exchange)
    except StopIteration as done:
        return done.value


def test_a_call_through_the_stack_reaches_its_backend(built):
    outermost, _composites, _backends, channel = built
    _drive(outermost.call_tool(None, "a_x", {}, None, soon()))
    _drive(outermost.call_tool(None, "a_y", {}, None, soon()))  # no bucket of its own: still decided
    assert [params["name"] for _method, params in channel.sent] == ["x", "y"]


@pytest.mark.parametrize("below", ["backends", "composites"])
def test_a_call_that_skips_the_deciding_layers_is_refused_and_nothing_is_sent(built, below, caplog):
    _outermost, composites, backends, channel = built
    layer = backends if below == "backends" else composites
    with pytest.raises(JsonRpcError) as refused:
        layer.call_tool(None, "a_x", {}, None, soon())
    assert refused.value.code == INTERNAL_ERROR and "was not admitted" in refused.value.message
    assert channel.sent == []
    assert "Cedar authz and advertising filter and rate limits did not decide" in caplog.text


def test_a_stack_without_the_layers_the_config_gives_nothing_to_do_requires_no_stamp_of_theirs(caplog):
    config = config_from_mapping({key: value for key, value in CONFIG.items()
                                  if key not in ("aggregation", "compositeTools")})  # no filter, no composites
    channel = RecordingChannel()
    board, user = published(build_catalog({"a": caps("a", "x", "y")}, DOWN, config.aggregation))
    backends = AggregatedBackends(user, MappingProxyType({"a": channel}), board)
    from vmcp_actors.limits import MemoryBuckets, RateLimiter  # noqa: PLC0415

    outermost, composites = stack(config, limiter=RateLimiter(config.rate_limiting, MemoryBuckets())).build(backends, {})
    assert composites is None
    _drive(outermost.call_tool(None, "a_x", {}, None, soon()))
    with pytest.raises(JsonRpcError, match="was not admitted"):  # Cedar's and the limits' stamps still are
        backends.call_tool(None, "a_x", {}, None, soon())
    assert [params["name"] for _method, params in channel.sent] == ["x"]
    assert "Cedar authz and rate limits did not decide" in caplog.text


def test_a_continuation_that_skips_them_is_refused_too(built):
    _outermost, _composites, backends, channel = built
    continuation = Continuation("tools/call", "a_x", {}, None, {"k": {}})
    with pytest.raises(JsonRpcError, match="was not admitted"):
        backends.resume(None, continuation, soon())
    assert channel.sent == []


def test_a_step_call_without_its_admission_is_refused(built):
    _outermost, _composites, backends, channel = built
    route = backends.lookup_tool(None, "a_x", soon())
    with pytest.raises(JsonRpcError, match="was not admitted"):
        backends.submit_route(None, route, {}, soon())
    with _admitted.admitted(_admitted.AUTHZ, "a_x"), _admitted.admitted(_admitted.LIMITS, "a_x"):
        backends.submit_route(None, route, {}, soon()).result(timeout=5)  # as StepAdmission stamps it
    assert len(channel.sent) == 1


def test_stamps_end_with_the_call_and_name_their_tool(built):
    _outermost, _composites, backends, channel = built
    with _admitted.admitted(_admitted.AUTHZ, "a_y"), _admitted.admitted(_admitted.FILTER, "a_y"), \
            _admitted.admitted(_admitted.LIMITS, "a_y"), pytest.raises(JsonRpcError):
        backends.call_tool(None, "a_x", {}, None, soon())  # stamped for another tool
    with pytest.raises(JsonRpcError):  # nothing left over from the block above
        backends.call_tool(None, "a_y", {}, None, soon())
    assert channel.sent == []


def test_a_prompt_get_or_resource_read_that_skips_cedar_is_refused():
    config = config_from_mapping(CONFIG)
    channel = RecordingChannel()
    found = caps("a", "x")
    found = type(found)(**{**found.__dict__, "capabilities": MappingProxyType({"tools": {}, "prompts": {},
                                                                               "resources": {}}),
                           "prompts": ({"name": "p"},), "resources": ({"uri": "test://r", "name": "r"},)})
    board, user = published(build_catalog({"a": found}, DOWN, config.aggregation))
    backends = AggregatedBackends(user, MappingProxyType({"a": channel}), board)
    outermost, _composites = stack(config).build(backends, {})
    _drive(outermost.get_prompt(None, "a_p", {}, None, soon()))
    _drive(outermost.read_resource(None, "test://r", None, soon()))
    assert [method for method, _params in channel.sent] == ["prompts/get", "resources/read"]
    for skipped in (lambda: backends.get_prompt(None, "a_p", {}, None, soon()),
                    lambda: backends.read_resource(None, "test://r", None, soon())):
        with pytest.raises(JsonRpcError, match="was not admitted"):
            skipped()
    assert len(channel.sent) == 2
