import json
import math

import pytest

from vmcp_actors.core._pagination import paginate
from vmcp_actors.protocol import (
    INVALID_PARAMS,
    INVALID_REQUEST,
    PARSE_ERROR,
    JsonRpcError,
    encode_sse_event,
    iter_sse_events,
    json_value,
    negotiate_protocol_version,
    parse_message,
    wire_bytes,
)


@pytest.mark.parametrize(
    "body, code",
    [
        (b"{not json", PARSE_ERROR),
        (b"\xff\xfe", PARSE_ERROR),
        (b"[]", INVALID_REQUEST),
        (b'[{"jsonrpc":"2.0","id":1,"method":"ping"}]', INVALID_REQUEST),
        (b'"text"', INVALID_REQUEST),
        (b'{"id":1,"method":"ping"}', INVALID_REQUEST),
        (b'{"jsonrpc":"1.0","id":1,"method":"ping"}', INVALID_REQUEST),
        (b'{"jsonrpc":"2.0","id":1.5,"method":"ping"}', INVALID_REQUEST),
        (b'{"jsonrpc":"2.0","id":true,"method":"ping"}', INVALID_REQUEST),
        (b'{"jsonrpc":"2.0","id":null,"method":"ping"}', INVALID_REQUEST),
        (b'{"jsonrpc":"2.0","id":1,"method":""}', INVALID_REQUEST),
        (b'{"jsonrpc":"2.0","id":1,"method":"ping","params":3}', INVALID_REQUEST),
        (b'{"jsonrpc":"2.0"}', INVALID_REQUEST),
    ],
)
def test_bad_messages_are_rejected_with_their_code(body, code):
    with pytest.raises(JsonRpcError) as caught:
        parse_message(body)
    assert caught.value.code == code


def test_message_kinds():
    assert parse_message(b'{"jsonrpc":"2.0","id":"a","method":"ping"}').kind == "request"
    assert parse_message(b'{"jsonrpc":"2.0","method":"notifications/initialized"}').kind == "notification"
    assert parse_message(b'{"jsonrpc":"2.0","id":3,"result":{}}').kind == "response"


def test_version_negotiation_prefers_the_clients_known_version():
    assert negotiate_protocol_version("2025-06-18") == "2025-06-18"
    assert negotiate_protocol_version("2025-11-25") == "2025-11-25"
    assert negotiate_protocol_version("2024-01-01") == "2025-11-25"
    assert negotiate_protocol_version(None) == "2025-11-25"


def test_sse_round_trip_keeps_order_and_skips_comments():
    text = encode_sse_event({"a": 1}) + ": keep-alive\n\n" + encode_sse_event({"b": 2}, event_id="7")
    events = list(iter_sse_events(text.splitlines()))
    assert [json.loads(e.data) for e in events] == [{"a": 1}, {"b": 2}]
    assert events[1].id == "7"


def test_pagination_pages_through_everything_once():
    items = tuple({"name": str(i)} for i in range(7))
    seen, params = [], {}
    while True:
        page = paginate(items, "tools", params, 3)
        seen += [i["name"] for i in page["tools"]]
        if "nextCursor" not in page:
            break
        params = {"cursor": page["nextCursor"]}
    assert seen == [str(i) for i in range(7)]


@pytest.mark.parametrize("cursor", ["garbage", "", "!!!", 5, "WyJwcm9tcHRzIiwyXQ"])
def test_invalid_cursor_is_invalid_params(cursor):
    items = tuple({"name": str(i)} for i in range(7))
    with pytest.raises(JsonRpcError) as caught:
        paginate(items, "tools", {"cursor": cursor}, 3)
    assert caught.value.code == INVALID_PARAMS


def test_sse_events_carry_id_and_retry_and_an_id_only_event_is_dispatched():
    text = "id: s-0\nretry: 500\ndata:\n\nid: s-1\ndata: {}\n\nretry: x\n\n"
    events = list(iter_sse_events(text.splitlines()))
    assert [(e.id, e.retry, e.data) for e in events] == [("s-0", 500, ""), ("s-1", None, "{}")]


# ---------------------------------------------------------------- json's rules, orjson's speed


@pytest.mark.parametrize("text, expected", [
    (b'{"id": 123456789012345678901234567890}', {"id": 123456789012345678901234567890}),  # not a float
    (b'{"id": -18446744073709551617}', {"id": -18446744073709551617}),
    (b'{"x": 1e400}', {"x": math.inf}),
    ('{"s": "\\ud800"}', {"s": "\ud800"}),  # a lone surrogate, as json reads it
    ('{"a": 1}'.encode("utf-16"), {"a": 1}),
    (b'{"a": 1, "a": 2}', {"a": 2}),
    (b'{"text": "caf\\u00e9 \xc3\xa9"}', {"text": "café é"}),
])
def test_json_value_reads_what_json_reads_as_json_reads_it(text, expected):
    assert json_value(text) == expected == json.loads(text)
    assert type(json_value(text)) is type(json.loads(text))


def test_json_value_reads_nan_as_json_does_and_refuses_what_json_refuses():
    assert math.isnan(json_value(b"NaN"))
    for bad in (b"{", b'{"a": 1,}', b"\xff", b'"\x01"'):
        with pytest.raises(ValueError):
            json.loads(bad)
        with pytest.raises(ValueError):
            json_value(bad)


@pytest.mark.parametrize("value", [
    {"jsonrpc": "2.0", "id": 2**70, "result": {}},
    {"text": "\ud800"},
    {"nested": {"é": [1, 2.5, None, True]}},
    [[[[]]]],
])
def test_wire_bytes_says_what_json_says(value):
    assert json.loads(wire_bytes(value)) == value


def test_a_deeply_nested_body_is_a_parse_error_not_a_crash():
    with pytest.raises(JsonRpcError) as info:
        parse_message(b"[" * 100_000 + b"]" * 100_000)
    assert info.value.code == PARSE_ERROR
