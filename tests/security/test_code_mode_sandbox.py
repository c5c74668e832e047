"""Code mode against a hostile script (issue 39): ``execute_tool_script`` runs a model's
script in pydantic-monty's sandbox, and nothing a script does reaches past it.

* Escapes: the environment, files, ``/proc``, imports of the OS, the interpreter's
  introspection, ``eval``/``exec``: each fails inside the script with an error naming the
  failure, and no secret of the gateway's environment (a backend's injected header value,
  the admin token) appears in any result. The sandbox workers (children of this process)
  hold none of it: their environment is empty.
* Limits: executionTime, maxMemory, maxRecursionDepth, maxToolCalls, parallelMaxConcurrency,
  timeout (the backend's call cancelled), maxScriptSize, data, maxConcurrentScripts: each
  hit with an answer naming the config field, and the gateway serves on (a script and a
  direct call work, no script thread left).
* Policy: a script's ``call_tool`` is a client's call. A tool Cedar forbids, one the
  filter hides and one whose bucket is spent fail inside the script with the error a
  client calling it directly gets, and never reach the backend; Cedar forbidding
  ``execute_tool_script`` itself hides it.
* Operators: audit lines tie each inner call to its script, ``/admin/state`` shows a
  running script and its calls, ``/metrics`` counts scripts and their calls.

A real official-SDK backend that counts the ``tools/call`` it receives
(tests/entry_backends.py), and a gateway per test on a real HTTP server; the caller is
anonymous (Cedar decides for ``Client::"anonymous"``).

No ``from __future__ import annotations``: the SDK reads the backend tools' annotations
at registration.
"""

import json
import os
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from tests.backends import build_sdk_server
from tests.entry_backends import CountingSdkBackend
from tests.gateway import GatewayServer, admin_get, answer_of, backend_entry, wait_until

pytestmark = [pytest.mark.timeout(120), pytest.mark.filterwarnings("ignore::DeprecationWarning")]

SCRIPT_TOOL = "execute_tool_script"
CODE_MODE_TOOLS = {SCRIPT_TOOL, "search_tools", "get_tool_schema"}
# Secrets the gateway's config references by environment variable: none may reach a script.
KEY_ENV, KEY = "CODE_MODE_TEST_BACKEND_KEY", "k3y-n0t-for-scripts-7Qz"
ADMIN_ENV, ADMIN_TOKEN = "CODE_MODE_TEST_ADMIN_TOKEN", "adm1n-n0t-for-scripts-4Rw"
METRICS_ENV, METRICS_TOKEN = "CODE_MODE_TEST_METRICS_TOKEN", "metr1cs-n0t-for-scripts-9Kp"
SECRETS = (KEY, ADMIN_TOKEN, METRICS_TOKEN)
THREAD_MARGIN = 8  # threads a gateway may keep after a script beyond its warm count (idle pool workers)
HELD_AT_MOST = 30.0  # seconds a held backend call waits for its release (a test that forgot it ends anyway)


# ----------------------------------------------------------------------------------
# The backend: an official-SDK server that counts its calls and can hold them
# ----------------------------------------------------------------------------------


class Probe:
    """The backend ``plain`` and what its tools saw. ``echo``, ``secret``, ``hidden`` and
    ``limited`` answer at once; ``hold`` and ``crowd`` wait until ``release`` is set
    (``crowd`` counts how many of its calls run at once); ``cancelled`` counts the held
    calls the gateway cancelled."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self._lock = threading.Lock()  # guards the counters below
        self.held = 0
        self.cancelled = 0
        self.crowd_now = 0
        self.crowd_highest = 0

        async def held_until_released(text: str, tool: str) -> str:
            for _ in range(int(HELD_AT_MOST / 0.01)):
                if self.release.is_set():
                    return f"{tool}:{text}"
                await anyio.sleep(0.01)
            return f"{tool}: never released"

        def plain(tool: str) -> Any:
            def call(text: str) -> str:
                return f"{tool}:{text}"

            call.__name__ = tool
            call.__doc__ = f"The {tool} tool: answers '{tool}:<text>'."
            return call

        async def hold(text: str) -> str:
            """Waits for the test's release, then answers 'hold:<text>'."""
            with self._lock:
                self.held += 1
            try:
                return await held_until_released(text, "hold")
            except anyio.get_cancelled_exc_class():
                with self._lock:
                    self.cancelled += 1
                raise
            finally:
                with self._lock:
                    self.held -= 1

        async def crowd(text: str) -> str:
            """Counts the calls running at once; waits for the test's release."""
            with self._lock:
                self.crowd_now += 1
                self.crowd_highest = max(self.crowd_highest, self.crowd_now)
            try:
                return await held_until_released(text, "crowd")
            finally:
                with self._lock:
                    self.crowd_now -= 1

        tools = [plain("secret"), plain("hidden"), plain("limited"), hold, crowd]
        self.backend = CountingSdkBackend("plain", build_sdk_server("plain", ["echo"], extra_tools=tools)).start()

    def reset(self) -> None:
        self.release.clear()
        with self._lock:
            self.cancelled = self.crowd_highest = 0

    def count(self, tool: str) -> int:
        """How many ``tools/call`` of ``tool`` reached the backend (all tests together)."""
        return self.backend.calls.count(tool)

    def now(self) -> dict[str, int]:
        with self._lock:
            return {"held": self.held, "cancelled": self.cancelled, "crowd": self.crowd_now,
                    "crowdHighest": self.crowd_highest}


