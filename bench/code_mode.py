"""Issue 39: code mode's context bytes, a 10-call task's time, and what a script costs.

The catalog: ``--backends`` official-SDK backends (``MCPServer``, default 5) of
``--tools-per-backend`` tools each (default 100: 500 tools), all served by one process of
their own (``python -m bench.code_mode --serve-catalog``). Each backend holds four
services of bench/find_tool.py's 40 (backend ``crm``: Zendesk, Salesforce, Stripe,
HubSpot; ``devtools``, ``workspace``, ``cloud``, ``data``), each service five kinds of
object and five verbs: 25 tools with a written description of two or three sentences and
typed parameters (enums, dates, bounds, arrays, each described; the SDK derives the JSON
schema as a Python server's would), answering a structured record of ~0.5 KB after
``--delays`` ms (0 and 20: a backend process per delay). The code-mode gateways
(``vmcp-actors serve``, gunicorn, one worker) have ``codeMode: {enabled: true}`` and one
``workerIsolation`` each of ``--isolations`` (``bubblewrap``, the default, and ``none``).

1. **context**: the bytes a client reads to be able to make a task's calls. Default
   config: every page of tools/list (the gateway pages at 100). Code mode (listing
   ``scripts``): its tools/list, one ``search_tools`` answer for the task in plain words,
   one ``get_tool_schema`` answer for the three tools the task needs. HTTP body bytes, the
   JSON a model is given (the tools array; a tool result's text), and tokens estimated as
   bytes / 4 (a rough rule, not a tokenizer).
2. **task**: a 10-call data-gathering task (4 support tickets, 3 CRM accounts, 3 invoices
   by id: three tools of one backend), the modes interleaved (order reversed every other
   round), ``--rounds`` rounds per backend delay: ``client``: 10 tools/call requests one
   after the other, as a model makes them (no model time between them counted); per
   isolation, ``script, sequential``: one execute_tool_script whose script awaits the same
   10 calls one by one, and ``script, gather``: the same with ``asyncio.gather``
   (parallelMaxConcurrency 8). p50/p95, ratios to ``client``, the gateway's CPU per task
   (its worker, and its sandbox processes), bytes read. Every mode must gather the same
   records.
3. **cost**: scripts of N sequential calls (N of ``--inner-calls``, default 1, 10, 50) and
   the script ``1`` per isolation, against N client tools/calls and N calls straight to
   the backend (no gateway), 0 ms tool, interleaved, ``--cost-rounds`` rounds: the added
   time per inner call is the slope of the script's p50 over N; a script's start is ``1``
   (and the slope's intercept). Gateway CPU in blocks of 100 runs back to back (/proc
   counts 10 ms ticks): the gunicorn worker's utime + stime, and its sandbox's (reaped
   children's cutime + cstime, live descendants' own); the new sandbox pids under the
   worker after each run. Cold start: the first script of ``--cold-gateways`` fresh
   gateways per isolation (one backend, the user's catalog warmed by a client call first)
   against their second and third; and in this process, ``ScriptRun`` of ``1`` on a new
   ``Sandbox`` against one on a started sandbox (``--cold-inprocess`` pairs).

A script that answers isError is counted (a target: none), not timed.

    .venv/bin/python -m bench.code_mode [--part context,task,cost] [--backends 5] [--tools-per-backend 100]
                                        [--rounds 20] [--delays 0,20] [--isolations bubblewrap,none]
                                        [--cost-rounds 12] [--inner-calls 1,10,50] [--cold-gateways 4]
                                        [--cold-inprocess 20]
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import inspect
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from bench._common import (
    GATEWAY_TREE_ENV,
    ROOT,
    Check,
    McpClient,
    RunningGateway,
    _die_with_parent,
    _stop_process,
    gateway,
    median,
    parse_args,
    percentile,
    print_header,
    record,
    run_benchmark,
    table,
)

PARTS = ("context", "task", "cost")
TOOLS_PER_SERVICE = 25  # 5 objects x 5 verbs
# Backends by domain, four services each; find_tool's other services fill any further backends.
GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("crm", ("zendesk", "salesforce", "stripe", "hubspot")),
    ("devtools", ("github", "gitlab", "jira", "sentry")),
    ("workspace", ("slack", "gmail", "gcal", "notion")),
    ("cloud", ("aws_s3", "aws_ec2", "kubernetes", "datadog")),
    ("data", ("postgres", "snowflake", "bigquery", "redis")),
)
ISOLATIONS = ("bubblewrap", "none")  # codeMode.workerIsolation: the default first
WARMUP_ROUNDS = 2
TOKEN_BYTES = 4  # the rough rule: a token is ~4 bytes of English or JSON

# The task: support escalation review. What it needs, how a model would ask for it, its calls.
TASK_TOOLS = ("crm_zendesk_get_support_ticket", "crm_salesforce_get_account", "crm_stripe_get_invoice")
TASK_QUERY = "get a support ticket, the customer's CRM account and their invoice by id"
TASK_CALLS: tuple[tuple[str, dict[str, Any]], ...] = tuple(
    (TASK_TOOLS[i % 3], {"id": f"{('tkt', 'acc', 'inv')[i % 3]}_{4100 + i}"}) for i in range(10))
SCRIPT_SEQUENTIAL = """out = []
for call in data["calls"]:
    out.append(await call_tool(call["name"], call["arguments"]))
{"results": out}"""
SCRIPT_GATHER = """import asyncio
out = await asyncio.gather(*[call_tool(call["name"], call["arguments"]) for call in data["calls"]])
{"results": list(out)}"""
SCRIPT_TRIVIAL = "1"
# The same 10 calls, returning only what the review needs (code mode's point: the records stay in the gateway).
SCRIPT_SUMMARY = """out = []
for call in data["calls"]:
    out.append(await call_tool(call["name"], call["arguments"]))
