"""Streams are bounded (issue 35): one listen stream names at most MAX_LISTENED tasks or
resources (a flood of 10,000 is refused at once, -32602), and one identified caller holds
at most its share of a process's streams (429 with Retry-After), so others still get one."""

from __future__ import annotations

import pytest

from tests.backends import sdk_backend
from tests.gateway import backend_entry, close_stream
from tests.idp import LocalIdP
from tests.task_backends import ListenStream, modern_post
from vmcp_actors.edge._service import MAX_LISTENED
from vmcp_actors.users._live import STREAMS_PER_IDENTITY

pytestmark = [pytest.mark.timeout(60), pytest.mark.filterwarnings("ignore::DeprecationWarning")]

AUD = "vmcp"


@pytest.fixture
def idp():
    with LocalIdP("floods-idp") as started:
        yield started


@pytest.fixture
def gateway(start_gateway, idp):
    with sdk_backend("plain", ["echo"]) as backend:
        yield start_gateway({"name": "t", "backends": [backend_entry("plain", backend)],
                             "incomingAuth": {"type": "oidc", "oidc": {"issuer": idp.issuer, "audience": AUD}}})


def listen(gateway, token: str, **notifications) -> ListenStream:
    return ListenStream(modern_post(gateway.url, "subscriptions/listen", {"notifications": notifications},
                                    headers={"Authorization": f"Bearer {token}"}, stream=True))


@pytest.mark.parametrize("what", ["taskIds", "resourceSubscriptions"])
def test_a_listen_naming_ten_thousand_is_refused_at_once(gateway, idp, what):
    flood = [f"x-{n}" for n in range(10_000)]
    with listen(gateway, idp.issue_token("mallory", AUD), **{what: flood}) as refused:
        assert refused.status == 400 and not refused.is_stream
        error = refused.json()["error"]
        assert error["code"] == -32602 and f"at most {MAX_LISTENED}" in error["message"], error


def test_one_caller_holds_at_most_its_share_of_the_streams(gateway, idp):
    mallory, alice = idp.issue_token("mallory", AUD), idp.issue_token("alice", AUD)
    held = []
    try:
        for _ in range(STREAMS_PER_IDENTITY):
            stream = listen(gateway, mallory, toolsListChanged=True)
            held.append(stream)
            assert stream.is_stream and stream.next()["method"] == "notifications/subscriptions/acknowledged"
        refused = listen(gateway, mallory, toolsListChanged=True)
        held.append(refused)
        assert refused.status == 429 and refused.response.headers.get("Retry-After"), refused.status
        assert refused.json()["error"]["data"]["retryAfterSeconds"] > 0
        other = listen(gateway, alice, toolsListChanged=True)  # someone else is still served
        held.append(other)
        assert other.status == 200 and other.is_stream
    finally:
        for stream in held:
            close_stream(stream.response) if stream.is_stream else stream.close()