@pytest.fixture(scope="module")
def probe_backend() -> Iterator[Probe]:
    probe = Probe()
    yield probe
    probe.release.set()
    probe.backend.stop()


@pytest.fixture
def probe(probe_backend: Probe, monkeypatch: pytest.MonkeyPatch) -> Iterator[Probe]:
    """The backend, its held calls cleared, and the secrets in this process's environment."""
    for name, value in ((KEY_ENV, KEY), (ADMIN_ENV, ADMIN_TOKEN), (METRICS_ENV, METRICS_TOKEN)):
        monkeypatch.setenv(name, value)
    probe_backend.reset()
    yield probe_backend
    probe_backend.release.set()  # nothing stays held past its test


def config(probe: Probe, code_mode: dict[str, Any] | None = None, **more: Any) -> dict[str, Any]:
    """A gateway over ``plain`` that holds secrets: the backend's API key and the admin
    and metrics tokens, each from the environment."""
    return {
        "name": "code-mode",
        "backends": [backend_entry("plain", probe.backend)],
        "outgoingAuth": {"backends": {"plain": {"type": "header_injection", "headerInjection": {
            "headerName": "X-Api-Key", "headerValueEnv": KEY_ENV}}}},
        "admin": {"tokenEnv": ADMIN_ENV, "metricsTokenEnv": METRICS_ENV},
        "codeMode": {"enabled": True, **(code_mode or {})},
        **more,
    }


# ----------------------------------------------------------------------------------
# Calling scripts
# ----------------------------------------------------------------------------------


class Caller:
    """A 2025-11-25 session on a gateway (the raw way), and its scripts."""

    def __init__(self, gateway: GatewayServer):
        self.gateway = gateway
        self.session = gateway.initialize()

    def post_script(self, script: str, data: Any = None) -> requests.Response:
        arguments: dict[str, Any] = {"script": script}
        if data is not None:
            arguments["data"] = data
        return self.gateway.post({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                                  "params": {"name": SCRIPT_TOOL, "arguments": arguments}}, self.session)

    def script(self, script: str, data: Any = None) -> dict[str, Any]:
        """The script tool's result (a tool result: the script ran, well or not)."""
        response = self.post_script(script, data)
        assert response.status_code == 200, response.text
        answer = answer_of(response)
        assert "result" in answer, answer
        return answer["result"]

    def call(self, tool: str, arguments: dict[str, Any] | None = None) -> dict[str, Any]:
        """A direct tools/call's JSON-RPC answer."""
        return self.gateway.rpc(self.session, "tools/call", {"name": tool, "arguments": arguments or {}})

    def call_response(self, tool: str, arguments: dict[str, Any] | None = None) -> requests.Response:
        return self.gateway.post({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                                  "params": {"name": tool, "arguments": arguments or {}}}, self.session)

    def script_in_background(self, script: str) -> "Background":
        return Background(lambda: self.script(script))


