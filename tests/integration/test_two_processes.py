"""Two gateway processes (``vmcp-actors serve``, gunicorn, the same signing key) behind a
round-robin balancer with no sticky routing, and a 2026-07-28 client whose every request
may land on either (issue 11). Stateless pairings work across them; a retry that needs a
call parked in the other process says so at once."""

from __future__ import annotations

import asyncio
import itertools
import threading
from typing import Any

import mcp
import pytest
import requests
import yaml
from werkzeug.serving import make_server
from werkzeug.wrappers import Request, Response

from tests.backends import sdk_backend
from tests.gateway import backend_entry
from tests.integration.test_cli import VMCP, CliProcess
from tests.integration.test_modern import ALL_CAPABILITIES, _elicit, answer, modern_post
from tests.mrtr_backends import mrtr_backend
from tests.ports import free_port

pytestmark = pytest.mark.slow  # whole gateway processes (docs/testing.md)

KEY = "a-shared-signing-key-of-32-bytes!"
HOP_BY_HOP = {"host", "content-length", "connection", "transfer-encoding", "keep-alive"}


class RoundRobin:
    """A plain load balancer: each request goes to the next upstream, whole (no stickiness)."""

    def __init__(self, upstreams: list[str]):
        self.upstreams = upstreams
        self.landed: list[str] = []
        self._next = itertools.cycle(upstreams)
        self._lock = threading.Lock()
        self._server = make_server("127.0.0.1", 0, self._app, threaded=True)
        self.url = f"http://127.0.0.1:{self._server.server_port}/mcp"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def _app(self, environ: Any, start_response: Any) -> Any:
        request = Request(environ)
        with self._lock:
            upstream = next(self._next)
            self.landed.append(upstream)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        forwarded = requests.request(request.method, upstream, data=request.get_data(), headers=headers, timeout=30)
        kept = [(k, v) for k, v in forwarded.headers.items() if k.lower() not in HOP_BY_HOP | {"content-encoding"}]
        return Response(forwarded.content, status=forwarded.status_code, headers=kept)(environ, start_response)

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def two_gateways(tmp_path):
    """Start two gateway processes for a config mapping; yields a function returning the balancer."""
    started: list[Any] = []

    def start(config: dict) -> RoundRobin:
        config = {**config, "operational": {**config.get("operational", {}), "signingKeyEnv": "VMCP_KEY"}}
        path = tmp_path / "config.yaml"
        path.write_text(yaml.safe_dump(config))
        processes = []
        for index in range(2):  # both start at once, then both are waited for
            port = free_port()
            process = CliProcess([VMCP, "serve", "--config", str(path), "--host", "127.0.0.1", "--port", str(port)],
                                 tmp_path, f"gateway-{index}", env={"VMCP_KEY": KEY})
            process.__enter__()
            started.append(process)
            processes.append((process, f"http://127.0.0.1:{port}"))
        for process, base in processes:
            process.wait_ready(base)
        balancer = RoundRobin([base + "/mcp" for _, base in processes])
        started.append(balancer)
        return balancer

    yield start
    for thing in reversed(started):
        if isinstance(thing, RoundRobin):
            thing.stop()
        else:
            thing.__exit__(None, None, None)


@pytest.mark.timeout(120)
def test_a_modern_client_is_served_by_either_process_and_stateless_round_trips_cross_them(two_gateways):
    with sdk_backend("alpha", ["echo"]) as alpha, mrtr_backend("asker") as asker:
        balancer = two_gateways({"name": "gw", "backends": [backend_entry("alpha", alpha),
                                                            backend_entry("asker", asker, "modern")],
                                 "aggregation": {"conflictResolution": "prefix"}})

        async def work() -> list[str]:
            async with mcp.Client(balancer.url, elicitation_callback=_elicit) as client:
                texts = []
                for _ in range(3):
                    texts.append((await client.call_tool("alpha_echo", {"text": "x"})).content[0].text)
                # input_required from one process, the retry (with the sealed state) on the other
                texts.append((await client.call_tool("asker_confirm", {"item": "y"})).content[0].text)
                texts.append((await client.call_tool("asker_two_steps", {})).content[0].text)
                return texts

        texts = asyncio.run(work())
        assert texts == ["alpha:x"] * 3 + ["confirmed y", "Ada likes blue"]
        assert set(balancer.landed) == set(balancer.upstreams)  # both processes served the client


@pytest.mark.timeout(120)
def test_a_retry_of_a_call_parked_in_the_other_process_says_so_at_once(two_gateways):
    with mrtr_backend("asker") as asker:
        balancer = two_gateways({"name": "gw", "backends": [backend_entry("asker", asker, "legacy")],
                                 "aggregation": {"conflictResolution": "prefix"}})
        first = answer(modern_post(balancer.url, "tools/call", {"name": "asker_confirm", "arguments": {"item": "x"}},
                                   capabilities=ALL_CAPABILITIES))["result"]
        assert first["resultType"] == "input_required"
        (key,) = first["inputRequests"]
        retry = modern_post(balancer.url, "tools/call", {
            "name": "asker_confirm", "arguments": {"item": "x"}, "requestState": first["requestState"],
            "inputResponses": {key: {"action": "accept", "content": {"ok": True}}}},
            capabilities=ALL_CAPABILITIES, request_id=2)
        assert retry.status_code == 400
        error = retry.json()["error"]
        assert error["code"] == -32602 and "another gateway process" in error["message"]
        assert balancer.landed[0] != balancer.landed[1]
        # The process that parked the call still resumes it (which also ends the backend's
        # request: a backend stopped with it open waits 5 s for it).
        resumed = modern_post(balancer.landed[0], "tools/call", {
            "name": "asker_confirm", "arguments": {"item": "x"}, "requestState": first["requestState"],
            "inputResponses": {key: {"action": "accept", "content": {"ok": True}}}},
            capabilities=ALL_CAPABILITIES, request_id=3)
        assert answer(resumed)["result"]["content"][0]["text"] == "confirmed x"
