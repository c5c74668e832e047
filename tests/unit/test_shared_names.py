"""What two backends both claim: own tool names an MCP App calls by, and ui:// URIs (issue 38)."""

from types import MappingProxyType

import pytest

from vmcp_actors.backends import DiscoveredBackend
from vmcp_actors.concurrency import Deadline
from vmcp_actors.config import AggregationConfig
from vmcp_actors.core._catalog import build_catalog
from vmcp_actors.core._dispatch import AmbiguousToolName, McpDispatcher
from vmcp_actors.core._shared_names import OwnName, chosen_meaning
from vmcp_actors.protocol import INVALID_PARAMS

SHARED_UI = "ui://get-time/mcp-app.html"


def app_tool(name, uri=None, legacy_key=True, **meta):
    """A tool as ext-apps' registerAppTool lists it: both UI keys."""
    ui = {**({"resourceUri": uri} if uri else {}), **meta}
    tool = {"name": name, "inputSchema": {"type": "object"}, "_meta": {"ui": ui}}
    if uri and legacy_key:
        tool["_meta"]["ui/resourceUri"] = uri
    return tool


def backend(name, tools=(), resources=(), templates=()):
    return DiscoveredBackend(
        backend=name,
        capabilities=MappingProxyType({"tools": {}, "resources": {"subscribe": True}}),
        tools=tuple(tools),
        resources=tuple({"uri": uri, "name": uri, "mimeType": "text/html;profile=mcp-app"} for uri in resources),
        resource_templates=tuple({"uriTemplate": t, "name": t} for t in templates),
    )


def two_apps(**aggregation):
    """vanilla and react, both built from ext-apps' template: one tool name, one URI."""
    return build_catalog({
        "vanilla": backend("vanilla", [app_tool("get-time", SHARED_UI)], [SHARED_UI]),
        "react": backend("react", [app_tool("get-time", SHARED_UI)], [SHARED_UI]),
        "monitor": backend("monitor", [app_tool("get-system-info", "ui://system-monitor/mcp-app.html"),
                                       app_tool("poll-system-stats", visibility=["app"])],
                           ["ui://system-monitor/mcp-app.html"]),
    }, {}, AggregationConfig(**aggregation))


# -- ui:// URIs ------------------------------------------------------------------------------


def test_a_ui_uri_two_backends_use_is_rewritten_for_each_in_tools_lists_and_reads():
    catalog = two_apps()
    tools = catalog.tool_definitions
    assert tools["vanilla_get-time"]["_meta"] == {"ui": {"resourceUri": "ui://vanilla/get-time/mcp-app.html"},
                                                  "ui/resourceUri": "ui://vanilla/get-time/mcp-app.html"}
    assert tools["react_get-time"]["_meta"]["ui"]["resourceUri"] == "ui://react/get-time/mcp-app.html"
    assert sorted(r["uri"] for r in catalog.resources) == [
        "ui://react/get-time/mcp-app.html", "ui://system-monitor/mcp-app.html", "ui://vanilla/get-time/mcp-app.html"]
    assert catalog.resource_target("ui://vanilla/get-time/mcp-app.html") == ("vanilla", SHARED_UI)
    assert catalog.resource_target("ui://react/get-time/mcp-app.html") == ("react", SHARED_UI)
    assert catalog.resource_target(SHARED_UI) is None  # whose would it be?
    assert catalog.shown_uri("react", SHARED_UI) == "ui://react/get-time/mcp-app.html"


def test_a_ui_uri_only_one_backend_uses_is_left_as_its_server_wrote_it():
    catalog = two_apps()
    assert catalog.tool_definitions["monitor_get-system-info"]["_meta"]["ui"]["resourceUri"] == \
        "ui://system-monitor/mcp-app.html"
    assert catalog.resource_target("ui://system-monitor/mcp-app.html") == ("monitor", "ui://system-monitor/mcp-app.html")
    assert catalog.shown_uri("monitor", "ui://system-monitor/mcp-app.html") == "ui://system-monitor/mcp-app.html"


def test_app_only_tools_are_listed_as_their_server_lists_them():
    catalog = two_apps()
    assert catalog.tool_definitions["monitor_poll-system-stats"]["_meta"] == {"ui": {"visibility": ["app"]}}