tickets = [r for r in out if r["type"] == "support ticket"]
{"open_tickets": [t["id"] for t in tickets if t["status"] != "closed"],
 "owners": sorted({r["owner"]["email"] for r in out}),
 "invoiced_eur": round(sum(r["amount"]["value"] for r in out if r["type"] == "invoice"), 2)}"""

# Targets: this bench's own (issue 39 names what to measure, not numbers).
TARGET_CONTEXT_RATIO = 10.0  # code mode's bytes at least 10x fewer than the full list of 500 tools
TARGET_GATHER_FASTER = 1.0  # with 20 ms tools, gather beats 10 client round trips
TARGET_WARM_START_MS = 20.0  # a trivial script, warm, through the gateway, p50
TARGET_SPAWNS_PER_SCRIPT = 0.05  # a warm pool reuses its workers (a worker started per script is a bug)


def code_mode(isolation: str = ISOLATIONS[0]) -> dict[str, Any]:
    """A code-mode gateway's config section (default settings but the workers' isolation)."""
    return {"codeMode": {"enabled": True, "workerIsolation": isolation}}


def served(backends: Mapping[str, str], extra: Mapping[str, Any] | None = None) -> Any:
    """A gunicorn gateway over ``backends`` served from this checkout (or
    $VMCP_BENCH_GATEWAY_TREE), checked from its log: not whatever the venv's editable
    install points at (docs/benchmarks.md, harness notes)."""
    return gateway(backends, extra=extra, tree=os.environ.get(GATEWAY_TREE_ENV) or ROOT)


# ----------------------------------------------------------------------------------------
# The catalog: generated SDK backends
# ----------------------------------------------------------------------------------------


def services_of(backends: int, tools_each: int) -> list[tuple[str, list[str]]]:
    """(backend name, its services) for each backend."""
    from bench.find_tool import SERVICES

    grouped = [service for _, services in GROUPS for service in services]
    rest = [service for service in SERVICES if service not in grouped]
    per_backend = -(-tools_each // TOOLS_PER_SERVICE)
    if backends * per_backend > len(SERVICES):
        raise SystemExit(f"at most {len(SERVICES) * TOOLS_PER_SERVICE} tools: {len(SERVICES)} services of "
                         f"{TOOLS_PER_SERVICE} tools")
    layout = []
    for index in range(backends):
        name, services = GROUPS[index] if index < len(GROUPS) else (f"more{index}", ())
        chosen = list(services[:per_backend])
        while len(chosen) < per_backend:
            chosen.append(rest.pop(0))
        layout.append((name, chosen))
    return layout


STATUS = Literal["open", "pending", "in_progress", "resolved", "closed"]
PRIORITY = Literal["low", "normal", "high", "urgent"]
RELATED = Literal["comments", "history", "attachments", "links"]


def _parameter(name: str, annotation: Any, description: str, default: Any = inspect.Parameter.empty,
               **constraints: Any) -> inspect.Parameter:
    from pydantic import Field

    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default,
                             annotation=Annotated[annotation, Field(description=description, **constraints)])


def tool_parameters(verb: str, obj: str, service: str) -> list[inspect.Parameter]:
    """Typed, described parameters, as a real server's tool has them."""
    prefix = service[:3]
    the_id = _parameter("id", str, f"The {obj}'s id, as list or create returned it (e.g. \"{prefix}_8f3k2\").",
                        min_length=1, max_length=64)
    owner = _parameter("owner_email", str | None, f"Email of the person who owns the {obj}.", None)
    if verb == "create":
        return [_parameter("name", str, f"A short, human-readable name for the new {obj}.", max_length=200),
                _parameter("description", str | None, f"A longer description of the {obj}; Markdown is accepted.",
                           None),
                owner,
                _parameter("labels", list[str] | None, "Labels to attach, e.g. [\"urgent\", \"billing\"].", None),
                _parameter("priority", PRIORITY, f"How urgent the {obj} is.", "normal"),
                _parameter("due_date", datetime.date | None, "When it is due (YYYY-MM-DD).", None),
                _parameter("dry_run", bool, "Validate the request without creating anything.", False)]
    if verb == "get":
        return [the_id,
                _parameter("include", list[RELATED] | None, "Related records to embed in the answer.", None),
                _parameter("fields", list[str] | None, "Only these fields of the record (default: all).", None)]
    if verb == "list":
        return [_parameter("query", str | None, f"Full-text search over the {obj}s' names and descriptions.",
                           None),
                _parameter("status", STATUS | None, "Only those in this state.", None),
                owner,
                _parameter("created_after", datetime.datetime | None,
                           "Only those created after this time (ISO 8601, with a time zone).", None),
                _parameter("sort", Literal["created_at", "updated_at", "name", "priority"], "The sort key.",
                           "updated_at"),
                _parameter("order", Literal["asc", "desc"], "Ascending or descending.", "desc"),
                _parameter("limit", int, "How many per page.", 20, ge=1, le=100),
                _parameter("cursor", str | None, "The previous page's nextCursor, for the next page.", None)]
    if verb == "update":
        return [the_id,
                _parameter("fields", dict[str, Any], "The fields to change and their new values; the others keep "
                                                     "theirs."),
                _parameter("if_match", str | None, "The version (etag) the change applies to: the update fails "
                                                   "if the record changed since.", None),
                _parameter("notify", bool, "Notify the record's watchers of the change.", True)]
    return [the_id,
            _parameter("confirm", bool, f"Must be true: deleting a {obj} cannot be undone."),
            _parameter("reason", str | None, "Why, for the audit log.", None)]


DESCRIPTIONS = {
    "create": ("Create a new {obj} in {what}. Returns the created {obj} with its id, URL and timestamps. "
               "Needs write access; list first to avoid duplicates."),
    "get": ("Get one {obj} from {what} by its id, with all of its fields. Use include to embed its comments, "
            "history or attachments in the same answer."),
    "list": ("List the {obj}s in {what}, most recently updated first, filtered by text, status, owner and "
             "creation time. Results are paged: pass the answer's nextCursor as cursor for the next page."),
    "update": ("Update an existing {obj} in {what}: change the given fields and keep the others. Pass if_match "
               "to fail rather than overwrite a concurrent change."),
    "delete": ("Delete a {obj} from {what} permanently. Requires confirm: true; the deletion is recorded in "
               "the audit log with the reason given."),
}
VERBS = tuple(DESCRIPTIONS)
PEOPLE = ("Ana Souza", "Ben Okafor", "Chloe Martin", "Dev Patel", "Eva Novak", "Farid Haddad")


