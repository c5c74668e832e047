"""Two small, deterministic demo MCP servers built with the official MCP SDK.

* ``weather`` - forecasts for a handful of cities (all numbers are derived from the
  city name, so every run gives the same answers; no network).
* ``notes``   - an in-memory notebook seeded with a few notes.

Both expose a ``search`` tool on purpose, so the gateway's conflict resolution
(``{workload}_`` prefixes) has something to do. ``weather.climate_report`` and
``notes.reindex`` report progress and log while they run, to demo streaming.

``mcp`` is imported lazily inside the factories (it belongs to the ``demo`` extra).
This module deliberately does not use ``from __future__ import annotations``: the SDK
inspects the tool signatures at registration time and must see real ``Context`` types.
"""

import json
import zlib
from typing import Any

from vmcp_actors.demo._serve import require_demo_extra

# Progress steps are spaced out a little so a streaming client sees them arrive.
PROGRESS_STEP_DELAY = 0.15

_CONDITIONS = ("sunny", "partly cloudy", "overcast", "light rain", "showers", "windy", "foggy", "snow flurries")

# city -> (display name, country, average temperature in Celsius)
CITIES: dict[str, tuple[str, str, int]] = {
    "amsterdam": ("Amsterdam", "Netherlands", 11),
    "berlin": ("Berlin", "Germany", 10),
    "buenos aires": ("Buenos Aires", "Argentina", 18),
    "cape town": ("Cape Town", "South Africa", 17),
    "lisbon": ("Lisbon", "Portugal", 17),
    "nairobi": ("Nairobi", "Kenya", 19),
    "oslo": ("Oslo", "Norway", 6),
    "reykjavik": ("Reykjavik", "Iceland", 5),
    "san francisco": ("San Francisco", "United States", 14),
    "tokyo": ("Tokyo", "Japan", 16),
}

_SEED_NOTES: tuple[dict[str, Any], ...] = (
    {
        "title": "Gateway design",
        "body": "One actor per backend session; fan out list calls and merge the results.",
        "tags": ["work", "architecture"],
    },
    {"title": "Groceries", "body": "Coffee beans, oat milk, lemons, basil, sourdough.", "tags": ["home"]},
    {
        "title": "Reading list",
        "body": "Designing Data-Intensive Applications; The Actor Model in practice; Piranesi.",
        "tags": ["books", "home"],
    },
    {
        "title": "Standup",
        "body": "Yesterday: pagination for tools/list. Today: search across backends. Blockers: none.",
        "tags": ["work"],
    },
    {
        "title": "Trip to Lisbon",
        "body": "Pack light layers; check the weather server before leaving.",
        "tags": ["travel"],
    },
)


def _mcp() -> tuple[Any, Any, Any, Any]:
    """(MCPServer, Context, mcp.types, mcpserver.exceptions), or a RuntimeError asking for the demo extra."""
    mcpserver = require_demo_extra("mcp.server.mcpserver")
    types = require_demo_extra("mcp.types")
    errors = require_demo_extra("mcp.server.mcpserver.exceptions")
    return mcpserver.MCPServer, mcpserver.Context, types, errors


def _read_only(types: Any) -> Any:
    """Annotations of a demo tool that only reads the demo's own data."""
    return types.ToolAnnotations(readOnlyHint=True, destructiveHint=False, idempotentHint=True, openWorldHint=False)


async def log_to_client(ctx: Any, message: str, level: str = "info") -> None:
    """Send ``notifications/message`` to the caller via ``ctx.log``.

    The SDK marks the logging capability deprecated for the 2026-07-28 revision, but
    handshake-era clients (and the gateway) still receive it; keep the demo output
    free of that warning.
    """
    import warnings

    category = getattr(require_demo_extra("mcp.shared.exceptions"), "MCPDeprecationWarning", DeprecationWarning)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", category)
        await ctx.log(level, message)


def _prefix_matches(candidates: list[str], prefix: str) -> list[str]:
    prefix = prefix.lower()
    return [c for c in candidates if c.lower().startswith(prefix)]


# ----------------------------------------------------------------------------------
# weather
# ----------------------------------------------------------------------------------


def _city(name: str) -> tuple[str, str, int]:
    key = name.strip().lower()
    if key in CITIES:
        return CITIES[key]
    # Unknown cities still get stable, plausible numbers.
    return name.strip().title(), "Unknown", 8 + zlib.crc32(key.encode()) % 15


