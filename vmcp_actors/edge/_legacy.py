"""The 2025 client edge (sessions): initialize and the revision it negotiates, the server's
capabilities, the ``MCP-Protocol-Version`` checks, a request's deadline, and
``SessionSide``, what a session's client makes of a call's events: its log level and
subscriptions decide what it hears, a backend's request for it is written on the call's
stream under an id of the session's own, and a 2026-07-28 backend's ``input_required``
is asked of it the same way and the backend asked again with the answers, so the client
sees one ordinary call."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from typing import Any

import pykka

from vmcp_actors.backends import InputRequired
from vmcp_actors.concurrency import Deadline
from vmcp_actors.config import SCRIPT_TOOL, VmcpConfig
from vmcp_actors.core._catalog import connect_tool_name
from vmcp_actors.core._exchange import Notification, ServerRequest, from_backend
from vmcp_actors.edge._driver import Answered, CallRun, Failed, Outcome, Write
from vmcp_actors.edge._modern import legacy_result
from vmcp_actors.protocol import (
    ACCEPTED_PROTOCOL_HEADER_VERSIONS,
    INTERNAL_ERROR,
    INVALID_REQUEST,
    REQUEST_TIMEOUT,
    JsonRpcError,
    Message,
)
from vmcp_actors.protocol.mcp import PROTOCOL_VERSION_HEADER, is_logged_at
from vmcp_actors.users import SessionRecord, UserHandle
from vmcp_actors.users._actor import LIST_CHANGED, RESOURCE_UPDATED
from vmcp_actors.users._live import InFlight, LiveSessions


def check_header_version(header: str | None, session_version: str | None) -> JsonRpcError | None:
    """A 400 error when the ``MCP-Protocol-Version`` header is unusable: a revision the
    gateway does not serve, or (on a session) one newer than the session negotiated. An
    absent header is fine (the spec says to assume 2025-03-26), and so is an older
    revision than the session's (revisions are dated, so they compare as text)."""
    if header is None:
        return None
    if header not in ACCEPTED_PROTOCOL_HEADER_VERSIONS:
        return JsonRpcError(INVALID_REQUEST, f"Bad Request: unsupported {PROTOCOL_VERSION_HEADER}: {header[:40]}",
                            http_status=400)
    if session_version is not None and header > session_version:
        return JsonRpcError(INVALID_REQUEST, f"Bad Request: {PROTOCOL_VERSION_HEADER} {header} is newer than the "
                                             f"revision this session negotiated ({session_version})", http_status=400)
    return None


# How long a connect tool's call waits for the person to finish connecting in the browser.
CONNECT_WAIT = 300.0


class RequestDeadlines:
    """The one deadline of each client request: the longest backend timeout (the most any
    backend may take to answer), and for a composite tool's call its own timeout on top
    (the run's timeout counts from its start, after discovery), as for a code mode script.
    Worked out once per config."""

    def __init__(self, config: VmcpConfig):
        timeouts = config.operational.timeouts
        self._longest = max([timeouts.default, *timeouts.per_workload.values()])
        self._composites = {tool.name: self._longest + tool.timeout for tool in config.composite_tools}
        # A connect tool waits for a person in a browser: a call asking URL elicitation waits that long.
        self._composites.update({connect_tool_name(name): self._longest + CONNECT_WAIT
                                 for name in config.connected_backends})
        if config.code_mode.enabled:  # a script runs its own timeout, after discovery
            self._composites[SCRIPT_TOOL] = self._longest + config.code_mode.timeout

    def for_request(self, message: Message) -> Deadline:
        if self._composites and message.method == "tools/call" and isinstance(message.params, dict):
            seconds = self._composites.get(message.params.get("name"))  # type: ignore[arg-type]
            if seconds is not None:
                return Deadline.after(seconds)
        return Deadline.after(self._longest)