def record_of(service: str, obj: str, record_id: str) -> dict[str, Any]:
    """A plausible record (~0.5 KB), the same for the same id."""
    seed = int(hashlib.sha256(f"{service}/{obj}/{record_id}".encode()).hexdigest()[:8], 16)
    person = PEOPLE[seed % len(PEOPLE)]
    created = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc) + datetime.timedelta(minutes=seed % 400000)
    return {
        "id": record_id, "type": obj, "name": f"{obj.capitalize()} {record_id}",
        "status": ("open", "pending", "in_progress", "resolved", "closed")[seed % 5],
        "priority": ("low", "normal", "high", "urgent")[seed % 4],
        "owner": {"name": person, "email": person.lower().replace(" ", ".") + "@example.com"},
        "created_at": created.isoformat(), "updated_at": (created + datetime.timedelta(hours=seed % 97)).isoformat(),
        "labels": [("billing", "enterprise", "renewal", "escalated", "eu", "vip")[(seed >> k) % 6] for k in (3, 7)],
        "amount": {"value": round((seed % 250000) / 100, 2), "currency": "EUR"},
        "url": f"https://{service.replace('_', '-')}.example.com/{obj.replace(' ', '-')}s/{record_id}",
        "summary": f"{person} reported this {obj} on {created:%d %b}; {seed % 9} updates since, last by the "
                   f"{('support', 'sales', 'billing')[seed % 3]} team.",
    }


def answer_of(service: str, verb: str, obj: str, arguments: dict[str, Any]) -> dict[str, Any]:
    record_id = str(arguments.get("id") or f"{service[:3]}_{len(str(arguments)):05d}")
    if verb == "list":
        return {"items": [record_of(service, obj, f"{service[:3]}_{k}") for k in range(3)], "nextCursor": "c2"}
    if verb == "delete":
        return {"deleted": True, "id": record_id}
    return record_of(service, obj, record_id)


def build_backend(name: str, services: Sequence[str], tools_each: int, delay: float) -> Any:
    """An official-SDK server with ``tools_each`` generated tools of ``services``."""
    import anyio
    from mcp.server.mcpserver import MCPServer
    from mcp.types import ToolAnnotations

    from bench.find_tool import SERVICES, snake

    server = MCPServer(name, log_level="WARNING")
    added = 0
    for service in services:
        what, objects = SERVICES[service]
        for obj in objects:
            for verb in VERBS:
                if added == tools_each:
                    return server

                async def handler(_service: str = service, _verb: str = verb, _obj: str = obj,
                                  **arguments: Any) -> dict[str, Any]:
                    if delay:
                        await anyio.sleep(delay)
                    return answer_of(_service, _verb, _obj, arguments)

                tool = f"{service}_{verb}_{snake(obj)}{'s' if verb == 'list' else ''}"
                handler.__name__ = tool  # the schemas' titles: {tool}Arguments, {tool}DictOutput
                handler.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
                    tool_parameters(verb, obj, service), return_annotation=dict[str, Any])
                server.add_tool(handler, name=tool, description=DESCRIPTIONS[verb].format(obj=obj, what=what),
                                annotations=ToolAnnotations(readOnlyHint=verb in ("get", "list"),
                                                            destructiveHint=verb == "delete"))
                added += 1
    return server


def serve_catalog(argv: Sequence[str]) -> None:
    """In the backends' own process: serve them, print {name: MCP URL} as one JSON line,
    serve until stdin closes."""
    from vmcp_actors.demo._serve import serve_asgi_in_thread

    delay_ms, backends, tools_each = float(argv[0]), int(argv[1]), int(argv[2])
    served = {}
    for name, services in services_of(backends, tools_each):
        app = build_backend(name, services, tools_each, delay_ms / 1000).streamable_http_app()
        served[name] = serve_asgi_in_thread(app, name=name)
    print(json.dumps({name: s.url + "/mcp" for name, s in served.items()}), flush=True)
    try:
        sys.stdin.read()
    finally:
        for s in served.values():
            s.stop()


@dataclass(frozen=True)
class CatalogProcess:
    urls: dict[str, str]
    pid: int
    delay_ms: float


@contextlib.contextmanager
def catalog_processes(delays: Sequence[float], backends: int, tools_each: int) -> Iterator[dict[float, CatalogProcess]]:
    """A catalog process per delay (ms), started together (each builds its tools for a few seconds)."""
    procs = {}
    try:
        for delay in delays:
            procs[delay] = subprocess.Popen(
                [sys.executable, "-m", "bench.code_mode", "--serve-catalog", f"{delay:g}", str(backends),
                 str(tools_each)], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                preexec_fn=_die_with_parent)
        served = {}
        for delay, proc in procs.items():
            line = proc.stdout.readline().strip()
            if not line.startswith("{"):
                raise RuntimeError(f"the catalog backends' process ({delay:g} ms) did not start")
            served[delay] = CatalogProcess(json.loads(line), proc.pid, delay)
        yield served
    finally:
        for proc in procs.values():
            with contextlib.suppress(OSError):
                proc.stdin.close()
            _stop_process(proc)


# ----------------------------------------------------------------------------------------
# Measuring
# ----------------------------------------------------------------------------------------


def children_of(pid: int) -> list[int]:
    """A process's children (every thread's), from /proc."""
    found = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                found += [int(child) for child in (task / "children").read_text().split()]
    return found


def descendants_of(pid: int) -> list[int]:
    found, todo = [], children_of(pid)
    while todo:
        child = todo.pop()
        found.append(child)
        todo += children_of(child)
    return found


def cpu_fields(pid: int) -> tuple[float, float]:
    """(utime + stime, cutime + cstime) of a process in seconds: its own CPU and its reaped
    children's (a zombie's own is still readable until it is reaped)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / tick, (int(fields[13]) + int(fields[14])) / tick


class GatewayCpu:
    """CPU seconds the gateway has used: (its gunicorn worker's own, its sandbox's). The
    sandbox's: the worker's reaped children (cutime + cstime) and every live descendant's
    own and reaped children's (bwrap, monty). /proc counts in clock ticks (10 ms): a run's
    figure is the sum over many runs' differences, divided by the runs."""

    def __init__(self, gw: RunningGateway):
        if gw.pid is None:
            raise RuntimeError("the gateway's gunicorn worker was not found")
        self.pid = gw.pid

    def read(self) -> tuple[float, float]:
        own, reaped = cpu_fields(self.pid)
        sandbox = reaped
        for pid in descendants_of(self.pid):
            with contextlib.suppress(OSError, IndexError):
                sandbox += sum(cpu_fields(pid))
        return own, sandbox


class ScriptFailed(Exception):
    """A script answered isError where it should have answered a result (counted, not timed)."""