class Background:
    """A call on a thread of its own; ``result()`` joins it."""

    def __init__(self, call: Any):
        self._outcome: dict[str, Any] = {}
        self._thread = threading.Thread(target=self._run, args=(call,), daemon=True)
        self._thread.start()

    def _run(self, call: Any) -> None:
        try:
            self._outcome["value"] = call()
        except BaseException as error:  # noqa: BLE001 - re-raised in the test's thread
            self._outcome["error"] = error

    def result(self, timeout: float = 30.0) -> Any:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the call did not end"
        if "error" in self._outcome:
            raise self._outcome["error"]
        return self._outcome["value"]


def text_of(result: dict[str, Any]) -> str:
    return "\n".join(block.get("text", "") for block in result.get("content", []))


def script_id(result: dict[str, Any]) -> str:
    return result["_meta"]["vmcp-actors/script"]["id"]


def script_threads() -> list[str]:
    return [thread.name for thread in threading.enumerate() if thread.name.startswith("vmcp-script-")]


def warm(caller: Caller) -> int:
    """One script and one direct call (the sandbox's pool and the backend's session
    started); the number of threads then."""
    assert caller.script("await call_tool('plain_echo', {'text': 'warm'})")["structuredContent"] == \
        {"result": "plain:warm"}
    assert wait_until(lambda: not script_threads()), script_threads()
    return threading.active_count()


def assert_serves_on(caller: Caller, threads_before: int) -> None:
    """After a limit: the next script and a direct call work, and no script thread is
    left (the thread count back within a margin of the warm gateway's)."""
    after = caller.script("await call_tool('plain_echo', {'text': 'after'})")
    assert after["isError"] is False and after["structuredContent"] == {"result": "plain:after"}, after
    direct = caller.call("plain_echo", {"text": "direct"})
    assert direct.get("result", {}).get("isError") is False, direct
    assert wait_until(lambda: not script_threads()), f"script threads left: {script_threads()}"
    assert wait_until(lambda: threading.active_count() <= threads_before + THREAD_MARGIN, timeout=15), \
        (threads_before, sorted(thread.name for thread in threading.enumerate()))


# ----------------------------------------------------------------------------------
# 1. Escapes
# ----------------------------------------------------------------------------------

ESCAPES = [
    pytest.param(f"import os\nos.environ[{KEY_ENV!r}]", "'os.environ' is not supported", id="os.environ"),
    pytest.param(f"import os\nos.getenv({KEY_ENV!r})", "'os.getenv' is not supported", id="os.getenv"),
    pytest.param("open('/etc/passwd').read()", "PermissionError: Permission denied: '/etc/passwd'", id="open"),
    pytest.param("open('/proc/self/environ').read()", "PermissionError: Permission denied: '/proc/self/environ'",
                 id="proc-environ"),
    pytest.param("open('/tmp/code-mode-escape', 'w').write('x')", "PermissionError", id="open-to-write"),
    pytest.param("from pathlib import Path\nPath('/proc/self/environ').read_bytes()", "PermissionError",
                 id="pathlib-read"),
    pytest.param("import os\nos.listdir('/')", "PermissionError: Permission denied: '/'", id="listdir"),
    pytest.param("__import__('os')", "NameError: name '__import__' is not defined", id="__import__"),
    pytest.param("import subprocess", "ModuleNotFoundError: No module named 'subprocess'", id="subprocess"),
    pytest.param("import socket", "ModuleNotFoundError: No module named 'socket'", id="socket"),
    pytest.param("import os\nos.system('id')", "AttributeError: module 'os' has no attribute 'system'",
                 id="os.system"),
    pytest.param("globals()", "NameError: name 'globals' is not defined", id="globals"),
    pytest.param("().__class__.__base__.__subclasses__()", "AttributeError: 'tuple' object has no attribute "
                 "'__class__'", id="subclasses"),
    pytest.param("object.__subclasses__()", "AttributeError", id="object-subclasses"),
    # call_tool is a value too (f = call_tool): a host function the sandbox knows by name only
    pytest.param("call_tool.__globals__", "AttributeError: 'function' object has no attribute '__globals__'",
                 id="call_tool.__globals__"),
    pytest.param("call_tool.__closure__", "AttributeError: 'function' object has no attribute '__closure__'",
                 id="call_tool.__closure__"),
    pytest.param("type(call_tool).__subclasses__()",
                 "AttributeError: type object 'function' has no attribute '__subclasses__'", id="type-of-call_tool"),
    pytest.param("f = lambda: 1\nf.__globals__", "AttributeError: 'function' object has no attribute '__globals__'",
                 id="lambda-globals"),
    pytest.param("eval(\"__import__('os')\")", "NameError: name '__import__' is not defined", id="eval"),
    pytest.param(f'exec("import os\\nvalue = os.environ[{KEY_ENV!r}]")', "'os.environ' is not supported", id="exec"),
    pytest.param("eval('__builtins__')", "NameError: name '__builtins__' is not defined", id="eval-builtins"),
    pytest.param("import sys\nsys.modules", "AttributeError: module 'sys' has no attribute 'modules'",
                 id="sys.modules"),
]


