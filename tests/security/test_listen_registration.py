"""No notification is lost between a 2026-07-28 client's ``subscriptions/listen`` and its
stream's registration (issue 35). The window is made as wide as it gets: the backend
sends ``notifications/resources/updated`` for a URI from inside its ``resources/subscribe``
handler, before it even answers, so the update is under way while the gateway is still
subscribing. A direct client with its stream open would get it; so must the listener.
Nothing here waits on a clock: the update either reaches the listen stream or the read
times out."""

from __future__ import annotations

import pytest

from tests.asking_backends import WATCHED_URI, AskingBackend
from tests.gateway import backend_entry
from tests.integration.test_modern import Listener

pytestmark = [pytest.mark.timeout(60), pytest.mark.filterwarnings("ignore::DeprecationWarning")]


class EagerBackend(AskingBackend):
    """The asking backend, telling its client a resource changed the moment it is
    subscribed to (on its standalone stream, before the subscribe is answered)."""

    def __init__(self, name: str) -> None:
        from mcp import types

        super().__init__(name)
        backend = self

        async def on_subscribe(ctx, params: types.SubscribeRequestParams) -> types.EmptyResult:
            backend.subscriptions.append(("subscribe", str(params.uri)))
            await ctx.session.send_resource_updated(str(params.uri))
            return types.EmptyResult()

        self.server._lowlevel_server.add_request_handler("resources/subscribe", types.SubscribeRequestParams,
                                                         on_subscribe)


@pytest.fixture
def eager():
    backend = EagerBackend("eager").start()
    yield backend
    backend.stop()


def test_an_update_the_backend_sends_as_it_is_subscribed_reaches_the_listen_stream(start_gateway, eager):
    gateway = start_gateway({"name": "window", "backends": [backend_entry("eager", eager, "legacy")]})
    listener = Listener(gateway.url, {"resourceSubscriptions": [WATCHED_URI]})
    try:
        ack = listener.next()
        assert ack["method"] == "notifications/subscriptions/acknowledged", ack
        assert ack["params"]["notifications"]["resourceSubscriptions"] == [WATCHED_URI], ack
        assert ("subscribe", WATCHED_URI) in eager.subscriptions
        update = listener.next(timeout=10)
        assert update["method"] == "notifications/resources/updated" and update["params"]["uri"] == WATCHED_URI
        assert update["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"] == "sub-1"
    finally:
        listener.close()


def test_a_uri_the_backend_refuses_is_not_acknowledged_and_its_updates_do_not_arrive(start_gateway, eager):
    """The stream is registered before the subscriptions are made, with every URI asked
    for; only those subscribed stay on it (what the acknowledgment says)."""
    gateway = start_gateway({"name": "window", "backends": [backend_entry("eager", eager, "legacy")]})
    unknown = "test://nobody/serves-this"
    listener = Listener(gateway.url, {"resourceSubscriptions": [unknown, WATCHED_URI]})
    try:
        ack = listener.next()
        assert ack["params"]["notifications"]["resourceSubscriptions"] == [WATCHED_URI], ack
        update = listener.next(timeout=10)
        assert update["params"]["uri"] == WATCHED_URI, update
    finally:
        listener.close()
