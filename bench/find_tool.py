"""find_tool: how fast and how well the optimizer finds a tool in a 1,000-tool catalog.

A deterministic catalog of 1,000 tools (40 services x 5 kinds of object x 5 verbs, each
with a written description and parameters) sits below the optimizer, over an in-memory
core (no backend, no HTTP: what is measured is the search). 36 written queries, each with
the one tool it means, are asked through ``find_tool`` as a client would (description
and keywords); the hit rate is how often that tool is among the first 3 (and first 1).
Latency: every query asked ``--rounds`` times after a warm-up, p50 and p99 per call; the
index build once. ``--with-authz`` puts Cedar (a permit-by-group policy) below the
optimizer, as in production: find_tool then searches only what the caller may call.
``--through-gateway`` serves the catalog from an official-SDK backend and asks find_tool
through the gateway (gunicorn, ``optimizer:`` in its config) over HTTP, as a client would.

    .venv/bin/python -m bench.find_tool [--rounds 20] [--with-authz | --through-gateway]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

from vmcp_actors.concurrency import Deadline
from vmcp_actors.config import AuthzConfig
from vmcp_actors.core import Route, answered
from vmcp_actors.decorators import CedarAuthz, CedarPolicies, ToolOptimizer
from vmcp_actors.identity import Identity

TARGET_P50_MS = 20.0
TOP = 3

# service -> (what it is, five kinds of object it manages)
SERVICES: dict[str, tuple[str, tuple[str, ...]]] = {
    "github": ("GitHub code hosting", ("issue", "pull request", "branch", "release", "repository")),
    "gitlab": ("GitLab code hosting", ("merge request", "pipeline", "project", "tag", "snippet")),
    "jira": ("Jira issue tracker", ("ticket", "sprint", "epic", "board", "worklog")),
    "linear": ("Linear project tracker", ("cycle", "roadmap", "label", "team", "milestone")),
    "slack": ("Slack team chat", ("message", "channel", "reaction", "reminder", "user group")),
    "teams": ("Microsoft Teams chat", ("chat", "meeting", "team channel", "tab", "presence status")),
    "gmail": ("Gmail email", ("email", "draft", "mail label", "mail filter", "attachment")),
    "gcal": ("Google Calendar", ("event", "calendar", "invitation", "availability slot", "recurring series")),
    "gdrive": ("Google Drive file storage", ("file", "folder", "sharing permission", "file revision",
                                             "shared drive")),
    "notion": ("Notion workspace", ("page", "database", "block", "workspace member", "page comment")),
    "confluence": ("Confluence wiki", ("wiki page", "space", "page attachment", "page label", "blog post")),
    "salesforce": ("Salesforce CRM", ("lead", "opportunity", "account", "contact", "sales report")),
    "hubspot": ("HubSpot marketing CRM", ("deal", "company", "marketing email", "landing page", "form")),
    "zendesk": ("Zendesk customer support", ("support ticket", "macro", "help center article",
                                             "customer satisfaction rating", "agent")),
    "stripe": ("Stripe payments", ("payment intent", "customer", "subscription", "invoice", "refund")),
    "shopify": ("Shopify online store", ("product", "order", "inventory level", "discount code", "collection")),
    "aws_s3": ("Amazon S3 object storage", ("bucket", "object", "bucket policy", "lifecycle rule",
                                            "presigned url")),
    "aws_ec2": ("Amazon EC2 virtual machines", ("instance", "security group", "volume", "snapshot", "key pair")),
    "kubernetes": ("Kubernetes cluster", ("pod", "deployment", "service", "config map", "namespace")),
    "docker": ("Docker containers", ("container", "image", "network", "volume mount", "compose stack")),
    "terraform": ("Terraform infrastructure as code", ("workspace", "plan", "state", "variable", "run")),
    "datadog": ("Datadog monitoring", ("monitor", "dashboard", "metric", "incident", "log query")),
    "pagerduty": ("PagerDuty on-call alerting", ("alert", "on-call schedule", "escalation policy",
                                                 "maintenance window", "responder")),
    "sentry": ("Sentry error tracking", ("error issue", "stack trace event", "release health", "alert rule",
                                         "project key")),
    "postgres": ("PostgreSQL database", ("table", "row", "index", "database role", "query plan")),
    "mongodb": ("MongoDB document database", ("collection", "document", "aggregation pipeline",
                                              "database index", "replica set")),
    "redis": ("Redis key-value cache", ("key", "stream", "sorted set", "pub sub channel", "cache entry")),
    "snowflake": ("Snowflake data warehouse", ("warehouse", "schema", "stage", "data share", "task")),
    "bigquery": ("Google BigQuery analytics", ("dataset", "analytics table", "saved query", "scheduled query",
                                               "job")),
    "figma": ("Figma design", ("design file", "frame", "component", "design comment", "style")),
    "trello": ("Trello kanban boards", ("card", "list", "checklist", "kanban board", "card attachment")),
    "asana": ("Asana work management", ("task", "project section", "portfolio", "goal", "task dependency")),
    "zoom": ("Zoom video meetings", ("video meeting", "webinar", "recording", "meeting participant",
                                     "breakout room")),
    "twilio": ("Twilio messaging and voice", ("sms message", "phone call", "phone number", "verification",
                                               "conversation")),
    "openweather": ("OpenWeather weather data", ("forecast", "current weather", "air quality reading",
                                                 "weather alert", "historical weather")),
    "maps": ("Google Maps", ("route", "place", "geocode", "distance matrix", "travel time")),
    "spotify": ("Spotify music", ("playlist", "track", "album", "playback", "followed artist")),
    "calendly": ("Calendly scheduling", ("booking", "event type", "scheduling link", "invitee", "routing form")),
    "okta": ("Okta identity", ("okta user", "okta group", "application assignment", "mfa factor",
                               "sign-in policy")),
    "vault": ("HashiCorp Vault secrets", ("secret", "secret engine", "access policy", "auth token", "lease")),
}
assert len(SERVICES) == 40 and all(len(objects) == 5 for _, objects in SERVICES.values())

VERBS: dict[str, tuple[str, str]] = {
    "create": ("Create a new {object} in {what}.", "Fields of the new {object}."),
    "get": ("Get one {object} from {what} by its id, with all of its details.", "The {object}'s id."),
    "list": ("List the {object}s in {what}, newest first, with optional filters.", "Filters and paging."),
    "update": ("Update an existing {object} in {what}: change its fields.", "The {object}'s id and new fields."),
    "delete": ("Delete a {object} from {what} permanently.", "The {object}'s id."),
}
PARAMETERS = {"create": ("name", "body"), "get": ("id",), "list": ("filter", "limit", "cursor"),
              "update": ("id", "fields"), "delete": ("id", "confirm")}


def snake(text: str) -> str:
    return text.replace(" ", "_").replace("-", "_")


def catalog() -> list[dict[str, Any]]:
    tools = []
    for service, (what, objects) in SERVICES.items():
        for obj in objects:
            for verb, (description, parameters) in VERBS.items():
                name = f"{service}_{verb}_{snake(obj)}{'s' if verb == 'list' else ''}"
                properties = {p: {"type": "string", "description": parameters.format(object=obj)}
                              for p in PARAMETERS[verb]}
                tools.append({"name": name, "description": description.format(object=obj, what=what),
                              "inputSchema": {"type": "object", "properties": properties},
                              "annotations": {"readOnlyHint": verb in ("get", "list")}})
    assert len(tools) == 1000
    return tools


# (what a client asks, keywords or "", the tool it means): written as a person would ask.
QUERIES: tuple[tuple[str, str, str], ...] = (
    ("open a new issue on GitHub about a crash", "github issue", "github_create_issue"),
    ("show me the open pull requests of our GitHub repository", "", "github_list_pull_requests"),
    ("cut a new release of the project on github", "", "github_create_release"),
    ("which pipelines ran in GitLab", "gitlab", "gitlab_list_pipelines"),
    ("file a Jira ticket for the login bug", "jira ticket", "jira_create_ticket"),
    ("what is in the current sprint", "jira", "jira_get_sprint"),
    ("post a message in the team chat channel", "slack", "slack_create_message"),
    ("remind me in Slack tomorrow", "reminder", "slack_create_reminder"),
    ("send an email to the customer", "gmail", "gmail_create_email"),
    ("delete the draft I wrote yesterday", "gmail draft", "gmail_delete_draft"),
    ("schedule a meeting event in my Google Calendar", "calendar event", "gcal_create_event"),
    ("cancel the calendar event on Friday", "gcal event", "gcal_delete_event"),
    ("share a file from Google Drive with a colleague", "sharing permission", "gdrive_create_sharing_permission"),
    ("find the pages of our Notion workspace", "notion pages", "notion_list_pages"),
    ("edit the wiki page about onboarding", "confluence", "confluence_update_wiki_page"),
    ("add a sales lead to the CRM", "salesforce lead", "salesforce_create_lead"),
    ("which opportunities are in the pipeline", "salesforce", "salesforce_list_opportunitys"),
    ("refund the customer's last payment", "stripe refund", "stripe_create_refund"),
    ("cancel a customer's subscription", "stripe", "stripe_delete_subscription"),
    ("list the orders of the online store", "shopify", "shopify_list_orders"),
    ("create a discount code for the shop", "", "shopify_create_discount_code"),
    ("upload an object to an S3 bucket", "s3", "aws_s3_create_object"),
    ("start a new virtual machine instance on EC2", "ec2 instance", "aws_ec2_create_instance"),
    ("restart the kubernetes deployment", "deployment", "kubernetes_update_deployment"),
    ("which pods are running in the cluster", "kubernetes pods", "kubernetes_list_pods"),
    ("remove a stopped docker container", "docker container", "docker_delete_container"),
    ("show the terraform plan", "terraform", "terraform_get_plan"),
    ("create a Datadog monitor for high CPU", "monitor", "datadog_create_monitor"),
    ("who is on call this week", "pagerduty schedule", "pagerduty_get_on_call_schedule"),
    ("look at the stack trace of the latest error", "sentry", "sentry_get_stack_trace_event"),
    ("insert a row into the postgres table", "postgres row", "postgres_create_row"),
    ("what will the weather be in Paris tomorrow", "forecast", "openweather_get_forecast"),
    ("how long does it take to drive to the airport", "travel time", "maps_get_travel_time"),
    ("add a song to my playlist", "spotify playlist", "spotify_update_playlist"),
    ("send an SMS text message to a phone", "twilio sms", "twilio_create_sms_message"),
    ("read a secret from Vault", "vault secret", "vault_get_secret"),
)


class CatalogCore:
    """The capability interface over a fixed tool list (no backend): what find_tool searches."""

    def __init__(self, tools: list[dict[str, Any]]):
        self.tools = tuple(tools)
        self.names = {tool["name"] for tool in tools}

    def list_tools(self, identity, deadline):
        return self.tools

    def lookup_tool(self, identity, name, deadline):
        return Route("catalog", name, name) if name in self.names else None

    def call_tool(self, identity, name, arguments, meta, deadline):
        return answered({"content": []})

    def explain_tool(self, identity, name, deadline):  # pragma: no cover - not measured
        raise NotImplementedError

    def close(self):
        pass


def find(optimizer: ToolOptimizer, identity: Identity, description: str, keywords: str) -> list[str]:
    exchange = optimizer.call_tool(identity, "find_tool", {"tool_description": description,
                                                           "tool_keywords": keywords}, None, Deadline.after(5))
    try:
        next(exchange)
    except StopIteration as done:
        return [tool["name"] for tool in done.value["structuredContent"]["tools"]]
    raise AssertionError("find_tool streamed")


def catalog_backend(tools: list[dict[str, Any]]) -> Any:
    """An official-SDK server offering ``tools`` (each answers its own name), served on loopback."""
    from mcp.server.mcpserver import MCPServer

    from vmcp_actors.demo._serve import serve_asgi_in_thread

    server = MCPServer("catalog", log_level="WARNING")
    for definition in tools:
        def answer(id: str = "", name: str = definition["name"]) -> str:  # noqa: A002 - the tools' parameter
            return name
        server.add_tool(answer, name=definition["name"], description=definition["description"])
    return serve_asgi_in_thread(server.streamable_http_app(), name="catalog")


def through_gateway(tools: list[dict[str, Any]]) -> Any:
    """A find(description, keywords) -> names over HTTP through a gunicorn gateway; its closer."""
    import contextlib

    from bench._common import gateway

    stack = contextlib.ExitStack()
    served = catalog_backend(tools)
    stack.callback(served.stop)
    running = stack.enter_context(gateway({"catalog": served.url + "/mcp"}, extra={"optimizer": {}}))
    client = stack.enter_context(running.client())
    client.initialize()

    def ask(description: str, keywords: str) -> list[str]:
        result = client.call_tool("find_tool", {"tool_description": description, "tool_keywords": keywords})
        return [tool["name"].removeprefix("catalog_") for tool in result["structuredContent"]["tools"]]

    return ask, stack.close


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="find_tool over 1,000 tools: latency and hit rate")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--server", default="gunicorn", help="accepted for bench.run_all; the gateway of "
                                                           "--through-gateway always runs under gunicorn")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--with-authz", action="store_true", help="Cedar below the optimizer")
    mode.add_argument("--through-gateway", action="store_true", help="over HTTP through the gateway")
    args = parser.parse_args(argv)

    tools = catalog()
    names = {tool["name"] for tool in tools}
    missing = [expected for _, _, expected in QUERIES if expected not in names]
    assert not missing, f"queries name tools the catalog lacks: {missing}"
    below: Any = CatalogCore(tools)
    if args.with_authz:
        below = CedarAuthz(below, CedarPolicies(AuthzConfig(policies=(
            'permit(principal in THVGroup::"eng", action == Action::"call_tool", resource);',))))
    optimizer = ToolOptimizer(below, 8)
    identity = Identity("https://idp.example", "alice", claims={"sub": "alice", "groups": ["eng"]})
    close = None
    if args.through_gateway:
        ask, close = through_gateway(tools)
    else:
        def ask(description: str, keywords: str) -> list[str]:
            return find(optimizer, identity, description, keywords)

    started = time.perf_counter()
    ask("warm up: build the index", "")
    first = (time.perf_counter() - started) * 1000

    hits_top1 = hits_top3 = 0
    misses = []
    for description, keywords, expected in QUERIES:
        found = ask(description, keywords)
        hits_top1 += found[:1] == [expected]
        if expected in found[:TOP]:
            hits_top3 += 1
        else:
            misses.append((description, expected, found[:TOP]))

    latencies = []
    for _ in range(args.rounds):
        for description, keywords, _ in QUERIES:
            started = time.perf_counter()
            ask(description, keywords)
            latencies.append((time.perf_counter() - started) * 1000)
    latencies.sort()
    p50 = statistics.median(latencies)
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]

    if close is not None:
        close()
    where = "through the gateway (HTTP, gunicorn)" if args.through_gateway else "in process"
    print(f"catalog: {len(tools)} tools; queries: {len(QUERIES)}; {where}; "
          f"authz below: {'Cedar' if args.with_authz else 'no'}")
    print(f"first find_tool (builds the index{' and the Cedar decisions' if args.with_authz else ''}): {first:.1f} ms")
    print(f"find_tool latency over {len(latencies)} calls: p50 {p50:.2f} ms, p99 {p99:.2f} ms "
          f"(target p50 < {TARGET_P50_MS:g} ms)")
    print(f"hit rate: top-3 {hits_top3}/{len(QUERIES)} ({100 * hits_top3 / len(QUERIES):.0f} %), "
          f"top-1 {hits_top1}/{len(QUERIES)} ({100 * hits_top1 / len(QUERIES):.0f} %)")
    for description, expected, found in misses:
        print(f"  miss: {description!r} -> expected {expected}, got {found}")
    ok = p50 < TARGET_P50_MS
    print("PASS" if ok else "FAIL", f"p50 {p50:.2f} ms vs target {TARGET_P50_MS:g} ms")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