@pytest.mark.parametrize(("script", "failure"), ESCAPES)
def test_an_escape_fails_inside_the_script_and_leaks_nothing(start_gateway, probe: Probe, script: str,
                                                             failure: str) -> None:
    caller = Caller(start_gateway(config(probe)))
    result = caller.script(script)
    text = text_of(result)
    assert result["isError"] is True, result
    assert failure in text, text
    assert not [secret for secret in SECRETS if secret in json.dumps(result)], "a secret reached a script's result"
    assert str(Path(__file__).resolve().parents[2]) not in text, "the gateway's own paths reached the script"
    assert not Path("/tmp/code-mode-escape").exists()


def test_what_a_script_can_read_holds_no_secret(start_gateway, probe: Probe) -> None:
    """Everything a script may read about its world, returned whole: no secret among it."""
    caller = Caller(start_gateway(config(probe)))
    result = caller.script("import sys, os\n{'locals': repr(locals()), 'argv': sys.argv, 'cwd': os.getcwd(), "
                           "'version': sys.version, 'data': data}", {"given": "by the caller"})
    assert result["isError"] is False, result
    assert result["structuredContent"]["data"] == {"given": "by the caller"}
    assert os.environ[KEY_ENV] == KEY  # the gateway's process holds it ...
    assert not [secret for secret in SECRETS if secret in json.dumps(result)], result  # ... the script does not