def test_the_backends_own_tool_dicts_are_never_changed():
    vanilla = backend("vanilla", [app_tool("get-time", SHARED_UI)], [SHARED_UI])
    build_catalog({"vanilla": vanilla, "react": backend("react", [app_tool("get-time", SHARED_UI)])}, {},
                  AggregationConfig())
    assert vanilla.tools[0]["_meta"]["ui"]["resourceUri"] == SHARED_UI
    assert vanilla.resources[0]["uri"] == SHARED_UI


def test_a_uri_one_backend_lists_and_another_only_names_in_a_tool_is_shared_too():
    catalog = build_catalog({"a": backend("a", [app_tool("show", SHARED_UI)]),
                             "b": backend("b", resources=[SHARED_UI])}, {}, AggregationConfig())
    assert catalog.tool_definitions["a_show"]["_meta"]["ui"]["resourceUri"] == "ui://a/get-time/mcp-app.html"
    # a's UI is not listed by a, yet readable: a host reads what the tool names
    assert catalog.resource_target("ui://a/get-time/mcp-app.html") == ("a", SHARED_UI)
    assert [r["uri"] for r in catalog.resources] == ["ui://b/get-time/mcp-app.html"]


def test_shared_ui_templates_are_rewritten_and_a_read_goes_back_to_the_backends_own_uri():
    catalog = build_catalog({"a": backend("a", templates=["ui://widget/{id}"]),
                             "b": backend("b", templates=["ui://widget/{id}", "file:///{path}"])}, {},
                            AggregationConfig())
    assert [t["uriTemplate"] for t in catalog.resource_templates] == [
        "ui://a/widget/{id}", "ui://b/widget/{id}", "file:///{path}"]
    assert catalog.resource_target("ui://b/widget/7") == ("b", "ui://widget/7")
    assert catalog.shown_uri("b", "ui://widget/7") == "ui://b/widget/7"
    assert catalog.resource_target("file:///notes") == ("b", "file:///notes")


def test_other_uri_clashes_are_reported_and_never_rewritten():
    catalog = build_catalog({"a": backend("a", resources=["file:///config.json"]),
                             "b": backend("b", resources=["file:///config.json"])}, {}, AggregationConfig())
    assert [r["uri"] for r in catalog.resources] == ["file:///config.json"]
    assert [(c.kind, c.name, c.backends) for c in catalog.clashes] == [
        ("resource URI", "file:///config.json", ("a", "b"))]


def test_a_rewritten_form_that_is_a_real_uri_is_not_made_twice():
    catalog = build_catalog({"a": backend("a", resources=[SHARED_UI, "ui://b/get-time/mcp-app.html"]),
                             "b": backend("b", resources=[SHARED_UI])}, {}, AggregationConfig())
    assert catalog.resource_target("ui://b/get-time/mcp-app.html") == ("a", "ui://b/get-time/mcp-app.html")
    assert any(c.kind == "ui URI" and "not rewritten" in c.outcome for c in catalog.clashes)


# -- own names -----------------------------------------------------------------------------


def test_an_own_name_one_backend_has_means_its_tool():
    catalog = two_apps()
    assert catalog.own_names["poll-system-stats"] == (OwnName("monitor_poll-system-stats", "monitor", None),)
    assert chosen_meaning(catalog.own_names["poll-system-stats"]).advertised == "monitor_poll-system-stats"


def test_an_own_name_two_backends_share_is_ambiguous_unless_priority_order_ranks_one_first():
    plain = two_apps()
    assert chosen_meaning(plain.own_names["get-time"]) is None
    clash = next(c for c in plain.clashes if c.kind == "tool name")
    assert clash.backends == ("react", "vanilla") and "refused as ambiguous" in clash.outcome
    ranked = two_apps(priority_order=("vanilla",))
    assert chosen_meaning(ranked.own_names["get-time"]).advertised == "vanilla_get-time"
    assert "goes to vanilla_get-time" in next(c for c in ranked.clashes if c.kind == "tool name").outcome


def test_under_priority_the_shared_name_is_advertised_and_means_the_first_listed_backends_tool():
    catalog = two_apps(conflict_resolution="priority", priority_order=("react", "vanilla", "monitor"))
    assert catalog.tool_routes["get-time"].backend == "react"
    assert "get-time" not in catalog.own_names  # advertised names are never taken as own names
    assert any(c.kind == "tool name" and c.name == "get-time" and "advertised name" in c.outcome
               for c in catalog.clashes)


