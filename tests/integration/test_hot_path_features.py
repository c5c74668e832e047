"""No feature pays on the hot path for what it does not use: with a minimal config (one
official-SDK backend over HTTP, every default) a ``tools/call`` through a real gateway calls
no function of an optional feature's code (Cedar, rate limits, tasks, code mode, the
optimizer, composite tools and workflows, the advertising filter, embedders' layers, audit,
tracing, bulkheads, MCP Apps' shared names, OAuth and OIDC, outgoing auth, failure handling,
Redis, stdio and SSE transports), for a 2025 client session (the SDK client's legacy mode) and
a 2026-07-28 client alike. A module may be imported and its functions defined: none of them
is *called* per request.

The gateway runs in this process (a werkzeug server, a thread per connection), so a profile
hook sees every frame it runs. The hook is installed before the gateway starts
(``threading.setprofile``: its request threads have it) and records only while the measured
calls run, after warm-up calls. Pool, timer and actor threads the process started before (in
an earlier test) run jobs, timer callbacks and actor messages under the hook too: those
entry points are wrapped while the hook is installed.

The control: the same calls with Cedar, a rate limit on the tool and a backend that offers
tasks show those features' frames, so the assertion is known to see them.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import pykka
import pytest

import vmcp_actors
from tests.backends import sdk_backend
from tests.gateway import backend_entry
from tests.task_backends import task_backend
from vmcp_actors import concurrency

pytestmark = [pytest.mark.timeout(60), pytest.mark.filterwarnings("ignore::DeprecationWarning")]

PACKAGE = os.path.dirname(vmcp_actors.__file__) + os.sep
WARM_UP_CALLS = 3
MEASURED_CALLS = 5

# Each optional feature's code: a module (path under vmcp_actors/), a package (ends in /),
# or one function of a module the always-on path shares (path, qualified name).
FEATURES: dict[str, tuple[str | tuple[str, str], ...]] = {
    "Cedar": ("decorators/_cedar.py", "config/_cedar.py"),
    "rate limits": ("decorators/_rate_limits.py", "limits/_buckets.py", "limits/_limiter.py",
                    "config/_rate_limits.py"),
    "deciding layers' stamps": ("core/_admitted.py",),
    "tasks": ("core/_tasks.py", "core/_task_records.py", "core/_task_relay.py", "edge/_task_watch.py",
              "users/_task_signals.py", "decorators/_composite_tasks.py", ("core/_dispatch.py", "_task_requested"),
              ("core/_aggregated.py", "_makes_tasks")),
    "code mode": ("decorators/_code_mode.py", "codemode/"),
    "optimizer": ("decorators/_optimizer.py", "decorators/_search.py"),
    "composite tools and workflows": ("decorators/_composite.py", "decorators/_admission.py", "workflows/",
                                      "config/_composite.py"),
    "advertising filter": ("decorators/_filter.py", ("config/_model.py", "AggregationConfig.is_advertised"),
                           ("config/_model.py", "AggregationConfig.tools_for")),
    "embedders' layers": ("decorators/_guard.py",),
    "audit": ("edge/_audit.py", ("config/_model.py", "AuditConfig.records")),
    "tracing": ("tracing.py",),
    "bulkheads": ("limits/_bulkhead.py", ("backends/_channel.py", "BackendChannel._take_place")),
    "MCP Apps' shared names": ("core/_shared_names.py", ("core/_dispatch.py", "McpDispatcher.tool_called"),
                               ("core/_aggregated.py", "AggregatedBackends.own_names"),
                               ("core/_aggregated.py", "AggregatedBackends._shown_updates")),
    "OAuth and OIDC": ("oauth/", "edge/_auth.py"),
    "outgoing auth and connections": ("backends/_auth.py", "core/_connect.py",
                                      ("backends/_channel.py", "BackendChannel.personal")),
    "failure handling": ("backends/_health.py",),
    "Redis": ("users/_redis_store.py", "shared_cache.py"),
    "stdio and SSE transports": ("backends/_bus.py", "backends/_stdio.py", "backends/_sse.py",
                                 "backends/_sandbox.py"),
}
# Still called per call with the feature unused, each with why: a check the request or a
# backend's handshake decides, or a no-op called from code outside this change (vmcp_actors/web,
# backends/, edge/_service.py, core/ beyond tasks). An entry whose function no longer runs
# fails the test, to be removed.
STILL_CALLED: dict[tuple[str, str], str] = {
    ("core/_dispatch.py", "_task_requested"): "the dispatcher reads whether the call asks for a task (a 2025 "
                                              "call's params.task; absent: AWAITED, set in a context variable)",
    ("core/_aggregated.py", "_makes_tasks"): "whether a backend may answer with a task is what its handshake "
                                             "declared: read per call, the task relay met only when it did",
    ("core/_admitted.py", "refuse_unless_admitted"): "AggregatedBackends.call_tool checks the stamps; with no "
                                                     "deciding layer none are required and it returns at once",
    ("core/_dispatch.py", "McpDispatcher.tool_called"): "edge/_service.py resolves every tools/call's name "
                                                        "against the backends' own names (MCP Apps)",
    ("core/_aggregated.py", "AggregatedBackends.own_names"): "the catalog's own names for it (a dict look-up)",
    ("core/_aggregated.py", "AggregatedBackends._shown_updates"): "call_route makes the closure that would "
                                                                  "rewrite a shared ui:// URI in an update",
    ("backends/_channel.py", "BackendChannel._take_place"): "a call's bulkhead place: None without "
                                                            "maxConcurrentCalls, returns at once",
    ("backends/_channel.py", "BackendChannel.personal"): "call_route asks whether a person connects the backend "
                                                         "(outgoingAuth oauth): an isinstance check",
    ("backends/_auth.py", "Unauthenticated.headers"): "backends/_channel.py asks the backend's outgoing auth "
                                                      "for headers: {} for unauthenticated",
    ("edge/_auth.py", "AnonymousAuthenticator.authenticate"): "web/mcp.py authenticates every request: None "
                                                              "for anonymous",
    ("tracing.py", "tracing_on"): "web/mcp.py and backends/_http.py ask whether tracing is on (an attribute "
                                  "read) before making a span",
}
STILL_CALLED_MODERN: dict[tuple[str, str], str] = {
    ("core/_tasks.py", "declares_tasks"): "edge/_service.py reads every 2026-07-28 request's capabilities for "
                                          "whether its client takes tasks",
}
# Frames that prove the hook saw the measured calls being served.
SERVED = {("core/_dispatch.py", "McpDispatcher.handle"), ("core/_aggregated.py", "AggregatedBackends.call_route")}


def feature_of(frame: tuple[str, str]) -> str | None:
    path = frame[0]
    for feature, code in FEATURES.items():
        for where in code:
            if where == frame or where == path or (isinstance(where, str) and where.endswith("/")
                                                  and path.startswith(where)):
                return feature
    return None


def features_run(ran: set[tuple[str, str]]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for frame in sorted(ran):
        feature = feature_of(frame)
        if feature is not None:
            found.setdefault(feature, []).append(f"{frame[0]}:{frame[1]}")
    return found


class CallRecorder:
    """The project's functions (path under ``vmcp_actors/``, qualified name) that run while
    ``recording``, on any thread that has the hook."""

    def __init__(self) -> None:
        self.recording = False
        self.installed = False
        self.ran: set[tuple[str, str]] = set()

    def hook(self, frame: Any, event: str, arg: Any) -> None:
        if event != "call":
            return
        if not self.installed:  # a thread started under the hook drops it at its next call
            sys.setprofile(None)
            return
        if self.recording:
            code = frame.f_code
            if code.co_filename.startswith(PACKAGE):
                self.ran.add((code.co_filename[len(PACKAGE):].replace(os.sep, "/"), code.co_qualname))

    def profiled(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` run under the hook, on a thread that was started without it."""
        def run(*args: Any, **kwargs: Any) -> Any:
            if sys.getprofile() is not None:
                return fn(*args, **kwargs)
            sys.setprofile(self.hook)
            try:
                return fn(*args, **kwargs)
            finally:
                sys.setprofile(None)
        return run

    @contextmanager
    def installed_hooks(self) -> Iterator[CallRecorder]:
        """The hook on every thread started meanwhile, and on the work of the pools, the
        timer thread and actors (whose threads may be older); all of it undone on exit."""
        submit, call_later = concurrency.BoundedPool.submit, concurrency.TimerQueue.call_later
        handle_receive = pykka.Actor._handle_receive  # noqa: SLF001 - every actor's message, pooled or not
        recorder = self

        def profiled_submit(pool: concurrency.BoundedPool, fn: Callable[..., Any], *args: Any) -> Any:
            return submit(pool, recorder.profiled(fn), *args)

        def profiled_call_later(timers: concurrency.TimerQueue, delay: float, fn: Callable[[], None]) -> Any:
            return call_later(timers, delay, recorder.profiled(fn))

        def profiled_receive(actor: pykka.Actor, message: Any) -> Any:
            return recorder.profiled(handle_receive)(actor, message)

        self.installed = True
        try:
            concurrency.BoundedPool.submit = profiled_submit  # type: ignore[method-assign]
            concurrency.TimerQueue.call_later = profiled_call_later  # type: ignore[method-assign]
            pykka.Actor._handle_receive = profiled_receive  # type: ignore[method-assign]  # noqa: SLF001
            threading.setprofile(self.hook)
            yield self
        finally:
            threading.setprofile(None)  # type: ignore[arg-type]
            pykka.Actor._handle_receive = handle_receive  # type: ignore[method-assign]  # noqa: SLF001
            concurrency.TimerQueue.call_later = call_later  # type: ignore[method-assign]
            concurrency.BoundedPool.submit = submit  # type: ignore[method-assign]
            self.recording = False
            self.installed = False

    @contextmanager
    def recorded(self) -> Iterator[None]:
        self.ran.clear()
        self.recording = True
        try:
            yield
        finally:
            self.recording = False