class SessionSide:
    """A 2025 session's client in one call (see ``edge._driver.ClientSide``)."""

    def __init__(self, live: LiveSessions, session: SessionRecord, call: InFlight, deadline: Deadline, user: UserHandle):
        self._live = live
        self._session = session
        self._call = call
        self._deadline = deadline
        self._user = user

    def keep(self, notification: Notification) -> bool:
        method = notification.method
        try:
            if method in LIST_CHANGED:
                self._user.proxy.backend_changed(notification.origin)  # clients hear it after the rebuild
                return False
            if method == RESOURCE_UPDATED:
                params = notification.message.get("params")
                subscribed = isinstance(params, dict) and params.get("uri") in self._session.subscriptions
                self._user.proxy.resource_updated(notification.message, self._session.session_id if subscribed else None)
                return subscribed
        except pykka.ActorDeadError:
            return False
        return is_logged_at(notification.message, self._session.log_level)

    def opened(self, run: CallRun) -> None:
        if run.cancel is not None:
            self._live.call_opened(self._call, run.cancel)

    def asked(self, request: ServerRequest, run: CallRun) -> Write | None:
        message = self._live.ask(self._session.session_id, request, self._session.client_capabilities,
                                 self._deadline, self._call)
        return Write(message) if message is not None else None

    def input_required(self, event: InputRequired, run: CallRun) -> Iterator[Write]:
        """Each of the backend's requests asked on the call's stream, then the backend
        asked again with the answers (``run.exchange`` becomes that retry)."""
        answers = InputAnswers(event)
        for request in answers.requests():
            written = self.asked(request, run)
            if written is not None:
                yield written
        responses = answers.wait()
        run.exchange.close()
        run.exchange = from_backend(event.retry(responses), event.backend)

    def answered(self, result: Mapping[str, Any]) -> Outcome:
        return Answered(legacy_result(result))

    def failed(self, error: JsonRpcError) -> Outcome:
        return Failed(error)

    def left(self, run: CallRun) -> None:
        pass  # closing the exchange ends the backend's side

    def finished(self, run: CallRun) -> None:
        self._live.end_call(self._call)


class InputAnswers:
    """The answers to one ``input_required`` round, as a 2025 client gives them on the
    call's stream (each request goes out as an ordinary request for the client)."""

    def __init__(self, event: InputRequired):
        self._event = event
        self._lock = threading.Lock()  # guards _answers and _failure (answers arrive on other threads)
        self._answers: dict[str, Any] = {}
        self._failure: dict[str, Any] | None = None
        self._done = threading.Event()  # set once every request is answered (or one refused)
        if not event.requests:
            self._done.set()

    def requests(self) -> Iterator[ServerRequest]:
        for key, asked in self._event.requests.items():
            params = asked.get("params")
            yield ServerRequest(str(asked.get("method", "")), params if isinstance(params, dict) else {},
                                lambda answer, key=key: self._settle(key, answer), self._event.backend)

    def wait(self) -> dict[str, Any]:
        """The results by key, once every request is answered; a JSON-RPC error when one
        was refused or the call's deadline passed first."""
        if not self._done.wait(max(self._event.deadline.remaining(), 0.0)):
            raise JsonRpcError(REQUEST_TIMEOUT, "the client did not answer the backend's requests before the "
                                                "call's deadline", {"backend": self._event.backend})
        if self._failure is not None:
            code = self._failure.get("code")
            raise JsonRpcError(code if isinstance(code, int) else INTERNAL_ERROR,
                               str(self._failure.get("message", "the client refused the backend's request")),
                               {"backend": self._event.backend})
        return dict(self._answers)

    def _settle(self, key: str, answer: dict[str, Any]) -> None:
        with self._lock:
            if "error" in answer:
                self._failure = answer["error"] if isinstance(answer["error"], dict) else {}
                self._done.set()
                return
            self._answers[key] = answer.get("result")
            if len(self._answers) == len(self._event.requests):
                self._done.set()
