"""What the 2026-07-28 requirement set of the conformance suite (0.2.0-alpha.12) calls on the
fixture, beyond the 2025-11-25 scenarios: multi round-trip tools and a prompt that answer
``input_required`` by hand (fixed input-request keys, an HMAC-sealed ``requestState``), the
stateless diagnostics (``test_missing_capability``, ``test_streaming_elicitation``,
``test_logging_tool``) and a tool whose arguments are mirrored in ``Mcp-Param-*`` headers.

On a 2025 session the multi round-trip tools answer as they would to a first request
(``input_required`` is a 2026-07-28 result): no 2025 scenario calls them.

No ``from __future__ import annotations``: the SDK reads these signatures at registration.
"""

import base64
import hashlib
import hmac
import json
import secrets
from typing import Annotated, Any

from mcp.server.mcpserver import Context
from mcp.shared.exceptions import MCPError
from mcp_types import InputRequiredResult
from pydantic import Field

INVALID_PARAMS = -32602
MISSING_REQUIRED_CLIENT_CAPABILITY = -32021
_KEY = secrets.token_bytes(32)  # this fixture process's own; states never outlive it

NAME_SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}


def _elicit(message: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"method": "elicitation/create", "params": {"mode": "form", "message": message, "requestedSchema": schema}}


def _sample(text: str, max_tokens: int) -> dict[str, Any]:
    return {"method": "sampling/createMessage", "params": {
        "messages": [{"role": "user", "content": {"type": "text", "text": text}}], "maxTokens": max_tokens}}


ROOTS = {"method": "roots/list", "params": {}}


def seal(payload: dict[str, Any]) -> str:
    body = base64.urlsafe_b64encode(json.dumps(payload).encode()).decode()
    tag = hmac.new(_KEY, body.encode(), hashlib.sha256).hexdigest()
    return f"{body}.{tag}"


def unseal(state: Any) -> dict[str, Any]:
    """The payload of a state this fixture sealed; -32602 for anything else."""
    if not isinstance(state, str) or "." not in state:
        raise MCPError(INVALID_PARAMS, "invalid requestState")
    body, tag = state.rsplit(".", 1)
    if not hmac.compare_digest(tag, hmac.new(_KEY, body.encode(), hashlib.sha256).hexdigest()):
        raise MCPError(INVALID_PARAMS, "requestState failed its integrity check")
    return json.loads(base64.urlsafe_b64decode(body))


def _required(requests: dict[str, Any], state: str | None = None) -> InputRequiredResult:
    return InputRequiredResult.model_validate({"inputRequests": requests, "requestState": state})


def _answers(ctx: Context) -> dict[str, Any]:
    """The round's answers; a malformed set of answers is a protocol error (-32602)."""
    responses = ctx.input_responses
    if responses is None:
        return {}
    plain = {key: value.model_dump(by_alias=True, exclude_none=True) if hasattr(value, "model_dump") else value
             for key, value in dict(responses).items()}
    for value in plain.values():
        if not isinstance(value, dict):
            raise MCPError(INVALID_PARAMS, "every input response must be an object")
    return plain


def _accepted(answer: Any, field: str) -> Any:
    if isinstance(answer, dict) and answer.get("action") == "accept" and isinstance(answer.get("content"), dict):
        return answer["content"].get(field)
    return None