@pytest.fixture(scope="module")
def plain():
    served = sdk_backend("plain", ["echo"])
    yield served
    served.stop()


@pytest.fixture(scope="module")
def jobs():
    """A 2026-07-28 backend that offers tasks (its echo never makes one)."""
    served = task_backend("jobs")
    yield served
    served.stop()


def minimal(plain) -> dict[str, Any]:
    return {"name": "hot-path", "backends": [backend_entry("plain", plain)]}


def with_cedar_a_rate_limit_and_tasks(jobs) -> dict[str, Any]:
    return {"name": "hot-path-control", "backends": [{"name": "jobs", "url": jobs.mcp_url}],
            "incomingAuth": {"type": "anonymous",
                             "authz": {"type": "cedar", "policies": ["permit(principal, action, resource);"]}},
            "rateLimiting": {"tools": [{"name": "jobs_echo", "global": {"maxTokens": 1000, "refillPeriod": "1h"}}]}}


def measured_calls(recorder: CallRecorder, url: str, mode: str, tool: str) -> set[tuple[str, str]]:
    """The project's functions MEASURED_CALLS tools/call of one SDK client run (after warm-up)."""
    import mcp

    backend = tool.split("_")[0]

    async def call(client: Any, text: str) -> None:
        result = await client.call_tool(tool, {"text": text})
        assert not result.is_error and result.content[0].text == f"{backend}:{text}", result

    async def main() -> None:
        async with mcp.Client(url, mode=mode) as client:
            for n in range(WARM_UP_CALLS):
                await call(client, f"warm-{n}")
            with recorder.recorded():
                for n in range(MEASURED_CALLS):
                    await call(client, f"measured-{n}")

    asyncio.run(main())
    return set(recorder.ran)