@dataclass
class Samples:
    """One mode's wall times, the gateway CPU it used (worker, sandbox) in seconds, and the
    runs that failed (ScriptFailed: not in the times or the CPU)."""

    wall: list[float]
    worker_cpu: float = 0.0
    sandbox_cpu: float = 0.0
    failures: list[str] = field(default_factory=list)

    def p50(self) -> float:
        return median(self.wall) * 1000

    def p95(self) -> float:
        return percentile(self.wall, 95) * 1000

    def cpu_ms(self) -> tuple[float, float]:
        """The gateway's CPU per run, worker and sandbox, in ms."""
        runs = max(1, len(self.wall))
        return self.worker_cpu / runs * 1000, self.sandbox_cpu / runs * 1000


def interleaved(modes: dict[str, Callable[[], Any]], rounds: int, cpus: Mapping[str, GatewayCpu | None],
                warmup: int = WARMUP_ROUNDS) -> dict[str, Samples]:
    """Each mode once per round, the order reversed every other round; warm-up rounds not
    counted. Each run's wall time, and the CPU its gateway (``cpus[mode]``) used meanwhile."""
    samples = {mode: Samples([]) for mode in modes}
    names = list(modes)

    for round_no in range(warmup + rounds):
        for mode in (names if round_no % 2 == 0 else names[::-1]):
            cpu = cpus.get(mode)

            def read() -> tuple[float, float]:
                return cpu.read() if cpu is not None else (0.0, 0.0)

            before = read()
            started = time.perf_counter()
            try:
                modes[mode]()
            except ScriptFailed as failed:
                samples[mode].failures.append(str(failed))
                continue
            took = time.perf_counter() - started
            after = read()
            if round_no >= warmup:
                samples[mode].wall.append(took)
                samples[mode].worker_cpu += after[0] - before[0]
                samples[mode].sandbox_cpu += after[1] - before[1]
    return samples


