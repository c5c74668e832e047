"""Task handles (issue 24): the gateway's id for a backend's task, sealed to one user and one
backend, the same text every time it names the same task, and the rewriting of each
revision's task shapes under it."""

from __future__ import annotations

import pytest

from vmcp_actors.core._exchange import Notification, ServerRequest
from vmcp_actors.core._tasks import RELATED_TASK, TaskHandles, to_legacy, to_modern
from vmcp_actors.protocol import JsonRpcError
from vmcp_actors.signing import Signer, Unsealable

KEY = b"task-handle-key-0123456789abcdef"
TASK = {"taskId": "b-1", "status": "working", "createdAt": "2026-11-25T00:00:00Z",
        "lastUpdatedAt": "2026-11-25T00:00:01Z", "ttl": 60000, "pollInterval": 1000}


def test_a_handle_is_the_same_text_for_the_same_task_and_opens_anywhere_with_the_key():
    first, second = Signer(KEY), Signer(KEY)  # two processes holding the same key
    handle = first.seal_handle("task", {"b": "jobs", "t": "b-1", "u": "alice"})
    assert handle == first.seal_handle("task", {"u": "alice", "t": "b-1", "b": "jobs"})
    assert handle != first.seal_handle("task", {"b": "jobs", "t": "b-2", "u": "alice"})
    assert second.open_handle("task", handle) == {"b": "jobs", "t": "b-1", "u": "alice"}


@pytest.mark.parametrize("spoil", [
    lambda h: h[:-2] + ("AA" if not h.endswith("AA") else "BB"),  # altered
    lambda h: Signer(b"another-key-0123456789abcdefghij").seal_handle("task", {"b": "jobs"}),  # another key
    lambda h: Signer(KEY).seal_handle("other", {"b": "jobs", "t": "b-1", "u": "alice"}),  # another purpose
    lambda h: "",
    lambda h: 42,
])
def test_a_handle_not_made_by_this_key_for_this_purpose_does_not_open(spoil):
    signer = Signer(KEY)
    handle = signer.seal_handle("task", {"b": "jobs", "t": "b-1", "u": "alice"})
    with pytest.raises(Unsealable):
        signer.open_handle("task", spoil(handle))


def test_a_users_handles_open_for_that_user_only():
    signer = Signer(KEY)
    alice, bob = TaskHandles(signer, "alice"), TaskHandles(signer, "bob")
    handle = alice.handle("jobs", "b-1")
    assert alice.open(handle) == ("jobs", "b-1")
    with pytest.raises(JsonRpcError) as refused:
        bob.open(handle)
    assert refused.value.code == -32602 and "another caller" in refused.value.message
    with pytest.raises(JsonRpcError) as forged:
        alice.open("not-a-handle")
    assert forged.value.code == -32602


def test_each_revisions_shapes_are_rewritten_under_the_handle():
    handles = TaskHandles(Signer(KEY), "alice")
    handle = handles.handle("jobs", "b-1")
    legacy_created = handles.created("jobs", {"task": TASK, "_meta": {RELATED_TASK: {"taskId": "b-1"}}}, modern=False)
    assert legacy_created == {"task": {**TASK, "taskId": handle}, "_meta": {RELATED_TASK: {"taskId": handle}}}
    modern_created = handles.created("jobs", {"resultType": "task", **to_modern(TASK)}, modern=True)
    assert modern_created["resultType"] == "task" and modern_created["taskId"] == handle
    assert modern_created["ttlMs"] == 60000 and "ttl" not in modern_created
    # a 2026-07-28 task told to a 2025 client: its names, nothing inline
    told = handles.task("jobs", {**to_modern(TASK), "resultType": "complete", "result": {"content": []}}, modern=False)
    assert told == {**TASK, "taskId": handle}
    assert handles.created("jobs", {"content": [{"type": "text", "text": "no task"}]}, modern=False) is None
    assert to_legacy(to_modern(TASK)) == TASK


def test_streamed_requests_and_notifications_name_the_handle():
    handles = TaskHandles(Signer(KEY), "alice")
    handle = handles.handle("jobs", "b-1")
    asked = handles.event("jobs", ServerRequest("elicitation/create", {
        "message": "?", "_meta": {RELATED_TASK: {"taskId": "b-1"}}}, lambda answer: None), modern=False)
    assert asked.params["_meta"][RELATED_TASK] == {"taskId": handle} and asked.params["message"] == "?"
    status = handles.event("jobs", Notification({"jsonrpc": "2.0", "method": "notifications/tasks/status",
                                                 "params": TASK}), modern=True)
    assert status.message["method"] == "notifications/tasks"
    assert status.message["params"]["taskId"] == handle and status.message["params"]["ttlMs"] == 60000