def _day_weather(city: str, day: int) -> dict[str, Any]:
    display, country, base = _city(city)
    seed = zlib.crc32(f"{display.lower()}:{day}".encode())
    return {
        "city": display,
        "country": country,
        "day": day,
        "conditions": _CONDITIONS[seed % len(_CONDITIONS)],
        "high_c": base + seed % 7,
        "low_c": base - 3 - (seed >> 4) % 5,
        "humidity_pct": 45 + (seed >> 8) % 45,
        "wind_kph": 5 + (seed >> 12) % 30,
    }


def _forecast_text(city: str, days: int) -> str:
    days = max(1, min(days, 7))
    lines = []
    for day in range(days):
        w = _day_weather(city, day)
        label = "today" if day == 0 else "tomorrow" if day == 1 else f"day +{day}"
        lines.append(f"{label:>9}: {w['conditions']}, {w['low_c']}..{w['high_c']} °C, wind {w['wind_kph']} km/h")
    display, country, _ = _city(city)
    return f"Forecast for {display} ({country}):\n" + "\n".join(lines)


def build_weather_server() -> Any:
    """The ``weather`` demo backend (an ``MCPServer``)."""
    MCPServer, Context, types, errors = _mcp()
    srv = MCPServer(
        "weather",
        instructions="Deterministic demo weather data for a few cities. Try get_forecast or climate_report.",
        version="1.0.0",
        log_level="WARNING",
    )
    read_only = _read_only(types)

    @srv.tool(annotations=read_only)
    def get_forecast(city: str, days: int = 3) -> str:
        """A multi-day forecast (1-7 days) for a city."""
        return _forecast_text(city, days)

    @srv.tool(annotations=read_only)
    def current_conditions(city: str) -> dict[str, Any]:
        """Current conditions for a city, as structured data."""
        return _day_weather(city, 0)

    @srv.tool(annotations=read_only)
    def search(query: str) -> str:
        """Search the known cities by name or country."""
        q = query.strip().lower()
        hits = [f"{d} ({c})" for d, c, _ in CITIES.values() if q in d.lower() or q in c.lower()]
        return "\n".join(hits) if hits else f"No city matches {query!r}."

    @srv.tool(annotations=read_only)
    def convert_temperature(value: float, to: str = "F") -> str:
        """Convert a temperature between Celsius and Fahrenheit (to='F' or to='C')."""
        if to.upper() == "F":
            return f"{value} °C = {round(value * 9 / 5 + 32, 1)} °F"
        if to.upper() == "C":
            return f"{value} °F = {round((value - 32) * 5 / 9, 1)} °C"
        raise errors.ToolError("to must be 'F' or 'C'")

    @srv.tool()
    async def climate_report(city: str, ctx: Context) -> str:
        """A slow climate report that streams progress and log messages while it works."""
        import anyio

        display, _, _ = _city(city)
        steps = ("gathering observations", "analysing trends", "comparing seasons", "writing the report")
        for number, step in enumerate(steps, start=1):
            await ctx.report_progress(number, len(steps), f"{display}: {step}")
            await anyio.sleep(PROGRESS_STEP_DELAY)
        await log_to_client(ctx, f"climate report for {display} ready")
        week = [_day_weather(city, day) for day in range(7)]
        mean_high = sum(w["high_c"] for w in week) / 7
        wettest = sum(1 for w in week if "rain" in w["conditions"] or "showers" in w["conditions"])
        return f"Climate report for {display}: mean high {mean_high:.1f} °C over 7 days, {wettest} wet day(s)."

    @srv.resource("weather://cities", mime_type="application/json", description="The cities this server knows")
    def cities() -> str:
        return json.dumps([{"name": d, "country": c} for d, c, _ in CITIES.values()], indent=2)

    @srv.resource("weather://forecast/{city}", mime_type="text/plain", description="A 3-day forecast for a city")
    def forecast_resource(city: str) -> str:
        return _forecast_text(city, 3)

    @srv.prompt()
    def packing_advice(city: str, days: str = "3") -> str:
        """Ask the model what to pack for a trip."""
        return (
            f"I am travelling to {_city(city)[0]} for {days} days. Here is the forecast:\n\n"
            f"{_forecast_text(city, int(days) if days.isdigit() else 3)}\n\nWhat should I pack?"
        )

    @srv.completion()
    async def complete(ref: Any, argument: Any, context: Any) -> Any:
        known = [d for d, _, _ in CITIES.values()]
        if argument.name == "city" and (
            (isinstance(ref, types.PromptReference) and ref.name == "packing_advice")
            or (isinstance(ref, types.ResourceTemplateReference) and ref.uri == "weather://forecast/{city}")
        ):
            values = _prefix_matches(known, argument.value)
            return types.Completion(values=values, total=len(values), has_more=False)
        return None

    return srv


