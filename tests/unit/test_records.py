"""Session and user records are plain values: JSON and back, nothing live inside."""

from __future__ import annotations

import json

import pytest

from vmcp_actors.backends import Handshake
from vmcp_actors.identity import Identity, anonymous_with
from vmcp_actors.signing import Signer
from vmcp_actors.users._records import SessionRecord, UserKey, UserRecord


def _through_json(value):
    return json.loads(json.dumps(value.to_json()))


def test_a_session_record_round_trips_through_json():
    capabilities = {"sampling": {}, "elicitation": {"form": {}, "url": {}}, "roots": {"listChanged": True}}
    record = SessionRecord("a" * 64, UserKey("https://idp", "alice"), "2025-06-18", capabilities,
                           {"name": "client", "version": "1"}, "warning", 1700000000.5, 1700000100.25)
    again = SessionRecord.from_json(_through_json(record))
    assert again == record
    assert again.client_capabilities["elicitation"] == {"form": {}, "url": {}}


def test_a_user_record_round_trips_through_json():
    handshake = Handshake("backend-session-1", "2025-11-25", {"tools": {"listChanged": True}}, {"name": "jira"})
    record = UserRecord(UserKey("", "anonymous", "0123abcd"), {"jira": handshake, "wiki": Handshake(None, "2025-06-18")},
                        1700000000.0)
    again = UserRecord.from_json(_through_json(record))
    assert again == record
    assert again.backends["jira"].session_id == "backend-session-1"
    assert again.with_backend("jira", None).backends.keys() == {"wiki"}


def test_a_record_shares_nothing_mutable_with_its_input():
    capabilities = {"roots": {"listChanged": True}}
    record = SessionRecord("s", UserKey(), "2025-11-25", capabilities)
    capabilities["roots"]["listChanged"] = False
    assert record.client_capabilities["roots"] == {"listChanged": True}
    with pytest.raises(TypeError):
        record.client_capabilities["x"] = 1  # type: ignore[index]


@pytest.mark.parametrize("data", [
    None, [], {"sessionId": 1}, {"sessionId": "s", "user": ["", "anonymous", ""]},
    {"sessionId": "s", "user": ["only two", "parts"], "protocolVersion": "2025-11-25"},
    {"sessionId": "s", "user": ["", "anonymous", ""], "protocolVersion": "2025-11-25", "clientCapabilities": []},
    {"sessionId": "s", "user": ["", "anonymous", ""], "protocolVersion": "2025-11-25", "created": "yesterday"},
])
def test_a_malformed_session_record_is_a_value_error(data):
    with pytest.raises(ValueError):
        SessionRecord.from_json(data)


def test_user_keys_tell_people_and_passthrough_headers_apart():
    alice = Identity("https://idp", "alice", token="t1")
    refreshed = Identity("https://idp", "alice", token="t2")
    assert UserKey.of(alice) == UserKey.of(refreshed) == UserKey("https://idp", "alice")
    assert UserKey.of(None) == UserKey.of(anonymous_with(())) == UserKey()
    tenant_a, tenant_b = anonymous_with((("X-Tenant", "a"),)), anonymous_with((("X-Tenant", "b"),))
    assert UserKey.of(tenant_a) != UserKey.of(tenant_b) != UserKey()
    assert UserKey.of(tenant_a).owner is None and UserKey.of(alice).owner == ("https://idp", "alice")
    assert UserKey.of(tenant_a).label == "anonymous"
    assert "X-Tenant" not in repr(UserKey.of(tenant_a))  # a digest, never a header value


def test_session_ids_are_signed_and_a_forgery_does_not_verify():
    signer = Signer(b"k" * 32)
    issued = signer.new_session_id()
    assert len(issued) == 64 and signer.is_session_id(issued)
    assert not Signer(b"j" * 32).is_session_id(issued)
    tampered = issued[:-1] + ("0" if issued[-1] != "0" else "1")
    assert not signer.is_session_id(tampered)
    for bad in (None, 42, "", issued + "0", issued.upper(), "g" * 64):
        assert not signer.is_session_id(bad)
    with pytest.raises(ValueError):
        Signer(b"short")