def ran_in(start_gateway, config: Mapping[str, Any], mode: str, tool: str) -> set[tuple[str, str]]:
    recorder = CallRecorder()
    with recorder.installed_hooks():
        gateway = start_gateway(dict(config))
        ran = measured_calls(recorder, gateway.url, mode, tool)
    assert SERVED <= ran, f"the hook did not see the calls served: {sorted(ran)[:20]}"
    return ran


MODES = [pytest.param("legacy", id="2025-session"), pytest.param("auto", id="2026-07-28")]


@pytest.mark.parametrize("mode", MODES)
def test_a_call_with_nothing_configured_runs_no_optional_features_code(start_gateway, plain, mode):
    ran = ran_in(start_gateway, minimal(plain), mode, "plain_echo")
    still_called = {**STILL_CALLED, **(STILL_CALLED_MODERN if mode == "auto" else {})}
    assert features_run(ran - set(still_called)) == {}
    stale = sorted(frame for frame in still_called if frame not in ran)
    assert not stale, f"no longer called per request: remove from STILL_CALLED: {stale}"


@pytest.mark.parametrize("mode", MODES)
def test_with_cedar_a_rate_limit_and_tasks_their_code_runs_and_only_theirs(start_gateway, jobs, mode):
    ran = ran_in(start_gateway, with_cedar_a_rate_limit_and_tasks(jobs), mode, "jobs_echo")
    still_called = {**STILL_CALLED, **(STILL_CALLED_MODERN if mode == "auto" else {})}
    found = features_run(ran - set(still_called))
    assert sorted(found) == ["Cedar", "deciding layers' stamps", "rate limits", "tasks"], found
    assert "decorators/_cedar.py:CedarAuthz.call_tool" in found["Cedar"]
    assert "limits/_limiter.py:RateLimiter.admit" in found["rate limits"]
    assert "core/_task_relay.py:TaskRelay.unasked" in found["tasks"]  # the backend may make one: it is awaited