# ----------------------------------------------------------------------------------
# notes
# ----------------------------------------------------------------------------------


def build_notes_server() -> Any:
    """The ``notes`` demo backend (an ``MCPServer``) with its own in-memory notebook."""
    MCPServer, Context, types, errors = _mcp()
    srv = MCPServer(
        "notes",
        instructions="A small in-memory notebook. Notes have an id, a title, a body and tags.",
        version="1.0.0",
        log_level="WARNING",
    )
    read_only = _read_only(types)
    notes: dict[int, dict[str, Any]] = {}
    for seed in _SEED_NOTES:
        note_id = len(notes) + 1
        notes[note_id] = {"id": note_id, **seed, "tags": list(seed["tags"])}

    def all_tags() -> list[str]:
        return sorted({tag for note in notes.values() for tag in note["tags"]})

    def one_line(note: dict[str, Any]) -> str:
        return f"#{note['id']} {note['title']} [{', '.join(note['tags'])}]"


    @srv.tool(annotations=read_only)
    def search(query: str) -> str:
        """Full-text search over note titles and bodies."""
        q = query.strip().lower()
        hits = [one_line(n) for n in notes.values() if q in n["title"].lower() or q in n["body"].lower()]
        return "\n".join(hits) if hits else f"No note matches {query!r}."

    @srv.tool(annotations=read_only)
    def list_notes(tag: str | None = None) -> str:
        """List notes, optionally only those carrying a tag."""
        chosen = [one_line(n) for n in notes.values() if tag is None or tag in n["tags"]]
        return "\n".join(chosen) if chosen else "No notes."

    @srv.tool(annotations=read_only)
    def get_note(note_id: int) -> dict[str, Any]:
        """One note, as structured data."""
        if note_id not in notes:
            raise errors.ToolError(f"no note with id {note_id}")
        return dict(notes[note_id])

    @srv.tool()
    def add_note(title: str, body: str, tags: list[str] | None = None) -> dict[str, Any]:
        """Add a note; returns it with its new id."""
        note_id = max(notes, default=0) + 1
        notes[note_id] = {"id": note_id, "title": title, "body": body, "tags": list(tags or [])}
        return dict(notes[note_id])

    @srv.tool()
    async def reindex(ctx: Context) -> str:
        """Rebuild the search index, reporting progress for every note."""
        import anyio

        total = len(notes)
        for done, note in enumerate(list(notes.values()), start=1):
            await ctx.report_progress(done, total, f"indexed #{note['id']} {note['title']}")
            await anyio.sleep(PROGRESS_STEP_DELAY / 2)
        await log_to_client(ctx, f"reindexed {total} notes")
        words = sum(len(n["body"].split()) for n in notes.values())
        return f"Indexed {total} notes ({words} words, {len(all_tags())} tags)."

    @srv.resource("notes://index", mime_type="text/plain", description="Every note, one line each")
    def index() -> str:
        return "\n".join(one_line(n) for n in notes.values())

    @srv.resource("notes://notes/{note_id}", mime_type="text/markdown", description="One note as Markdown")
    def note_resource(note_id: str) -> str:
        note = notes.get(int(note_id)) if note_id.isdigit() else None
        if note is None:
            raise errors.ResourceNotFoundError(f"no note with id {note_id}")
        return f"# {note['title']}\n\n{note['body']}\n\nTags: {', '.join(note['tags'])}\n"

    @srv.prompt()
    def summarize_notes(tag: str) -> str:
        """Ask the model to summarise every note with a tag."""
        chosen = [n for n in notes.values() if tag in n["tags"]]
        listing = "\n\n".join(f"## {n['title']}\n{n['body']}" for n in chosen) or "(no notes)"
        return f"Summarise my notes tagged '{tag}' in three bullet points:\n\n{listing}"

    @srv.prompt()
    def daily_standup() -> str:
        """Draft a standup update from the work notes."""
        work = [n["body"] for n in notes.values() if "work" in n["tags"]]
        return "Draft my standup update from these notes:\n\n" + "\n".join(f"- {b}" for b in work)

    @srv.completion()
    async def complete(ref: Any, argument: Any, context: Any) -> Any:
        if isinstance(ref, types.PromptReference) and ref.name == "summarize_notes" and argument.name == "tag":
            values = _prefix_matches(all_tags(), argument.value)
        elif isinstance(ref, types.ResourceTemplateReference) and argument.name == "note_id":
            values = [str(i) for i in notes if str(i).startswith(argument.value)]
        else:
            return None
        return types.Completion(values=values, total=len(values), has_more=False)

    return srv


DEMO_SERVER_FACTORIES = {"weather": build_weather_server, "notes": build_notes_server}
