"""The decorators over the core interface, each over a small in-memory core: the guard
that holds an embedder's layer to subtracting, the example embedder, Cedar authz, the
optimizer, the layer order and the explain findings."""

from __future__ import annotations

import importlib.util
import json
import logging
import re
import sys
from pathlib import Path

import pytest

from tests.memory_core import MemoryCore, run, soon, tool
from vmcp_actors.config import AuthzConfig, config_from_mapping, config_warnings
from vmcp_actors.core import (
    HIDES,
    INVALID_PARAMS,
    RESOURCE_NOT_FOUND,
    Identity,
    JsonRpcError,
    Layer,
)
from vmcp_actors.decorators import (
    CedarAuthz,
    CedarPolicies,
    SubtractOnly,
    ToolOptimizer,
    stack,
)
from vmcp_actors.exceptions import ConfigError

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "filtering_decorator.py"
TOOLS = (tool("notes_search", "Search notes", read_only=True, query={}),
         tool("notes_add_note", "Add a note", read_only=False, title={}),
         tool("weather_get_forecast", "Forecast for a city", read_only=True, city={}))


def load_example():
    spec = importlib.util.spec_from_file_location("filtering_decorator", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def names(tools) -> list[str]:
    return [t["name"] for t in tools]


def refused(call) -> JsonRpcError:
    with pytest.raises(JsonRpcError) as caught:
        run(call())
    return caught.value


# -- the example embedder ---------------------------------------------------------------


def test_the_example_lists_only_what_its_policy_allows_and_refuses_the_rest_as_unknown():
    example = load_example()
    core = MemoryCore(TOOLS, resources=("weather://cities", "notes://index"), prompts=("packing_advice",))
    layer = SubtractOnly(example.ReadOnlyAgent(core), core)
    assert names(layer.list_tools(None, soon())) == ["notes_search", "weather_get_forecast"]
    error = refused(lambda: layer.call_tool(None, "notes_add_note", {"title": "x"}, None, soon()))
    assert (error.code, error.message) == (INVALID_PARAMS, "Unknown tool: notes_add_note")
    assert refused(lambda: layer.read_resource(None, "notes://index", None, soon())).code == RESOURCE_NOT_FOUND
    assert refused(lambda: layer.get_prompt(None, "packing_advice", {}, None, soon())).code == INVALID_PARAMS
    assert [r["uri"] for r in layer.list_resources(None, soon())] == ["weather://cities"]
    assert layer.list_prompts(None, soon()) == ()
    assert core.calls == []  # nothing refused reached the core
    assert run(layer.call_tool(None, "notes_search", {"query": "x"}, None, soon()))["content"][0]["text"] == \
        "notes_search ran"


def test_the_example_cannot_surface_what_the_core_did_not_list_nor_call_what_it_refuses():
    example = load_example()
    core = MemoryCore(TOOLS, refused=("weather_get_forecast",))

    class Surfacing(example.ReadOnlyAgent):
        """A policy gone wrong: it adds a tool, redefines one, and lets every name through."""

        def list_tools(self, identity, deadline):
            listed = [dict(t, description="edited") for t in super().list_tools(identity, deadline)]
            return tuple(listed) + (tool("smuggled", "not from the core"),)

        def lookup_tool(self, identity, name, deadline):
            from vmcp_actors.core import Route
            return Route("elsewhere", name, name)

        def call_tool(self, identity, name, arguments, meta, deadline):
            return self.inner.call_tool(identity, name, arguments, meta, deadline)

    allow_all = example.Policy(allow_tool=lambda t: True)
    layer = SubtractOnly(Surfacing(core, allow_all), core)
    listed = layer.list_tools(None, soon())
    assert "smuggled" not in names(listed)
    assert all(t["description"] != "edited" for t in listed)  # the core's own definitions
    assert layer.lookup_tool(None, "smuggled", soon()) is None
    assert refused(lambda: layer.call_tool(None, "smuggled", {}, None, soon())).code == INVALID_PARAMS
    # listed by the core, refused by it: the layer's permissive policy does not reach it
    assert layer.lookup_tool(None, "weather_get_forecast", soon()) is None
    assert refused(lambda: layer.call_tool(None, "weather_get_forecast", {}, None, soon())).code == INVALID_PARAMS
    assert layer.lookup_tool(None, "notes_search", soon()).backend == "memory"  # never the layer's route
    assert core.calls == []


def test_the_guard_explains_with_the_layers_own_findings_held_to_what_it_may_do():
    example = load_example()
    core = MemoryCore(TOOLS)
    layer = SubtractOnly(example.ReadOnlyAgent(core), core)
    explained = layer.explain_tool(None, "notes_add_note", soon())
    assert (explained.listed, explained.callable) == (False, False)
    assert [f.layer for f in explained.findings] == ["memory", "read-only agent"]
    assert explained.findings[-1].verdict == HIDES


def test_a_layer_that_is_no_layer_subclass_is_explained_from_its_answers():
    class Bare:
        def __init__(self, inner):
            self.inner = inner

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def list_tools(self, identity, deadline):
            return ()

        def lookup_tool(self, identity, name, deadline):
            return None

    core = MemoryCore(TOOLS)
    layer = SubtractOnly(Bare(core), core)
    assert layer.explain_tool(None, "notes_search", soon()).findings[-1].layer == "memory"  # delegated
    layer._layer.explain_tool = None  # no explain of its own: the guard reads its answers
    found = layer.explain_tool(None, "notes_search", soon())
    assert (found.findings[-1].layer, found.findings[-1].verdict) == ("Bare", HIDES)


# -- Cedar -------------------------------------------------------------------------------

POLICIES = (
    'permit(principal in THVGroup::"eng", action == Action::"call_tool", resource);',
    'permit(principal, action == Action::"call_tool", resource) when { resource has readOnlyHint && '
    'resource.readOnlyHint };',
    'forbid(principal, action == Action::"call_tool", resource == Tool::"weather_get_forecast") when '
    '{ resource has arg_city && resource.arg_city == "Atlantis" };',
    'permit(principal in THVGroup::"writers", action == Action::"get_prompt", resource);',
    'permit(principal, action == Action::"read_resource", resource) when { resource.uri like "weather://*" };',
)


def cedar(core, **config) -> CedarAuthz:
    return CedarAuthz(core, CedarPolicies(AuthzConfig(policies=POLICIES, **config)))


def person(subject: str, **claims) -> Identity:
    return Identity("https://idp", subject, claims={"sub": subject, **claims})


def test_cedar_lists_and_calls_by_the_same_decision_per_user_and_group():
    core = MemoryCore(TOOLS)
    layer = cedar(core)
    alice, bob = person("alice", groups=["eng"]), person("bob")
    assert names(layer.list_tools(alice, soon())) == names(TOOLS)
    assert names(layer.list_tools(bob, soon())) == ["notes_search", "weather_get_forecast"]
    for name in names(TOOLS):
        assert (layer.lookup_tool(bob, name, soon()) is not None) == (name in names(layer.list_tools(bob, soon())))
    assert refused(lambda: layer.call_tool(bob, "notes_add_note", {"title": "x"}, None, soon())).message == \
        "Unknown tool: notes_add_note"
    assert run(layer.call_tool(alice, "notes_add_note", {"title": "x"}, None, soon()))
    assert core.calls == [("tools/call", "notes_add_note", {"title": "x"})]


def test_cedar_reads_roles_nested_claims_and_a_configured_group_claim():
    core = MemoryCore(TOOLS)
    assert "notes_add_note" in names(cedar(core).list_tools(person("carol", roles=["eng"]), soon()))
    nested = cedar(core, group_claim_name="realm_access.roles")
    assert "notes_add_note" in names(nested.list_tools(person("dan", realm_access={"roles": ["eng"]}), soon()))
    by_role = cedar(core, group_claim_name="teams", role_claim_name="role")
    assert "notes_add_note" in names(by_role.list_tools(person("erin", teams=["ops"], role="eng"), soon()))
    assert "notes_add_note" not in names(by_role.list_tools(person("fay", teams=["ops"]), soon()))


def test_cedar_decides_calls_on_their_arguments_and_audits_the_denial(caplog):
    core = MemoryCore(TOOLS)
    layer = cedar(core)
    bob = person("bob")
    caplog.set_level(logging.INFO, logger="vmcp_actors.audit")
    error = refused(lambda: layer.call_tool(bob, "weather_get_forecast", {"city": "Atlantis"}, None, soon()))
    assert error.code == INVALID_PARAMS
    (line,) = [json.loads(r.getMessage()) for r in caplog.records if r.name == "vmcp_actors.audit"]
    assert line == {"event": "authz.denied", "issuer": "https://idp", "subject": "bob", "action": "call_tool",
                    "resource": "weather_get_forecast"}
    assert "Atlantis" not in caplog.text  # arguments are never logged
    assert run(layer.call_tool(bob, "weather_get_forecast", {"city": "Oslo"}, None, soon()))


def test_cedar_filters_prompts_and_resources_alike():
    core = MemoryCore(TOOLS, resources=("weather://cities", "notes://index"), prompts=("packing_advice",))
    layer = cedar(core)
    writer, bob = person("wes", groups=["writers"]), person("bob")
    assert [p["name"] for p in layer.list_prompts(writer, soon())] == ["packing_advice"]
    assert layer.list_prompts(bob, soon()) == ()
    assert refused(lambda: layer.get_prompt(bob, "packing_advice", {}, None, soon())).code == INVALID_PARAMS
    assert [r["uri"] for r in layer.list_resources(bob, soon())] == ["weather://cities"]
    assert refused(lambda: layer.read_resource(bob, "notes://index", None, soon())).code == RESOURCE_NOT_FOUND
    assert ("resources/read", "notes://index", None) not in core.calls


def test_cedar_anonymous_callers_are_the_anonymous_principal_and_explain_names_the_policy():
    core = MemoryCore(TOOLS)
    layer = cedar(core)
    assert names(layer.list_tools(None, soon())) == ["notes_search", "weather_get_forecast"]
    hidden = layer.explain_tool(person("bob"), "notes_add_note", soon())
    assert (hidden.listed, hidden.callable, hidden.findings[-1].verdict) == (False, False, HIDES)
    assert "no policy permits" in hidden.findings[-1].reason and 'Client::"bob"' in hidden.findings[-1].reason
    shown = layer.explain_tool(person("alice", groups=["eng"]), "notes_add_note", soon())
    assert shown.callable and "policy0" in shown.findings[-1].reason and "eng" in shown.findings[-1].reason


def test_cedar_policies_that_do_not_parse_stop_the_config_with_their_path():
    base = {"name": "x", "backends": [{"name": "a", "url": "http://127.0.0.1:1/mcp"}]}
    with pytest.raises(ConfigError) as caught:
        config_from_mapping({**base, "incomingAuth": {"authz": {"type": "cedar", "policies": [
            POLICIES[0], "permit(principal, action, resource"]}}})
    (line,) = caught.value.errors
    assert line.startswith("incomingAuth.authz.policies[1]: Cedar cannot parse it:")
    with pytest.raises(ConfigError) as caught:
        config_from_mapping({**base, "incomingAuth": {"authz": {"type": "cedar", "policies": [POLICIES[0]],
                                                                  "entitiesJson": "[{]"}}})
    assert caught.value.errors[0].startswith("incomingAuth.authz.entitiesJson: must be a JSON array")
    loaded = config_from_mapping({**base, "incomingAuth": {"authz": {"type": "none"}}})
    assert loaded.incoming_auth.authz is None


# -- the optimizer -----------------------------------------------------------------------


def test_the_optimizer_lists_two_tools_finds_by_words_and_calls_through_the_layers_below():
    core = MemoryCore(TOOLS)
    layer = ToolOptimizer(cedar(core), 2)
    bob = person("bob")
    assert names(layer.list_tools(bob, soon())) == ["find_tool", "call_tool"]
    found = run(layer.call_tool(bob, "find_tool", {"tool_description": "what will the weather be",
                                                   "tool_keywords": ["forecast"]}, None, soon()))
    assert [t["name"] for t in found["structuredContent"]["tools"]][0] == "weather_get_forecast"
    assert json.loads(found["content"][0]["text"]) == found["structuredContent"]
    # bob may not call notes_add_note: find_tool never returns it, call_tool refuses it
    writes = run(layer.call_tool(bob, "find_tool", {"tool_description": "add a note"}, None, soon()))
    assert "notes_add_note" not in [t["name"] for t in writes["structuredContent"]["tools"]]
    assert refused(lambda: layer.call_tool(bob, "call_tool", {"tool_name": "notes_add_note", "parameters": {}},
                                           None, soon())).message == "Unknown tool: notes_add_note"
    assert run(layer.call_tool(bob, "call_tool", {"tool_name": "notes_search", "parameters": {"query": "q"}},
                               None, soon()))["content"][0]["text"] == "notes_search ran"
    assert core.calls == [("tools/call", "notes_search", {"query": "q"})]


def test_the_optimizer_answers_bad_arguments_and_direct_calls_clearly():
    layer = ToolOptimizer(MemoryCore(TOOLS), 8)
    assert refused(lambda: layer.call_tool(None, "find_tool", {}, None, soon())).code == INVALID_PARAMS
    assert refused(lambda: layer.call_tool(None, "find_tool", {"tool_description": "x", "tool_keywords": 3},
                                           None, soon())).code == INVALID_PARAMS
    assert refused(lambda: layer.call_tool(None, "call_tool", {"parameters": {}}, None, soon())).code == INVALID_PARAMS
    assert refused(lambda: layer.call_tool(None, "call_tool", {"tool_name": "notes_search", "parameters": [1]},
                                           None, soon())).code == INVALID_PARAMS
    direct = refused(lambda: layer.call_tool(None, "notes_search", {}, None, soon()))
    assert "through call_tool" in direct.message
    assert refused(lambda: layer.call_tool(None, "nothing", {}, None, soon())).message == "Unknown tool: nothing"
    limited = ToolOptimizer(MemoryCore([tool(f"t{i}", "same words") for i in range(20)]), 3)
    assert len(limited.find(None, "same words", "", soon())) == 3
    explained = layer.explain_tool(None, "notes_search", soon())
    assert (explained.listed, explained.callable, explained.findings[-1].layer) == (False, True, "optimizer")


# -- the order of the layers ---------------------------------------------------------------


def test_the_layers_stack_optimizer_then_embedder_then_authz_over_the_core():
    config = config_from_mapping({"name": "x", "backends": [{"name": "a", "url": "http://127.0.0.1:1/mcp"}],
                                  "incomingAuth": {"authz": {"type": "cedar", "policies": [POLICIES[1]]}},
                                  "optimizer": {"maxToolsToReturn": 4, "embeddingService": "http://tei"}})

    class Embedder(Layer):
        pass

    core = MemoryCore(TOOLS)
    layers = core
    for wrap in stack(config, [Embedder]).above_filter:
        layers = wrap(layers)
    order = []
    layer = layers
    while layer is not core:
        order.append(type(layer).__name__ if not isinstance(layer, SubtractOnly) else f"guard({layer.layer_name})")
        layer = layer._inner
    assert order == ["ToolOptimizer", "guard(Embedder)", "CedarAuthz"]
    assert layers._limit == 4
    assert any(w.startswith("optimizer: embeddingService ignored") for w in config_warnings(config))


def test_the_optimizer_config_takes_toolhives_range():
    with pytest.raises(ConfigError) as caught:
        config_from_mapping({"name": "x", "backends": [{"name": "a", "url": "http://127.0.0.1:1/mcp"}],
                             "optimizer": {"maxToolsToReturn": 51}})
    assert list(caught.value.errors) == ["optimizer.maxToolsToReturn: must be between 1 and 50"]


def test_search_splits_names_and_hears_the_usual_words_for_list_get_create_update_delete():
    from vmcp_actors.decorators._search import ToolIndex, words

    assert words("getURLForID github_create-issue café") == ["get", "url", "for", "id", "github", "create", "issue",
                                                             "café"]
    index = ToolIndex([tool(f"github_{verb}_{obj}", f"{verb.title()} a pull request") for verb, obj in
                       (("create", "pull_request"), ("list", "pull_requests"), ("delete", "pull_request"))])
    assert index.search("show me the pull requests")[0][0]["name"] == "github_list_pull_requests"
    assert index.search("remove that pull request")[0][0]["name"] == "github_delete_pull_request"
    assert index.search("the of and") == []  # nothing but common words: nothing to rank


def test_the_public_interface_exposes_no_actor_thread_flask_or_sdk_type():
    import inspect
    import typing

    from vmcp_actors import core

    forbidden = ("pykka", "flask", "werkzeug", "mcp", "threading", "gunicorn")
    for name in core.__all__:
        value = getattr(core, name)
        module = getattr(value, "__module__", "") or ""
        assert not module.split(".")[0] in forbidden, (name, module)
    for cls in (core.Core, core.Running, core.Layer, core.Explanation, core.Finding):
        hints = typing.get_type_hints(cls) if not inspect.isabstract(cls) else {}
        for attribute, hint in hints.items():
            if not attribute.startswith("_"):
                assert not re.search(r"\b(" + "|".join(forbidden) + r")\.", repr(hint).lower()), (cls, attribute, hint)
    running_public = {name for name in vars(core.Running) if not name.startswith("_")}
    assert running_public == {"url", "stop"}
