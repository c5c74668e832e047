"""One view per request, over a real backend and one that is down: once the user's catalog
is discovered, a tools/list through the whole stack costs the same few messages to the
UserActor whatever the number of tools (none but a reminder to retry the missing backend,
which nobody waits for)."""

from __future__ import annotations

from collections import Counter

from tests.backends import paged_backend
from tests.gateway import backend_entry
from tests.ports import closed_port_url
from vmcp_actors.concurrency import Deadline
from vmcp_actors.config import config_from_mapping
from vmcp_actors.core import _aggregated as aggregated_module
from vmcp_actors.runtime import start_runtime
from vmcp_actors.users._records import UserKey


class CountingProxy:
    """The UserActor's proxy as AggregatedBackends uses it, counting each message sent."""

    def __init__(self, proxy):
        self._proxy = proxy
        self.messages: Counter[str] = Counter()

    def __getattr__(self, name):
        method = getattr(self._proxy, name)

        def counted(*args, **kwargs):
            self.messages[name] += 1
            return method(*args, **kwargs)

        return counted

    def take(self) -> Counter[str]:
        taken, self.messages = self.messages, Counter()
        return taken


def messages_per_list(tools: int) -> tuple[Counter[str], Counter[str]]:
    """The messages to the UserActor of a first tools/list (discovery) and of a second one,
    with ``tools`` tools on one backend and another backend down."""
    backend = paged_backend(total=tools, page_size=100, prompts=0, resources=0, name="up")
    config = config_from_mapping({
        "name": "one-view",
        "backends": [backend_entry("up", backend), {"name": "down", "url": closed_port_url()}],
        "compositeTools": [{"name": "first_tool", "description": "calls the first tool",
                            "parameters": {"type": "object", "properties": {}},
                            "steps": [{"id": "s", "tool": "up.tool_00"}]}],
    })
    runtime = start_runtime(config)
    try:
        user = runtime.gateway.serve_user(UserKey.of(None, {}), None, {}, None).get(timeout=10)
        counting = CountingProxy(user.backends._user)
        user.backends._user = counting
        listed = user.core.list_tools(None, Deadline.after(10))
        assert len(listed) == tools + 1 and listed[-1]["name"] == "first_tool"
        assert user.backends.catalog(None, Deadline.after(5)).failures.keys() == {"down"}
        first = counting.take()
        again = user.core.list_tools(None, Deadline.after(10))
        assert [t["name"] for t in again] == [t["name"] for t in listed]
        for name in ("up_tool_00", "first_tool"):
            assert user.core.describe_tool(None, name, Deadline.after(5)) is not None
            assert user.core.lookup_tool(None, name, Deadline.after(5)) is not None
        return first, counting.take()
    finally:
        runtime.stop()
        backend.stop()


def test_with_a_backend_down_a_tools_list_costs_the_same_messages_for_3_tools_as_for_30(monkeypatch):
    # One reminder to retry 'down' per test, so the counts do not depend on the clock.
    monkeypatch.setattr(aggregated_module, "REMIND_RETRY_EVERY", 3600.0, raising=False)
    few, many = messages_per_list(3), messages_per_list(30)
    assert few == many
    first, again = few
    assert first["catalog"] == 1 and sum(first.values()) <= 2  # the discovery, and at most the reminder
    assert not again  # the published catalog is read: no message, no wait
