"""The demo's stdio backend: a small clock the gateway starts as a child process
(``python -m vmcp_actors.demo.clock``) and speaks to over stdin and stdout."""

from __future__ import annotations

import datetime as dt
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from vmcp_actors.demo.servers import _mcp


def build_clock_server():  # noqa: ANN201 - the SDK's server type comes with the demo extra
    MCPServer, _, _, _ = _mcp()
    srv = MCPServer("demo-clock", instructions="The current time in any IANA time zone, and conversions.")

    def zone(name: str) -> ZoneInfo:
        try:
            return ZoneInfo(name)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"unknown time zone {name!r} (use an IANA name such as Europe/Lisbon)") from None

    @srv.tool()
    def now(timezone: str = "UTC") -> str:
        """The current date and time in a time zone (IANA name)."""
        return dt.datetime.now(zone(timezone)).isoformat(timespec="seconds")

    @srv.tool()
    def convert(time: str, from_timezone: str, to_timezone: str) -> str:
        """Convert a wall-clock time (HH:MM, today) from one time zone to another."""
        hours, minutes = (int(part) for part in time.split(":", 1))
        today = dt.datetime.now(zone(from_timezone)).date()
        start = dt.datetime.combine(today, dt.time(hours, minutes), zone(from_timezone))
        return start.astimezone(zone(to_timezone)).strftime("%H:%M")

    return srv


if __name__ == "__main__":
    build_clock_server().run("stdio")