def test_an_own_name_that_is_another_tools_advertised_name_means_the_advertised_tool():
    catalog = build_catalog({"a": backend("a", [app_tool("b_x")]), "b": backend("b", [app_tool("x")])}, {},
                            AggregationConfig())
    assert catalog.tool_routes["b_x"].backend == "b"
    assert "b_x" not in catalog.own_names
    assert [(c.name, c.backends) for c in catalog.clashes] == [("b_x", ("a", "b"))]


def test_under_manual_a_renamed_tools_own_name_means_the_tool_that_kept_it():
    from vmcp_actors.config import ToolOverride, WorkloadToolsConfig

    catalog = two_apps(conflict_resolution="manual", tools=(
        WorkloadToolsConfig("react", overrides=MappingProxyType({"get-time": ToolOverride(name="react_time")})),))
    assert not catalog.errors
    assert catalog.tool_routes["get-time"].backend == "vanilla"
    assert catalog.tool_routes["react_time"].backend == "react"
    assert "get-time" not in catalog.own_names  # vanilla advertises it: react's app reaches vanilla's
    assert any(c.name == "get-time" and c.backends == ("react", "vanilla") for c in catalog.clashes)


# -- the dispatcher's resolution -----------------------------------------------------------


class Visible:
    """The outermost layer's lookups: names a caller can call."""

    def __init__(self, callable_names):
        self.callable = set(callable_names)

    def __getattr__(self, method):  # the dispatcher's other methods are not used here
        return lambda *args: ()

    def lookup_tool(self, identity, name, deadline):
        return object() if name in self.callable else None


def dispatcher(catalog, callable_names):
    return McpDispatcher(Visible(callable_names), page_size=10,
                         own_names=lambda identity, name, deadline: catalog.own_names.get(name, ()))


def test_a_call_by_an_own_name_becomes_a_call_of_the_advertised_tool():
    resolve = dispatcher(two_apps(), {"monitor_poll-system-stats"}).tool_called
    assert resolve(None, "poll-system-stats", Deadline.after(5)) == "monitor_poll-system-stats"
    assert resolve(None, "monitor_poll-system-stats", Deadline.after(5)) == "monitor_poll-system-stats"
    assert resolve(None, "no-such-tool", Deadline.after(5)) == "no-such-tool"


def test_an_ambiguous_own_name_is_refused_naming_only_the_tools_the_caller_can_call():
    resolve = dispatcher(two_apps(), {"vanilla_get-time", "react_get-time"}).tool_called
    with pytest.raises(AmbiguousToolName) as refused:
        resolve(None, "get-time", Deadline.after(5))
    assert refused.value.code == INVALID_PARAMS
    assert refused.value.data == {"tools": ["react_get-time", "vanilla_get-time"]}


def test_a_tool_the_caller_cannot_call_is_never_a_meaning_nor_named():
    only_react = dispatcher(two_apps(), {"react_get-time"}).tool_called
    assert only_react(None, "get-time", Deadline.after(5)) == "react_get-time"
    neither = dispatcher(two_apps(), set()).tool_called
    assert neither(None, "get-time", Deadline.after(5)) == "get-time"  # then unknown, as any hidden tool


def test_a_name_the_outermost_layer_offers_itself_is_never_resolved():
    # a composite tool named like a backend tool's own name: the composite is what the name means
    resolve = dispatcher(two_apps(), {"poll-system-stats", "monitor_poll-system-stats"}).tool_called
    assert resolve(None, "poll-system-stats", Deadline.after(5)) == "poll-system-stats"


def test_an_update_of_a_shared_ui_uri_reaches_clients_under_the_uri_they_read():
    from vmcp_actors.core._exchange import Notification, from_backend

    catalog = two_apps()
    update = {"jsonrpc": "2.0", "method": "notifications/resources/updated", "params": {"uri": SHARED_UI}}
    assert catalog.shown_update("react", update)["params"]["uri"] == "ui://react/get-time/mcp-app.html"
    assert catalog.shown_update("monitor", update) is update  # not one of monitor's shared URIs

    def call():  # a backend's call that streams an update before its answer
        yield update
        return {"contents": []}

    events = list(from_backend(call(), "vanilla", lambda message: catalog.shown_update("vanilla", message)))
    assert events == [Notification({**update, "params": {"uri": "ui://vanilla/get-time/mcp-app.html"}}, "vanilla")]
