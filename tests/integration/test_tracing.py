"""Tracing (issue 14, item 4): `telemetry.tracingEnabled` gives one SERVER span per client
request (child of the client's traceparent) and a CLIENT span per backend exchange under
it; the backend gets the W3C traceparent (the header; `_meta.traceparent` too when it
speaks 2026-07-28). The SDK's in-memory exporter stands in for the OTLP collector."""

from __future__ import annotations

import json

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.backends import restartable_backend
from tests.gateway import backend_entry
from tests.scripted_http import ScriptedServer, clear_network_env
from vmcp_actors import tracing
from vmcp_actors.backends import McpHttpClient
from vmcp_actors.config import TelemetryConfig

CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
CLIENT_PARENT = "b7ad6b7169203331"
ON = TelemetryConfig(endpoint="http://127.0.0.1:9", tracing_enabled=True, service_name="vmcp-test")


@pytest.fixture
def spans():
    exporter = InMemorySpanExporter()
    yield exporter
    tracing.shutdown()


def test_a_call_is_a_server_span_with_a_backend_child_and_the_backend_gets_the_trace(start_gateway, spans):
    backend = restartable_backend("rs")
    try:
        gateway = start_gateway({"name": "traced", "backends": [backend_entry("rs", backend)],
                                 "telemetry": {"endpoint": "http://127.0.0.1:9", "tracingEnabled": True}})
        tracing.configure(ON, exporter=spans)  # the collector: in memory
        sid = gateway.initialize()
        spans.clear()
        backend.clear_received()
        answer = gateway.post({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                               "params": {"name": "rs_echo", "arguments": {"text": "t"}}}, sid,
                              headers={"MCP-Protocol-Version": "2025-11-25",
                                       "traceparent": f"00-{CLIENT_TRACE}-{CLIENT_PARENT}-01"})
        assert answer.status_code == 200
        finished = {span.name: span for span in spans.get_finished_spans()}
        server, client = finished["mcp tools/call"], finished["backend rs"]
        assert format(server.context.trace_id, "032x") == CLIENT_TRACE
        assert format(server.parent.span_id, "016x") == CLIENT_PARENT  # the client's span is the parent
        assert server.attributes["mcp.target"] == "rs_echo" and server.attributes["mcp.session.id"] == sid[:8]
        assert client.parent.span_id == server.context.span_id
        assert client.context.trace_id == server.context.trace_id
        assert client.attributes["vmcp.backend"] == "rs" and client.attributes["http.response.status_code"] == 200
        (call,) = backend.requests("tools/call")
        sent = call.headers["traceparent"]
        assert sent.split("-")[1] == CLIENT_TRACE and sent.split("-")[2] == format(client.context.span_id, "016x")
        assert server.resource.attributes["service.name"] == "vmcp-test"
        assert "127.0.0.1" not in json.dumps({k: str(v) for k, v in server.attributes.items()})
    finally:
        backend.stop()


def test_without_telemetry_nothing_is_traced_or_sent(start_gateway, spans):
    backend = restartable_backend("rs")
    try:
        gateway = start_gateway({"name": "plain", "backends": [backend_entry("rs", backend)]})
        sid = gateway.initialize()
        gateway.rpc(sid, "tools/call", {"name": "rs_echo", "arguments": {"text": "t"}})
        assert all("traceparent" not in m.headers for m in backend.received)
    finally:
        backend.stop()


def test_a_2026_07_28_backend_gets_the_traceparent_in_meta_too(spans, monkeypatch):
    clear_network_env(monkeypatch)  # the client goes straight to loopback
    with ScriptedServer() as backend:
        backend.post(json={"jsonrpc": "2.0", "id": 1, "result": {"content": []}})
        tracing.configure(ON, exporter=spans)
        client = McpHttpClient("modern", backend.url())
        try:
            exchange = client.exchange({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                                        "params": {"name": "x", "_meta": {"io.modelcontextprotocol/clientInfo": {}}}},
                                       session_id=None, protocol_version="2026-07-28", timeout=5)
            with pytest.raises(StopIteration):
                next(exchange)
        finally:
            client.close()
    (sent,) = backend.calls
    body = sent.json()
    assert body["params"]["_meta"]["traceparent"] == sent.headers["traceparent"]
    assert body["params"]["_meta"]["io.modelcontextprotocol/clientInfo"] == {}  # the rest of _meta kept
    # (other threads of earlier tests may still finish exchanges: only this client's span counts)
    assert [span.name for span in spans.get_finished_spans() if span.name == "backend modern"] == ["backend modern"]


def test_the_telemetry_config_is_checked():
    from vmcp_actors.config import config_from_mapping
    from vmcp_actors.exceptions import ConfigError

    base = {"name": "x", "backends": [{"name": "a", "url": "http://127.0.0.1:1/mcp"}]}
    with pytest.raises(ConfigError) as caught:
        config_from_mapping({**base, "telemetry": {"tracingEnabled": True, "samplingRate": 1.5}})
    assert list(caught.value.errors) == ["telemetry.samplingRate: must be between 0 and 1"]
    with pytest.raises(ConfigError) as caught:
        config_from_mapping({**base, "telemetry": {"tracingEnabled": True}})
    assert list(caught.value.errors) == ["telemetry.endpoint: tracingEnabled needs the OTLP endpoint to send "
                                         "traces to"]
    loaded = config_from_mapping({**base, "telemetry": {"endpoint": "http://c:4318", "tracingEnabled": True,
                                                        "headers": {"x-api-key": "s3cret"}}})
    assert "s3cret" not in repr(loaded)


def test_a_composite_tools_steps_are_spans_under_its_call(start_gateway, spans):
    backend = restartable_backend("rs")
    try:
        gateway = start_gateway({"name": "traced", "backends": [backend_entry("rs", backend)],
                                 "telemetry": {"endpoint": "http://127.0.0.1:9", "tracingEnabled": True},
                                 "compositeTools": [{
                                     "name": "twice", "description": "echo twice",
                                     "parameters": {"type": "object", "properties": {"text": {"type": "string"}}},
                                     "steps": [{"id": "first", "tool": "rs.echo", "arguments": {"text": "a"}},
                                               {"id": "second", "tool": "rs.echo", "arguments": {"text": "b"},
                                                "dependsOn": ["first"]}]}]})
        tracing.configure(ON, exporter=spans)
        sid = gateway.initialize()
        spans.clear()
        answer = gateway.rpc(sid, "tools/call", {"name": "twice", "arguments": {"text": "x"}})
        assert "result" in answer, answer
        finished = spans.get_finished_spans()
        (server,) = [span for span in finished if span.name == "mcp tools/call"]
        steps = [span for span in finished if span.name == "composite step rs.echo"]
        assert len(steps) == 2
        assert all(step.parent.span_id == server.context.span_id for step in steps)
        backends = [span for span in finished
                    if span.name == "backend rs" and span.attributes["mcp.method.name"] == "tools/call"]
        assert len(backends) == 2 and all(span.context.trace_id == server.context.trace_id for span in backends)
        assert {span.parent.span_id for span in backends} <= {step.context.span_id for step in steps}
    finally:
        backend.stop()