def add_modern_scenarios(srv: Any) -> None:
    """Register the 2026-07-28 scenarios' tools and prompt on the fixture ``MCPServer``."""

    def tool(fn: Any) -> Any:
        srv.add_tool(fn, structured_output=False)
        return fn

    @tool
    async def test_input_required_result_elicitation(ctx: Context) -> InputRequiredResult | str:
        """Asks the user's name (input_required), then greets"""
        name = _accepted(_answers(ctx).get("user_name"), "name")
        if name is None:
            return _required({"user_name": _elicit("What is your name?", NAME_SCHEMA)})
        return f"Hello, {name}!"

    @tool
    async def test_input_required_result_sampling(ctx: Context) -> InputRequiredResult | str:
        """Asks the client's LLM a question (input_required)"""
        answer = _answers(ctx).get("capital_question")
        if not isinstance(answer, dict) or "content" not in answer:
            return _required({"capital_question": _sample("What is the capital of France?", 100)})
        content = answer["content"]
        return f"The model said: {content.get('text') if isinstance(content, dict) else content}"

    @tool
    async def test_input_required_result_list_roots(ctx: Context) -> InputRequiredResult | str:
        """Asks the client's roots (input_required)"""
        answer = _answers(ctx).get("client_roots")
        if not isinstance(answer, dict) or not isinstance(answer.get("roots"), list):
            return _required({"client_roots": ROOTS})
        return "Roots: " + ", ".join(str(root.get("uri")) for root in answer["roots"] if isinstance(root, dict))

    @tool
    async def test_input_required_result_request_state(ctx: Context) -> InputRequiredResult | str:
        """Round-trips a sealed requestState"""
        answers = _answers(ctx)
        if ctx.request_state is None or "confirm" not in answers:
            schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
            return _required({"confirm": _elicit("Please confirm", schema)}, seal({"step": "confirm"}))
        if unseal(ctx.request_state).get("step") != "confirm":
            raise MCPError(INVALID_PARAMS, "requestState is for another step")
        return f"state-ok: confirmed={_accepted(answers['confirm'], 'ok')}"

    @tool
    async def test_input_required_result_multiple_inputs(ctx: Context) -> InputRequiredResult | str:
        """Asks for an elicitation, a sampling and the roots at once"""
        answers = _answers(ctx)
        wanted = {"user_name": _elicit("What is your name?", NAME_SCHEMA),
                  "greeting": _sample("Generate a greeting", 50), "client_roots": ROOTS}
        missing = {key: request for key, request in wanted.items() if key not in answers}
        if missing or ctx.request_state is None:
            return _required(missing or wanted, seal({"step": "all"}))
        unseal(ctx.request_state)
        return f"All inputs received: {_accepted(answers['user_name'], 'name')}"

    @tool
    async def test_input_required_result_multi_round(ctx: Context) -> InputRequiredResult | str:
        """Two rounds of input, the state evolving between them"""
        answers = _answers(ctx)
        state = unseal(ctx.request_state) if ctx.request_state is not None else {}
        if state.get("step") == "2" and "step2" in answers:
            return f"{state.get('name')} likes {_accepted(answers['step2'], 'color')}"
        if state.get("step") == "1" and "step1" in answers:
            name = _accepted(answers["step1"], "name")
            colour = {"type": "object", "properties": {"color": {"type": "string"}}, "required": ["color"]}
            return _required({"step2": _elicit("Step 2: What is your favorite color?", colour)},
                             seal({"step": "2", "name": name}))
        return _required({"step1": _elicit("Step 1: What is your name?", NAME_SCHEMA)}, seal({"step": "1"}))

    @tool
    async def test_input_required_result_tampered_state(ctx: Context) -> InputRequiredResult | str:
        """Refuses a requestState it did not seal"""
        if ctx.request_state is None:
            schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
            return _required({"confirm": _elicit("Please confirm", schema)}, seal({"step": "tamper"}))
        unseal(ctx.request_state)
        return "state verified"

    @tool
    async def test_input_required_result_capabilities(ctx: Context) -> InputRequiredResult | str:
        """Asks only for what the client declared it can answer"""
        declared = ctx.client_capabilities
        asked: dict[str, Any] = {}
        if declared is not None and declared.sampling is not None:
            asked["question"] = _sample("Say hello", 20)
        if declared is not None and declared.elicitation is not None:
            asked["user_name"] = _elicit("What is your name?", NAME_SCHEMA)
        if not asked or _answers(ctx):
            return "nothing needed"
        return _required(asked)

    @tool
    async def test_missing_capability(ctx: Context) -> str:
        """Needs the sampling capability: -32021 without it"""
        declared = ctx.client_capabilities
        if declared is None or declared.sampling is None:
            raise MCPError(MISSING_REQUIRED_CLIENT_CAPABILITY, "this tool needs the sampling capability",
                           {"requiredCapabilities": {"sampling": {}}})
        return "sampling is declared"

    @tool
    async def test_streaming_elicitation(ctx: Context) -> InputRequiredResult | str:
        """Needs elicitation: asks through input_required, never with a request on the stream"""
        await ctx.report_progress(1, 2, "thinking")
        name = _accepted(_answers(ctx).get("user_name"), "name")
        if name is None:
            return _required({"user_name": _elicit("What is your name?", NAME_SCHEMA)})
        return f"Hello, {name}!"

    @tool
    async def test_logging_tool(ctx: Context) -> str:
        """Logs at info (sent only when the request asked for a log level)"""
        import warnings

        from mcp.shared.exceptions import MCPDeprecationWarning

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", MCPDeprecationWarning)
            await ctx.log("info", "test_logging_tool ran")
        return "logged"

    @tool
    def test_custom_headers(region: Annotated[str, Field(json_schema_extra={"x-mcp-header": "Region"})],
                            priority: Annotated[int, Field(json_schema_extra={"x-mcp-header": "Priority"})] = 0,
                            query: str = "") -> str:
        """Arguments mirrored in Mcp-Param-Region and Mcp-Param-Priority headers"""
        return f"region={region} priority={priority} query={query}"

    @srv.prompt()
    async def test_input_required_result_prompt(ctx: Context) -> Any:
        """A prompt that asks for context first (input_required)"""
        schema = {"type": "object", "properties": {"context": {"type": "string"}}, "required": ["context"]}
        context = _accepted(_answers(ctx).get("user_context"), "context")
        if context is None:
            return _required({"user_context": _elicit("What context should the prompt use?", schema)})
        return f"Use this context: {context}"