def descendants() -> list[int]:
    """This process's descendants (the sandbox workers are its children, or bubblewrap's)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue  # gone meanwhile
        children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry))
    found, todo = [], [os.getpid()]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def monty_processes() -> dict[int, tuple[list[str], dict[str, str]]]:
    """The processes running ``<...>/monty subprocess`` (the workers, and bubblewrap
    starting one): pid -> (argv, environment)."""
    found = {}
    for pid in descendants():
        try:
            argv = [part.decode() for part in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if part]
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if argv[-2:-1] and argv[-2].endswith("monty") and argv[-1] == "subprocess":
            found[pid] = (argv, dict(entry.decode().split("=", 1) for entry in environ.split(b"\0") if entry))
    return found


@pytest.mark.parametrize("isolation", ["none", "bubblewrap"])
def test_the_sandbox_workers_have_an_empty_environment(start_gateway, probe: Probe, isolation: str) -> None:
    gateway = start_gateway(config(probe, {"workerIsolation": isolation}))
    caller = Caller(gateway)
    assert caller.script("1")["structuredContent"] == {"result": 1}
    processes = monty_processes()
    workers = {pid: environ for pid, (argv, environ) in processes.items() if Path(argv[0]).name == "monty"}
    assert workers, f"no sandbox worker among this process's descendants: {processes}"
    for pid, (argv, environ) in processes.items():
        assert not [secret for secret in SECRETS if secret in json.dumps(environ)], (pid, argv)
        assert not set(environ) & {KEY_ENV, ADMIN_ENV, METRICS_ENV, "PATH", "HOME"}, (pid, argv, environ)
    for pid, environ in workers.items():
        # Bubblewrap's --clearenv empties it; its --chdir / then sets PWD, and only that.
        assert environ == ({} if isolation == "none" else {"PWD": "/"}), (pid, environ)
    gateway.stop()
    assert wait_until(lambda: not monty_processes()), f"workers outlived their gateway: {monty_processes()}"


# ----------------------------------------------------------------------------------
# 2. Limits
# ----------------------------------------------------------------------------------

LIMITS = [
    pytest.param({"executionTime": "1s"}, "while True:\n    pass", "codeMode.executionTime (1s)", id="executionTime"),
    pytest.param({"maxMemory": "4Mi"}, "x = 'a' * (64 * 1024 * 1024)\nlen(x)",
                 f"codeMode.maxMemory ({4 * 1024 * 1024} bytes)", id="maxMemory"),
    pytest.param({"maxMemory": "4Mi"}, "x = []\nwhile True:\n    x.append('a' * 1000)",
                 f"codeMode.maxMemory ({4 * 1024 * 1024} bytes)", id="maxMemory-growing"),
    pytest.param({"maxRecursionDepth": 50}, "def f(n):\n    return f(n + 1)\nf(0)", "codeMode.maxRecursionDepth (50)",
                 id="maxRecursionDepth"),
]


@pytest.mark.parametrize(("limits", "script", "names"), LIMITS)
def test_a_limit_stops_the_script_and_the_gateway_serves_on(start_gateway, probe: Probe, limits: dict[str, Any],
                                                            script: str, names: str) -> None:
    caller = Caller(start_gateway(config(probe, limits)))
    threads = warm(caller)
    result = caller.script(script)
    assert result["isError"] is True and names in text_of(result), result
    assert_serves_on(caller, threads)


def test_max_tool_calls_stops_a_loop_of_calls_at_the_limit(start_gateway, probe: Probe) -> None:
    caller = Caller(start_gateway(config(probe, {"maxToolCalls": 5})))
    threads = warm(caller)  # a script of its own: one call
    before = probe.count("echo")
    result = caller.script("for i in range(20):\n    await call_tool('plain_echo', {'text': str(i)})")
    assert result["isError"] is True, result
    assert "it called tools more than codeMode.maxToolCalls (5) times" in text_of(result), result
    assert probe.count("echo") - before == 5, "the backend got the calls under the limit, and no more"
    assert_serves_on(caller, threads)


def test_parallel_calls_never_exceed_parallel_max_concurrency(start_gateway, probe: Probe) -> None:
    caller = Caller(start_gateway(config(probe, {"parallelMaxConcurrency": 3})))
    threads = warm(caller)
    gathered = caller.script_in_background(
        "import asyncio\nawait asyncio.gather(*[call_tool('plain_crowd', {'text': str(i)}) for i in range(10)])")

    def three_running_seven_waiting() -> bool:
        rows = admin_get(caller.gateway, token=ADMIN_TOKEN).json()["scripts"]
        return bool(rows) and rows[0]["toolCalls"] == 10 and probe.now()["crowd"] == 3 \
            and rows[0]["running"] == ["plain_crowd"] * 3

    # The script made its 10 calls; 3 run (held at the backend), the gateway holds 7 back.
    assert wait_until(three_running_seven_waiting), (admin_get(caller.gateway, token=ADMIN_TOKEN).json()["scripts"],
                                                     probe.now())
    probe.release.set()
    result = gathered.result()
    assert result["isError"] is False, result
    assert result["structuredContent"] == {"result": [{"result": f"crowd:{i}"} for i in range(10)]}
    assert probe.now()["crowdHighest"] == 3, probe.now()
    assert_serves_on(caller, threads)


def test_a_script_past_its_timeout_is_stopped_and_its_backend_call_cancelled(start_gateway, probe: Probe) -> None:
    caller = Caller(start_gateway(config(probe, {"timeout": "1s"})))
    threads = warm(caller)
    result = caller.script("await call_tool('plain_hold', {'text': 'forever'})")  # never released
    assert result["isError"] is True, result
    assert "it ran longer than codeMode.timeout (1s" in text_of(result), result
    assert wait_until(lambda: probe.now()["cancelled"] == 1 and probe.now()["held"] == 0), probe.now()
    assert_serves_on(caller, threads)


@pytest.mark.parametrize(("arguments", "names"), [
    pytest.param({"script": "x = 1\n" * 400}, "codeMode.maxScriptSize", id="maxScriptSize"),
    pytest.param({"script": "'" + "\u00e9" * 600 + "'"}, "codeMode.maxScriptSize", id="maxScriptSize-in-bytes"),
    pytest.param({"script": "data", "data": [1, 2]}, "data must be an object", id="data-a-list"),
    pytest.param({"script": "data", "data": "text"}, "data must be an object", id="data-a-string"),
    pytest.param({"script": "   "}, "script must be", id="blank-script"),
])
def test_a_script_call_with_bad_arguments_is_invalid_params(start_gateway, probe: Probe, arguments: dict[str, Any],
                                                            names: str) -> None:
    caller = Caller(start_gateway(config(probe, {"maxScriptSize": "1Ki"})))
    answer = answer_of(caller.gateway.post({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": SCRIPT_TOOL, "arguments": arguments}}, caller.session))
    assert answer.get("error", {}).get("code") == -32602 and names in answer["error"]["message"], answer
    assert caller.script("data", {"ok": True})["structuredContent"] == {"ok": True}


def test_more_scripts_than_slots_are_refused_with_retry_after(start_gateway, probe: Probe) -> None:
    caller = Caller(start_gateway(config(probe, {"maxConcurrentScripts": 2})))
    threads = warm(caller)
    held = [caller.script_in_background(f"await call_tool('plain_hold', {{'text': '{n}'}})") for n in range(2)]
    assert wait_until(lambda: probe.now()["held"] == 2), probe.now()
    before = probe.count("echo")
    refused = caller.post_script("await call_tool('plain_echo', {'text': 'third'})")
    assert refused.status_code == 503, refused.text
    error = answer_of(refused)["error"]
    assert "codeMode.maxConcurrentScripts: 2" in error["message"], error
    assert error["data"]["retryAfterSeconds"] >= 1 and int(refused.headers["Retry-After"]) >= 1, refused.headers
    assert probe.count("echo") == before, "the refused script ran"
    probe.release.set()
    assert [run.result()["structuredContent"] for run in held] == [{"result": "hold:0"}, {"result": "hold:1"}]
    assert_serves_on(caller, threads)


# ----------------------------------------------------------------------------------
# 3. Policy from inside a script
# ----------------------------------------------------------------------------------

POLICIES = ['permit(principal, action, resource);',
            'forbid(principal, action == Action::"call_tool", resource == Tool::"plain_secret");']
GUARDED = {
    "incomingAuth": {"type": "anonymous", "authz": {"type": "cedar", "policies": POLICIES}},
    "aggregation": {"tools": [{"workload": "plain", "filter": ["echo", "secret", "limited", "hold", "crowd"]}]},
    "rateLimiting": {"tools": [{"name": "plain_limited", "shared": {"maxTokens": 1, "refillPeriod": "1h"}}]},
}
# Each named tool called in turn: its value, or the error the script caught.
CALL_IN_TURN = """
outcomes = []
for name in data['tools']:
    try:
        outcomes.append({'value': await call_tool(name, {'text': 'in a script'})})
    except RuntimeError as error:
        outcomes.append({'error': str(error)})