def body_bytes(client: McpClient, method: str, params: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
    """One request: its HTTP body's bytes and the JSON-RPC result."""
    response, answer = client.exchange(method, params)
    if response.status_code != 200 or not answer or "result" not in answer:
        raise RuntimeError(f"{method}: HTTP {response.status_code}: {response.text[:300]}")
    return len(response.content), answer["result"]


def compact(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())


def text_of(result: dict[str, Any]) -> str:
    return "".join(block.get("text", "") for block in result.get("content") or () if block.get("type") == "text")


def script(client: McpClient, text: str, data: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
    """One execute_tool_script: (HTTP body bytes, result); ScriptFailed if it answered isError."""
    arguments: dict[str, Any] = {"script": text}
    if data is not None:
        arguments["data"] = data
    size, result = body_bytes(client, "tools/call", {"name": "execute_tool_script", "arguments": arguments})
    if result.get("isError"):
        raise ScriptFailed(text_of(result)[:300])
    return size, result


def kb(n: float) -> str:
    return f"{n / 1000:,.1f} KB"


# ----------------------------------------------------------------------------------------
# 1. context
# ----------------------------------------------------------------------------------------


def context_part(backends: CatalogProcess, gw_code: RunningGateway) -> list[Check]:
    with served(backends.urls) as gw_default, gw_default.client() as plain, gw_code.client() as coded:
        plain.initialize()
        coded.initialize()
        wire_list, tools, pages, cursor = 0, [], 0, None
        while True:
            size, result = body_bytes(plain, "tools/list", {"cursor": cursor} if cursor else None)
            wire_list, pages = wire_list + size, pages + 1
            tools += result["tools"]
            cursor = result.get("nextCursor")
            if not cursor:
                break
        missing = [name for name in TASK_TOOLS if name not in {tool["name"] for tool in tools}]
        if missing:
            raise RuntimeError(f"the catalog lacks the task's tools {missing}")
        list_code_wire, listed = body_bytes(coded, "tools/list")
        search_wire, searched = body_bytes(coded, "tools/call", {"name": "search_tools",
                                                                 "arguments": {"query": TASK_QUERY}})
        found = [tool["name"] for tool in searched["structuredContent"]["tools"]]
        schema_wire, schemas = body_bytes(coded, "tools/call", {"name": "get_tool_schema",
                                                                "arguments": {"names": list(TASK_TOOLS)}})
        # The same three schemas in the default list: what they weigh there.
        task_definitions = [tool for tool in tools if tool["name"] in TASK_TOOLS]

    full_model = compact(tools)
    code_model = compact(listed["tools"]) + len(text_of(searched).encode()) + len(text_of(schemas).encode())
    code_wire = list_code_wire + search_wire + schema_wire
    per_tool = full_model / len(tools)
    rows = [
        (f"default: tools/list, {pages} pages, {len(tools)} tools", kb(wire_list), kb(full_model),
         f"~{full_model / TOKEN_BYTES:,.0f}"),
        (f"code mode: tools/list ({len(listed['tools'])} tools)", kb(list_code_wire), kb(compact(listed["tools"])),
         f"~{compact(listed['tools']) / TOKEN_BYTES:,.0f}"),
        (f"code mode: search_tools ({len(found)} tools found)", kb(search_wire), kb(len(text_of(searched).encode())),
         f"~{len(text_of(searched).encode()) / TOKEN_BYTES:,.0f}"),
        (f"code mode: get_tool_schema ({len(TASK_TOOLS)} tools)", kb(schema_wire), kb(len(text_of(schemas).encode())),
         f"~{len(text_of(schemas).encode()) / TOKEN_BYTES:,.0f}"),
        ("code mode: the three together", kb(code_wire), kb(code_model), f"~{code_model / TOKEN_BYTES:,.0f}"),
        ("default / code mode", f"{wire_list / code_wire:.1f} x", f"{full_model / code_model:.1f} x", ""),
    ]
    print(f"\n### 1. context: what a client reads before the task's calls ({len(tools)} tools, "
          f"{per_tool:,.0f} bytes per definition on average)\n")
    print(f"search_tools query: {TASK_QUERY!r}")
    print(f"found: {', '.join(found)}\n")
    print(table(["what the client reads", "HTTP bodies", "JSON for the model", "tokens (bytes / 4, rough)"], rows))
    print(f"\nthe task's 3 definitions in the default list: {compact(task_definitions):,} bytes; "
          f"get_tool_schema's answer text: {len(text_of(schemas).encode()):,} bytes")
    record("context: default tools/list bytes (HTTP)", wire_list)
    record("context: code mode bytes (HTTP)", code_wire)
    record("context: default / code mode (model JSON)", round(full_model / code_model, 2))
    found_all = all(name in found for name in TASK_TOOLS)
    return [Check("search_tools found the task's 3 tools (default limit 8)",
                  f"{sum(n in found for n in TASK_TOOLS)} of 3", "3 of 3", found_all),
            Check(f"context bytes, default / code mode ({len(tools)} tools)", f"{wire_list / code_wire:.1f} x (HTTP)",
                  f">= {TARGET_CONTEXT_RATIO:g} x", wire_list / code_wire >= TARGET_CONTEXT_RATIO)]


# ----------------------------------------------------------------------------------------
# 2. task
# ----------------------------------------------------------------------------------------


CLIENT_MODE = "client: 10 tools/calls"


def task_modes(client: McpClient, clients: dict[str, McpClient],
               answers: dict[str, int]) -> dict[str, Callable[[], Any]]:
    """The client's 10 calls and, per isolation (``clients``: its gateway's session), the
    script ways, each checked to gather the same 10 records; ``answers``: the bytes read."""
    data = {"calls": [{"name": name, "arguments": arguments} for name, arguments in TASK_CALLS]}
    expected: list[Any] = []

    def by_client() -> None:
        got, read = [], 0
        for name, arguments in TASK_CALLS:
            size, result = body_bytes(client, "tools/call", {"name": name, "arguments": arguments})
            if result.get("isError"):
                raise RuntimeError(f"{name}: {text_of(result)[:300]}")
            got.append(result["structuredContent"])
            read += size
        answers[CLIENT_MODE] = read
        if not expected:
            expected.extend(got)
        elif got != expected:
            raise RuntimeError("client: the records changed")

    def by_script(on: McpClient, text: str, mode: str) -> Callable[[], None]:
        def run() -> None:
            size, result = script(on, text, data)
            if expected and result["structuredContent"]["results"] != expected:
                raise RuntimeError(f"{mode}: not the records the client got")
            answers[mode] = size
        return run

    modes = {CLIENT_MODE: by_client}
    for isolation, on in clients.items():
        modes[f"script, sequential ({isolation})"] = by_script(on, SCRIPT_SEQUENTIAL,
                                                               f"script, sequential ({isolation})")
        modes[f"script, gather ({isolation})"] = by_script(on, SCRIPT_GATHER, f"script, gather ({isolation})")
    return modes


def failures_line(samples: dict[str, Samples]) -> str:
    failed = {mode: s.failures for mode, s in samples.items() if s.failures}
    if not failed:
        return "no script failed"
    return "; ".join(f"{mode}: {len(f)} failed ({f[0]!r})" for mode, f in failed.items())


def task_part(gateways: dict[tuple[float, str], RunningGateway], delays: Sequence[float],
              isolations: Sequence[str], rounds: int) -> tuple[list[Check], dict[str, Samples]]:
    print(f"\n### 2. task: 10 calls (4 tickets, 3 accounts, 3 invoices), {rounds} rounds per delay after "
          f"{WARMUP_ROUNDS} warm-up rounds, modes interleaved; client calls through the {isolations[0]} gateway\n")
    rows, cpu_rows, checks, everything = [], [], [], {}
    for delay in delays:
        with contextlib.ExitStack() as stack:
            client = stack.enter_context(gateways[(delay, isolations[0])].client())
            clients = {isolation: stack.enter_context(gateways[(delay, isolation)].client())
                       for isolation in isolations}
            for each in (client, *clients.values()):
                each.initialize()
            answers: dict[str, int] = {}
            modes = task_modes(client, clients, answers)
            modes[CLIENT_MODE]()  # the expected records first
            cpus = {mode: GatewayCpu(gateways[(delay, isolations[0] if mode == CLIENT_MODE else
                                                mode.rsplit("(", 1)[1].rstrip(")"))]) for mode in modes}
            samples = interleaved(modes, rounds, cpus)
        base = samples[CLIENT_MODE]
        base_cpu = sum(base.cpu_ms())
        for mode, s in samples.items():
            label = f"{delay:g} ms tools: {mode}"
            everything[label] = s
            rows.append((label, f"{s.p50():.1f} ms", f"{s.p95():.1f} ms", f"{s.p50() / base.p50():.2f}",
                         f"{s.p95() / base.p95():.2f}", f"{answers.get(mode, 0):,} B"))
            worker, sandbox = s.cpu_ms()
            cpu_rows.append((label, f"{worker:.1f} ms", f"{sandbox:.1f} ms", f"{(worker + sandbox) / base_cpu:.2f}"))
            record(f"task {delay:g} ms: {mode}: p50 ms", round(s.p50(), 2))
        gather = samples[f"script, gather ({isolations[0]})"].p50() / base.p50()
        sequential = samples[f"script, sequential ({isolations[0]})"].p50() / base.p50()
        if delay >= 10:
            checks.append(Check(f"task, {delay:g} ms tools: gather p50 / client p50 ({isolations[0]})",
                                f"{gather:.2f}", f"< {TARGET_GATHER_FASTER:g}", gather < TARGET_GATHER_FASTER))
        checks.append(Check(f"task, {delay:g} ms tools: sequential script p50 / client p50 ({isolations[0]})",
                            f"{sequential:.2f}", "<= 1", sequential <= 1))
    print(table(["mode", "p50", "p95", "p50 / client", "p95 / client", "bytes read"], rows))
    print("\ngateway CPU per task (the warm-up rounds not counted)\n")
    print(table(["mode", "gunicorn worker", "sandbox (bwrap, monty)", "total / client"], cpu_rows))
    print(f"\n{failures_line(everything)}")
    with gateways[(delays[0], isolations[0])].client() as client:
        client.initialize()
        data = {"calls": [{"name": name, "arguments": arguments} for name, arguments in TASK_CALLS]}
        size, result = script(client, SCRIPT_SUMMARY, data)
    print(f"\nthe same 10 calls in a script that returns only what the review needs (open tickets' ids, the "
          f"owners, the invoices' sum): {size:,} B read ({len(text_of(result).encode()):,} B of text): "
          f"{result['structuredContent']}")
    record("task: summary script bytes read", size)
    return checks, everything


CPU_BLOCK = 100  # runs back to back per CPU figure of part 3 (clock ticks are 10 ms)


def cpu_block(cpu: GatewayCpu, run: Callable[[], Any], runs: int) -> tuple[tuple[float, float], int]:
    """``runs`` runs back to back: the gateway's CPU per run in ms (worker, sandbox), and how
    many sandbox processes appeared under the worker (new pids seen after each run)."""
    seen = set(descendants_of(cpu.pid))
    appeared = 0
    before = cpu.read()
    for _ in range(runs):
        run()
        now = set(descendants_of(cpu.pid))
        appeared += len(now - seen)
        seen |= now
    after = cpu.read()
    return ((after[0] - before[0]) / runs * 1000, (after[1] - before[1]) / runs * 1000), appeared


def cold_gateways(url: str, count: int, isolations: Sequence[str]) -> dict[str, list[tuple[float, float, float]]]:
    """Fresh gateways over one backend, isolations alternating: (first script, second,
    third) in ms each, the user's catalog warmed by one client call first."""
    out: dict[str, list[tuple[float, float, float]]] = {isolation: [] for isolation in isolations}
    for n in range(count):
        for isolation in (isolations if n % 2 == 0 else isolations[::-1]):
            with served({"crm": url}, extra=code_mode(isolation)) as gw, gw.client() as client:
                client.initialize()
                client.call_tool(TASK_TOOLS[0], dict(TASK_CALLS[0][1]))
                if descendants_of(gw.pid):
                    raise RuntimeError("the sandbox started before the first script")
                times = []
                for _ in range(3):
                    started = time.perf_counter()
                    script(client, SCRIPT_TRIVIAL)
                    times.append((time.perf_counter() - started) * 1000)
                out[isolation].append(tuple(times))
    return out


def cold_inprocess(pairs: int, isolation: str) -> tuple[list[float], list[float], list[str]]:
    """``1`` through ``ScriptRun`` in this process: on a new Sandbox (its pool started by the
    run), and on one started before; interleaved. ms from the run's creation to its
    outcome; the failures (not timed)."""
    from vmcp_actors.codemode import Sandbox, ScriptRun
    from vmcp_actors.concurrency import Deadline
    from vmcp_actors.config import CodeModeConfig

    settings = CodeModeConfig(enabled=True, worker_isolation=isolation)
    failures: list[str] = []

    def run_on(sandbox: Sandbox, into: list[float]) -> None:
        if not sandbox.take_slot():
            raise RuntimeError("no sandbox slot")
        started = time.perf_counter()
        run = ScriptRun(sandbox, SCRIPT_TRIVIAL, None, lambda *a: None, Deadline.after(30), "bench")
        run.start()
        result = run.outcome.result(30)
        took = (time.perf_counter() - started) * 1000
        if result.get("structuredContent") != {"result": 1}:
            failures.append(text_of(result)[:200])
        else:
            into.append(took)

    warm_sandbox = Sandbox(settings)
    cold: list[float] = []
    warm: list[float] = []
    try:
        run_on(warm_sandbox, [])
        for n in range(pairs):
            fresh = Sandbox(settings)
            try:
                for target, into in ((fresh, cold), (warm_sandbox, warm))[::1 if n % 2 == 0 else -1]:
                    run_on(target, into)
            finally:
                fresh.close()
    finally:
        warm_sandbox.close()
    return cold, warm, failures


def cost_part(backends: CatalogProcess, gws: dict[str, RunningGateway], rounds: int, inner: Sequence[int],
              cold_count: int, cold_pairs: int) -> tuple[list[Check], dict[str, Samples]]:
    isolations = list(gws)
    first = isolations[0]
    checks = []
    tool, arguments = TASK_CALLS[0]
    backend_tool = tool.removeprefix("crm_")
    with contextlib.ExitStack() as stack:
        clients = {isolation: stack.enter_context(gw.client()) for isolation, gw in gws.items()}
        direct = stack.enter_context(McpClient(backends.urls["crm"]))
        for each in (*clients.values(), direct):
            each.initialize()

        def scripted(on: McpClient, n: int) -> Callable[[], None]:
            data = {"calls": [{"name": tool, "arguments": arguments}] * n}

            def run() -> None:
                _, result = script(on, SCRIPT_SEQUENTIAL, data)
                if len(result["structuredContent"]["results"]) != n:
                    raise RuntimeError(f"script of {n} calls: {result}")
            return run

        def calls(on: McpClient, name: str, n: int) -> Callable[[], None]:
            def run() -> None:
                for _ in range(n):
                    on.call_tool(name, arguments)
            return run

        modes: dict[str, Callable[[], None]] = {}
        cpus: dict[str, GatewayCpu | None] = {}
        for isolation in isolations:
            modes[f"script `1` ({isolation})"] = lambda on=clients[isolation]: script(on, SCRIPT_TRIVIAL)
            cpus[f"script `1` ({isolation})"] = GatewayCpu(gws[isolation])
        for n in inner:
            for isolation in isolations:
                modes[f"script, {n} calls ({isolation})"] = scripted(clients[isolation], n)
                cpus[f"script, {n} calls ({isolation})"] = GatewayCpu(gws[isolation])
            modes[f"client, {n} calls"] = calls(clients[first], tool, n)
            cpus[f"client, {n} calls"] = GatewayCpu(gws[first])
        direct_n = sorted(inner)[len(inner) // 2]
        modes[f"backend direct, {direct_n} calls"] = calls(direct, backend_tool, direct_n)
        cpus[f"backend direct, {direct_n} calls"] = None
        samples = interleaved(modes, rounds, cpus)

    print(f"\n### 3. cost: 0 ms tool ({tool}), {rounds} rounds after {WARMUP_ROUNDS} warm-up rounds, "
          f"modes interleaved; client calls through the {first} gateway\n")
    rows = []
    for mode, s in samples.items():
        n = 0 if "`1`" in mode else int(mode.split(", ")[1].split()[0])
        rows.append((mode, f"{s.p50():.1f} ms", f"{s.p95():.1f} ms", f"{s.p50() / n:.2f} ms" if n else ""))
    print(table(["mode", "p50", "p95", "p50 per call"], rows))

    low, high = min(inner), max(inner)

    def slope(prefix: str, suffix: str = "") -> tuple[float, float]:
        """(ms per call, intercept ms) of the p50s between low and high calls."""
        a, b = samples[f"{prefix}, {low} calls{suffix}"], samples[f"{prefix}, {high} calls{suffix}"]
        per = (b.p50() - a.p50()) / (high - low)
        return per, a.p50() - low * per

    direct_per = samples[f"backend direct, {direct_n} calls"].p50() / direct_n
    client_per, _ = slope("client")
    slope_rows = [(f"client tools/call (slope {low} -> {high} calls)", f"{client_per:.2f} ms",
                   f"{client_per - direct_per:+.2f} ms", "")]
    for isolation in isolations:
        per, intercept = slope("script", f" ({isolation})")
        trivial = samples[f"script `1` ({isolation})"]
        slope_rows += [
            (f"{isolation}: inner call (slope {low} -> {high} calls)", f"{per:.2f} ms",
             f"{per - direct_per:+.2f} ms", f"{per / client_per:.2f}"),
            (f"{isolation}: script start, `1` (p50)", f"{trivial.p50():.2f} ms", "", ""),
            (f"{isolation}: script start, intercept of the slope", f"{intercept:.2f} ms", "", ""),
        ]
        record(f"cost: {isolation}: inner call ms", round(per, 3))
        record(f"cost: {isolation}: script `1` p50 ms", round(trivial.p50(), 2))
        checks.append(Check(f"{isolation}: a script's inner call vs a client's tools/call (p50 slopes)",
                            f"{per:.2f} vs {client_per:.2f} ms", "<=", per <= client_per))
        checks.append(Check(f"{isolation}: script `1`, warm, through the gateway (p50)", f"{trivial.p50():.1f} ms",
                            f"< {TARGET_WARM_START_MS:g} ms", trivial.p50() < TARGET_WARM_START_MS))
    slope_rows.append((f"backend direct ({direct_n} calls, per call)", f"{direct_per:.2f} ms", "", ""))
    record("cost: client call ms", round(client_per, 3))
    print()
    print(table(["per call", "p50", "over backend direct", "/ client call"], slope_rows))
    print(f"\n{failures_line(samples)}")

    cpu_rows = []
    with contextlib.ExitStack() as stack:
        clients = {isolation: stack.enter_context(gw.client()) for isolation, gw in gws.items()}
        for each in clients.values():
            each.initialize()
            each.call_tool(tool, arguments)
        client_cpu = cpu_block(GatewayCpu(gws[first]), lambda: clients[first].call_tool(tool, arguments),
                               CPU_BLOCK)[0]
        cpu_rows.append((f"client tools/call ({CPU_BLOCK} in a row)", f"{sum(client_cpu):.2f} ms", "", ""))
        for isolation in isolations:
            on, cpu = clients[isolation], GatewayCpu(gws[isolation])
            start, spawned = cpu_block(cpu, lambda on=on: script(on, SCRIPT_TRIVIAL), CPU_BLOCK)
            data = {"calls": [{"name": tool, "arguments": arguments}] * high}
            long, _ = cpu_block(cpu, lambda on=on: script(on, SCRIPT_SEQUENTIAL, data), CPU_BLOCK // 10)
            per_call = (sum(long) - sum(start)) / high
            cpu_rows += [
                (f"{isolation}: script `1` ({CPU_BLOCK} in a row)", f"{start[0]:.2f} + {start[1]:.2f} ms", "",
                 f"{spawned / CPU_BLOCK:.2f}"),
                (f"{isolation}: script of {high} calls ({CPU_BLOCK // 10} in a row)",
                 f"{long[0]:.2f} + {long[1]:.2f} ms", f"{per_call:.2f} ms", ""),
            ]
            record(f"cost: {isolation}: script `1` gateway CPU (block) ms", round(sum(start), 3))
            record(f"cost: {isolation}: inner call gateway CPU (block) ms", round(per_call, 3))
            record(f"cost: {isolation}: sandbox processes started per script", round(spawned / CPU_BLOCK, 3))
            checks.append(Check(f"{isolation}: new sandbox processes per script `1`, warm ({CPU_BLOCK} in a row)",
                                f"{spawned / CPU_BLOCK:.2f}", f"<= {TARGET_SPAWNS_PER_SCRIPT:g}",
                                spawned / CPU_BLOCK <= TARGET_SPAWNS_PER_SCRIPT))
    record("cost: client call gateway CPU (block) ms", round(sum(client_cpu), 3))
    print(f"\ngateway CPU in blocks of runs back to back (worker + sandbox per run; per inner call: the "
          f"{high}-call script's less script `1`'s, over {high}; new sandbox pids: bwrap/monty processes under the "
          f"worker not seen before, looked for after each run)\n")
    print(table(["runs", "CPU per run (worker + sandbox)", "CPU per inner call", "new sandbox pids per run"],
                cpu_rows))

    if cold_count:
        firsts = cold_gateways(backends.urls["crm"], cold_count, isolations)
        print(f"\nscript start, cold: the first script `1` of {cold_count} fresh gateways per isolation (one backend, "
              f"the user's catalog warmed first) against their second and third; p50s\n")
        rows = []
        for isolation, runs in firsts.items():
            cold, later = [a for a, _, _ in runs], [x for _, *rest in runs for x in rest]
            diff = median([a - (b + c) / 2 for a, b, c in runs])
            rows.append((isolation, f"{median(cold):.1f} ms", f"{median(later):.1f} ms", f"{diff:+.1f} ms",
                         ", ".join(f"{a:.0f}/{b:.0f}/{c:.0f}" for a, b, c in runs)))
            record(f"cost: {isolation}: first script of a fresh gateway - later ones, ms", round(diff, 2))
        print(table(["isolation", "first", "second and third", "first - mean(2nd, 3rd)", "each gateway (ms)"], rows))
    if cold_pairs:
        rows = []
        failed: list[str] = []
        for isolation in isolations:
            cold_ms, warm_ms, failures = cold_inprocess(cold_pairs, isolation)
            failed += [f"{isolation}: {f}" for f in failures]
            rows.append((isolation, f"{median(cold_ms):.2f} / {percentile(cold_ms, 95):.2f} ms",
                         f"{median(warm_ms):.2f} / {percentile(warm_ms, 95):.2f} ms",
                         f"{median(cold_ms) - median(warm_ms):+.2f} ms", f"{len(failures)} of {2 * cold_pairs}"))
            record(f"cost: {isolation}: in-process ScriptRun new Sandbox p50 ms", round(median(cold_ms), 3))
            record(f"cost: {isolation}: in-process ScriptRun started Sandbox p50 ms", round(median(warm_ms), 3))
        print(f"\nscript start in this process: ScriptRun of `1` on a new Sandbox vs a started one ({cold_pairs} "
              f"pairs, interleaved; pydantic_monty already imported)\n")
        print(table(["isolation", "new Sandbox p50 / p95", "started Sandbox p50 / p95", "p50 difference",
                     "failed"], rows))
        if failed:
            print(f"failures: {failed[0]!r}")
    return checks, samples


# ----------------------------------------------------------------------------------------
# The run
# ----------------------------------------------------------------------------------------


def working_tree() -> str:
    """Which uncommitted vmcp_actors/ this run measures (read-only git): the files and a
    digest of their diff, so two runs on a tree under change can be told apart."""
    try:
        diff = subprocess.run(["git", "diff", "HEAD", "--", "vmcp_actors"], cwd=ROOT, capture_output=True,
                              timeout=10).stdout
        files = subprocess.run(["git", "diff", "HEAD", "--name-only", "--", "vmcp_actors"], cwd=ROOT,
                               capture_output=True, text=True, timeout=10).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return "unknown (no git)"
    if not diff:
        return "as committed"
    return f"{len(files)} files changed ({', '.join(f.removeprefix('vmcp_actors/') for f in files)}), diff sha256 " \
           f"{hashlib.sha256(diff).hexdigest()[:12]}"


def body(args: Any) -> list[Check]:
    total = args.backends * args.tools_per_backend
    print_header("code_mode: context bytes, a 10-call task, the cost of a script (issue 39)", "gunicorn", [
        f"catalog: {args.backends} official-SDK backends x {args.tools_per_backend} generated tools = {total} "
        f"tools, in a process of their own (one per delay: {', '.join(f'{d:g} ms' for d in args.delays)})",
        "code-mode gateways: codeMode: {enabled: true} (listing scripts, parallelMaxConcurrency 8, "
        f"maxConcurrentScripts 4), one per workerIsolation of {', '.join(args.isolations)} (and per delay)",
        "clients: 2025-11-25 sessions, one thread",
        *([] if os.environ.get(GATEWAY_TREE_ENV) else [f"vmcp_actors/ beyond the commit: {working_tree()}"]),
    ])
    checks: list[Check] = []
    scripts: dict[str, Samples] = {}
    with contextlib.ExitStack() as stack:
        delays = [delay for delay in dict.fromkeys((0.0, *args.delays)) if delay == 0.0 or "task" in args.parts]
        procs = stack.enter_context(catalog_processes(delays, args.backends, args.tools_per_backend))
        gws = {(delay, isolation): stack.enter_context(served(proc.urls, extra=code_mode(isolation)))
               for delay, proc in procs.items() for isolation in args.isolations}
        for gw in gws.values():  # imports and first requests served before anything is timed
            with gw.client() as client:
                client.initialize()
                client.call_tool(TASK_TOOLS[0], dict(TASK_CALLS[0][1]))
        if "context" in args.parts:
            checks += context_part(procs[0.0], gws[(0.0, args.isolations[0])])
        if "task" in args.parts:
            found, samples = task_part(gws, args.delays, args.isolations, args.rounds)
            checks += found
            scripts.update({mode: s for mode, s in samples.items() if "script" in mode})
        if "cost" in args.parts:
            found, samples = cost_part(procs[0.0], {isolation: gws[(0.0, isolation)] for isolation in args.isolations},
                                       args.cost_rounds, args.inner_calls, args.cold_gateways, args.cold_inprocess)
            checks += found
            scripts.update({mode: s for mode, s in samples.items() if "script" in mode})
    for isolation in args.isolations:
        runs = [s for mode, s in scripts.items() if f"({isolation})" in mode]
        failed = sum(len(s.failures) for s in runs)
        made = failed + sum(len(s.wall) for s in runs)
        checks.append(Check(f"{isolation}: scripts that failed (isError) in parts 2 and 3", f"{failed} of {made}",
                            "0", failed == 0))
    return checks


def main() -> None:
    if sys.argv[1:2] == ["--serve-catalog"]:
        serve_catalog(sys.argv[2:])
        return

    def numbers(kind: type) -> Callable[[str], tuple]:
        return lambda text: tuple(kind(part) for part in text.split(",") if part.strip())

    def extra(parser: Any) -> None:
        parser.add_argument("--backends", type=int, default=5, help="generated SDK backends (default 5)")
        parser.add_argument("--tools-per-backend", type=int, default=100,
                            help="generated tools per backend (default 100, at least 75; 1,000 tools at most)")
        parser.add_argument("--rounds", type=int, default=20, help="task rounds per delay (part 2)")
        parser.add_argument("--delays", type=numbers(float), default=(0.0, 20.0),
                            help="backend tool delays in ms for part 2 (default 0,20)")
        parser.add_argument("--cost-rounds", type=int, default=12, help="rounds of part 3's modes")
        parser.add_argument("--inner-calls", type=numbers(int), default=(1, 10, 50),
                            help="calls per script in part 3 (default 1,10,50; at most codeMode.maxToolCalls 100)")
        parser.add_argument("--cold-gateways", type=int, default=4, help="fresh gateways for the cold start")
        parser.add_argument("--cold-inprocess", type=int, default=20, help="in-process cold/warm ScriptRun pairs")
        parser.add_argument("--isolations", type=lambda text: tuple(p.strip() for p in text.split(",") if p.strip()),
                            default=ISOLATIONS, help="codeMode.workerIsolation values to compare (default "
                                                     "bubblewrap,none; the first serves the client calls)")

    args = parse_args(__doc__.splitlines()[0], extra=extra, parts=PARTS,
                      gunicorn_only="bench.code_mode reads the gateway worker's and its sandbox's CPU")
    if args.backends < 1 or args.tools_per_backend < 3 * TOOLS_PER_SERVICE:
        raise SystemExit("--tools-per-backend: at least 75 (the task's tools are in the first backend's "
                         "first three services)")
    if len(args.inner_calls) < 2 or max(args.inner_calls) > 100 or min(args.inner_calls) < 1:
        raise SystemExit("--inner-calls: two or more counts from 1 to 100")
    run_benchmark(lambda: body(args), watchdog=290.0)


if __name__ == "__main__":
    main()