outcomes
"""


@pytest.mark.parametrize(("tool", "calls", "code", "status"), [
    pytest.param("secret", 1, -32602, 200, id="cedar-forbids"),
    pytest.param("hidden", 1, -32602, 200, id="filter-hides"),
    pytest.param("limited", 2, 429, 429, id="bucket-spent"),  # its one token goes to the first call
])
def test_a_refused_call_fails_in_the_script_as_for_a_client(start_gateway, probe: Probe, tool: str, calls: int,
                                                            code: int, status: int) -> None:
    caller = Caller(start_gateway(config(probe, **GUARDED)))
    before = probe.count(tool)
    result = caller.script(CALL_IN_TURN, {"tools": [f"plain_{tool}"] * calls})
    assert result["isError"] is False, result
    *allowed, refused = result["structuredContent"]["result"]
    assert allowed == [{"value": {"result": f"{tool}:in a script"}}] * (calls - 1), allowed
    assert probe.count(tool) - before == calls - 1, "a refused call reached the backend"
    direct = caller.call_response(f"plain_{tool}", {"text": "direct"})
    error = answer_of(direct)["error"]
    assert (direct.status_code, error["code"]) == (status, code), direct.text
    assert refused == {"error": f"{error['message']} (error {code})"}, (refused, error)
    assert probe.count(tool) - before == calls - 1, "the direct call, refused, reached the backend"


def test_a_script_and_each_of_its_calls_spend_tokens_of_the_callers_bucket(start_gateway, probe: Probe) -> None:
    caller = Caller(start_gateway(config(probe, rateLimiting={"shared": {"maxTokens": 3, "refillPeriod": "1h"}})))
    before = probe.count("echo")
    result = caller.script(CALL_IN_TURN, {"tools": ["plain_echo"] * 3})  # the script's token, then two calls'
    assert result["structuredContent"]["result"] == [{"value": {"result": "plain:in a script"}}] * 2 + [
        {"error": "Rate limit exceeded (error 429)"}], result
    assert probe.count("echo") - before == 2
    assert caller.call_response("plain_echo", {"text": "direct"}).status_code == 429
    refused = caller.post_script("1")
    assert refused.status_code == 429 and answer_of(refused)["error"]["code"] == 429, refused.text


def test_a_script_calls_only_the_tools_code_mode_covers_and_none_of_its_own(start_gateway, probe: Probe) -> None:
    caller = Caller(start_gateway(config(probe, {"tools": ["plain_echo", "plain_s*"]})))
    before = probe.count("limited")
    tried = ["plain_limited", SCRIPT_TOOL, "search_tools", "get_tool_schema", "plain_secret"]
    result = caller.script(CALL_IN_TURN, {"tools": tried})
    assert result["structuredContent"]["result"] == [
        {"error": f"Unknown tool: {name} (error -32602)"} for name in tried[:-1]] + [
        {"value": {"result": "secret:in a script"}}], result
    assert probe.count("limited") == before, "a tool codeMode.tools does not cover reached the backend"
    direct = caller.call("plain_limited", {"text": "direct"})  # a client may still call it
    assert direct["result"]["structuredContent"] == {"result": "limited:direct"}, direct


def test_a_script_finds_no_tool_a_client_may_not_call(start_gateway, probe: Probe) -> None:
    caller = Caller(start_gateway(config(probe, **GUARDED)))
    schemas = caller.call("get_tool_schema", {"names": ["plain_echo", "plain_secret", "plain_hidden"]})["result"]
    assert [tool["name"] for tool in schemas["structuredContent"]["tools"]] == ["plain_echo"], schemas
    assert schemas["structuredContent"]["unknown"] == ["plain_secret", "plain_hidden"], schemas
    found = caller.call("search_tools", {"query": "answers the text", "limit": 50})["result"]
    names = {tool["name"] for tool in found["structuredContent"]["tools"]}
    assert "plain_echo" in names and not names & {"plain_secret", "plain_hidden"}, found


def test_cedar_forbidding_the_script_tool_hides_it(start_gateway, probe: Probe) -> None:
    policies = ['permit(principal, action, resource);',
                f'forbid(principal, action == Action::"call_tool", resource == Tool::"{SCRIPT_TOOL}");']
    caller = Caller(start_gateway(config(probe, {"listing": "all"}, incomingAuth={
        "type": "anonymous", "authz": {"type": "cedar", "policies": policies}})))
    listed = {tool["name"] for tool in caller.gateway.rpc(caller.session, "tools/list", {})["result"]["tools"]}
    assert "plain_echo" in listed and not listed & CODE_MODE_TOOLS, listed
    before = probe.count("echo")
    answer = answer_of(caller.post_script("await call_tool('plain_echo', {'text': 'forbidden'})"))
    assert answer.get("error") == {"code": -32602, "message": f"Unknown tool: {SCRIPT_TOOL}"}, answer
    assert probe.count("echo") == before


# ----------------------------------------------------------------------------------
# 4. Operators
# ----------------------------------------------------------------------------------


def audit_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_audit_lines_tie_each_inner_call_to_its_script(start_gateway, probe: Probe, tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    caller = Caller(start_gateway(config(probe, audit={"enabled": True, "logFile": str(path)})))
    result = caller.script("a = await call_tool('plain_echo', {'text': 'one'})\n"
                           "try:\n    await call_tool('plain_nope', {})\nexcept RuntimeError:\n    pass\n"
                           "b = await call_tool('plain_echo', {'text': 'two'})\n[a, b]")
    assert result["isError"] is False, result
    run = script_id(result)

    def with_the_script_tools_line() -> list[dict[str, Any]] | None:
        # The script tool's own line is written when its request closes (after the answer).
        lines = audit_lines(path)
        return lines if any(line.get("script") == run and line["name"] == SCRIPT_TOOL for line in lines) else None

    lines = wait_until(with_the_script_tools_line)
    assert lines, audit_lines(path)
    mine = [line for line in lines if line.get("script") == run]
    inner = [(line["name"], line["backend"], line["outcome"]) for line in mine if line["name"] != SCRIPT_TOOL]
    assert inner == [("plain_echo", "plain", "success"), ("plain_nope", None, "error"),
                     ("plain_echo", "plain", "success")], mine
    own = [line for line in mine if line["name"] == SCRIPT_TOOL]
    assert len(own) == 1 and own[0]["outcome"] == "success" and own[0]["session"] is not None, own
    assert {line["type"] for line in mine} == {"mcp_tool_call"}
    assert {line["user"]["subject"] for line in mine} == {"anonymous"}
    assert not [line for line in lines if line["name"] == "plain_echo" and "script" not in line], \
        "an inner call's line without its script"


def test_admin_state_shows_a_running_script_until_it_ends(start_gateway, probe: Probe) -> None:
    gateway = start_gateway(config(probe))
    caller = Caller(gateway)
    marker = "a-marker-in-the-script-text"
    running = caller.script_in_background(f"# {marker}\nawait call_tool('plain_hold', {{'text': 'admin'}})")

    def rows() -> list[dict[str, Any]]:
        return admin_get(gateway, token=ADMIN_TOKEN).json()["scripts"]

    shown = wait_until(lambda: [row for row in rows() if row["running"] == ["plain_hold"]])
    assert len(shown) == 1 and shown[0]["toolCalls"] == 1 and shown[0]["user"] == "anonymous", rows()
    state = admin_get(gateway, token=ADMIN_TOKEN)
    assert marker not in state.text, "the admin state shows a script's text"
    per_user = [row for user in state.json()["users"] for row in user["scripts"]]
    assert [row["script"] for row in per_user] == [shown[0]["script"]], state.json()["users"]
    page = admin_get(gateway, "/admin", token=ADMIN_TOKEN)
    assert page.status_code == 200 and 'id="scripts"' in page.text and shown[0]["script"] in page.text
    assert admin_get(gateway).status_code == 401
    probe.release.set()
    result = running.result()
    assert result["structuredContent"] == {"result": "hold:admin"} and script_id(result) == shown[0]["script"]
    assert wait_until(lambda: rows() == []), rows()
    assert [row for user in admin_get(gateway, token=ADMIN_TOKEN).json()["users"] for row in user["scripts"]] == []


def scrape(gateway: GatewayServer) -> dict[tuple[str, tuple], float]:
    response = requests.get(gateway.base + "/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"},
                            timeout=10)
    assert response.status_code == 200, response.text
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(response.text) for sample in family.samples}


def test_metrics_count_scripts_and_their_tool_calls(start_gateway, probe: Probe) -> None:
    gateway = start_gateway(config(probe, {"maxRecursionDepth": 20}))
    caller = Caller(gateway)
    assert requests.get(gateway.base + "/metrics", timeout=10).status_code == 401, "the metrics token is required"
    assert wait_until(lambda: not script_threads()), script_threads()  # earlier runs' counts all landed
    before = scrape(gateway)

    def delta(values: dict, name: str, outcome: str) -> float:
        key = (name, (("outcome", outcome),))
        return values.get(key, 0.0) - before.get(key, 0.0)

    ok = caller.script("await call_tool('plain_echo', {'text': 'a'})\n"
                       "try:\n    await call_tool('plain_nope', {})\nexcept RuntimeError:\n    pass\n"
                       "await call_tool('plain_echo', {'text': 'b'})")
    assert ok["isError"] is False, ok
    failed = caller.script("def f(n):\n    return f(n + 1)\nf(0)")
    assert failed["isError"] is True, failed
    wanted = {("vmcp_scripts_total", "ok"): 1, ("vmcp_scripts_total", "tool_error"): 1,
              ("vmcp_script_duration_seconds_count", "ok"): 1,
              ("vmcp_script_tool_calls_total", "ok"): 2, ("vmcp_script_tool_calls_total", "error"): 1,
              ("vmcp_script_tool_call_duration_seconds_count", "ok"): 2}

    def counted() -> dict | None:
        values = scrape(gateway)
        seen = {key: delta(values, *key) for key in wanted}
        return seen if seen == wanted else None

    # A run's own observation lands as it ends, just after its answer.
    assert wait_until(counted), {key: delta(scrape(gateway), *key) for key in wanted}
    assert re.search(r"^# TYPE vmcp_script_tool_call_duration_seconds histogram$", requests.get(
        gateway.base + "/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"}, timeout=10).text, re.M)
