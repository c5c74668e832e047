"""Read the ``mcpServers`` JSON file desktop clients use (Claude Desktop, Cursor, Windsurf,
Claude Code's ``.mcp.json``; VS Code's ``servers``) into the gateway's config mapping.

What such a file says that the gateway cannot do becomes a note (``path: what and why``)
instead of an error, so a file copied from a desktop serves what it can. A malformed file
is a ``ConfigError``. Notes and errors name keys, never values: env values and header
values are credentials.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any

from marshmallow import ValidationError

from vmcp_actors.exceptions import ConfigError

from ._load import config_from_mapping, read_text_file
from ._model import VmcpConfig
from ._schema import NOT_INJECTABLE_HEADERS, _backend_name

# Where the servers are: Claude Desktop, Cursor, Windsurf, Claude Code | VS Code.
SERVER_LISTS = ("mcpServers", "servers")
# A client's transport name (Cline calls the key transportType), folded: lower case, no '-' or '_'.
TRANSPORT_OF_TYPE = {"stdio": "stdio", "sse": "sse", "http": "streamable-http", "streamablehttp": "streamable-http"}
TYPE_KEYS = ("type", "transportType")
URL_KEYS = ("url", "serverUrl")  # serverUrl: Windsurf
# Passed on as they are, for the gateway's schema to judge (scope and sandbox are the gateway's own keys).
PROCESS_KEYS = ("command", "args", "env", "cwd", "scope", "sandbox")
# The file describes what one client runs: each client session gets its own process, as
# each desktop client starts its own (an entry's "scope" may choose shared or perUser).
DEFAULT_PROCESS_SCOPE = "perSession"
# ${input:id} and ${env:NAME} (VS Code, Cursor), ${NAME} and ${NAME:-default} (Claude Code),
# ${workspaceFolder}, ${userHome}: each client fills them from its own prompts and environment.
PLACEHOLDER = re.compile(r"\$\{[^}]*\}")
NOT_IN_A_BACKEND_NAME = re.compile(r"[^A-Za-z0-9_-]+")
MAX_BACKEND_NAME = 63
# Keys that read well after a dot in a path; others are written ["quoted"].
PLAIN_KEY = re.compile(r"[A-Za-z0-9_-]+")
# An entry's keys the gateway does not use, where there is more to say than that.
UNUSED_KEYS = {
    "envFile": "not read: list the variables under env",
    "serverUrl": "not used: url is given too",
}

NOT_EXPANDED = "the gateway does not expand ${...}: it has no one to ask, and its environment is not the servers' to read"
ONE_HEADER = ("the gateway injects one header per backend (outgoingAuth header_injection); "
              "keep the one the server needs")


@dataclass(frozen=True)
class McpServersImport:
    """What an mcpServers file gives the gateway: the config ``mapping`` (``config()``
    validates it) and ``notes``, one ``path: what was not used and why`` line each."""

    # Holds the file's env and header values: never in a repr.
    mapping: Mapping[str, Any] = field(repr=False)
    notes: tuple[str, ...] = ()
    # A path in the gateway's config -> the path in the file it came from.
    sources: Mapping[str, str] = field(default_factory=dict, repr=False)

    def config(self) -> VmcpConfig:
        """The validated config; a ``ConfigError``'s lines name the paths in the file."""
        try:
            return config_from_mapping(self.mapping)
        except ConfigError as error:
            raise ConfigError([self._in_the_file(line) for line in error.errors]) from None

    def _in_the_file(self, line: str) -> str:
        for config_path in sorted(self.sources, key=len, reverse=True):  # backends[1].url before backends[1]
            rest = line[len(config_path):]
            if line.startswith(config_path) and rest[:1] in (".", "[", ":"):
                return self.sources[config_path] + rest
        return line


def read_mcp_servers(path: str | os.PathLike[str], name: str | None = None) -> McpServersImport:
    """Read an mcpServers (or VS Code ``servers``) JSON file; the gateway is named ``name``,
    by default the file's stem. JSON with comments and trailing commas (VS Code) is read too."""
    where = os.fspath(path)
    data = _parse_json(read_text_file(where), where)
    return import_mcp_servers(data, name or _name_from_file(where), where)


def import_mcp_servers(data: Any, name: str, where: str = "the file") -> McpServersImport:
    """The gateway config mapping for parsed mcpServers data, and the notes."""
    if not isinstance(data, Mapping):
        raise ConfigError([f"{where}: must be a JSON object holding mcpServers (or VS Code's servers)"])
    present = [key for key in SERVER_LISTS if key in data]
    if not present:
        raise ConfigError([f"{where}: has neither mcpServers (Claude Desktop, Cursor, Windsurf) nor servers (VS Code)"])
    if len(present) > 1:
        raise ConfigError([f"{where}: has both mcpServers and servers; keep one"])
    top = present[0]
    servers = data[top]
    if not isinstance(servers, Mapping):
        raise ConfigError([f"{top}: must be an object of server name to its settings"])

    importer = _Importer(top, servers)
    for key in data:
        if key == "inputs":
            importer.note(key, "not used: the gateway asks no one for values (each ${input:...} is noted "
                               "where it is used)")
        elif key != top:
            importer.note(key, f"not used: only {top} is read")
    for key, entry in servers.items():
        importer.add_server(key, entry)
    if importer.errors:
        raise ConfigError(importer.errors)
    return importer.result(name)


class _Importer:
    """Turns one server entry after another into a backend (and its outgoing auth)."""

    def __init__(self, top: str, servers: Mapping[str, Any]) -> None:
        self.top = top
        self.backends: list[dict[str, Any]] = []
        self.auth: dict[str, Any] = {}
        self.sources: dict[str, str] = {"backends": top}
        self.notes: list[str] = []
        self.errors: list[str] = []
        # Names the file already spells right, so that a repaired name never takes one.
        self.taken = {key for key in servers if _name_problem(key) is None}

    def note(self, path: str, message: str) -> None:
        self.notes.append(f"{path}: {message}")

    def result(self, name: str) -> McpServersImport:
        mapping: dict[str, Any] = {"name": name, "backends": self.backends}
        if self.auth:
            mapping["outgoingAuth"] = {"backends": self.auth}
        return McpServersImport(mapping, tuple(self.notes), self.sources)

    def add_server(self, key: str, entry: Any) -> None:
        path = self.top + _path_key(key)
        if not isinstance(entry, Mapping):
            self.errors.append(f"{path}: must be an object (command and args, or url)")
            return
        if entry.get("disabled") is True:
            self.note(path, "disabled: true, so not served")
            return
        url_key = next((k for k in URL_KEYS if k in entry), None)
        transport = self._transport(path, entry, url_key)
        if transport is None or self._uses_placeholders(path, entry, url_key):
            return
        name = self._backend_name(path, key)
        if name is None:
            return

        index = len(self.backends)
        backend: dict[str, Any] = {"name": name, "transport": transport}
        for process_key in PROCESS_KEYS:
            if process_key in entry:
                backend[process_key] = entry[process_key]
        if transport == "stdio":
            backend.setdefault("scope", DEFAULT_PROCESS_SCOPE)
        if isinstance(backend.get("env"), Mapping):
            backend["env"] = self._env_without_placeholders(f"{path}.env", backend["env"])
        if url_key is not None:
            backend["url"] = entry[url_key]
            self.sources[f"backends[{index}].url"] = f"{path}.{url_key}"
        self.sources[f"backends[{index}]"] = path
        self.sources[f"backends[{index}].name"] = path
        self.backends.append(backend)

        if "headers" in entry:
            if transport == "stdio":
                self.note(f"{path}.headers", "not used: a program the gateway starts takes no headers")
            else:
                self._header_auth(f"{path}.headers", entry["headers"], name)
        used = {*TYPE_KEYS, *PROCESS_KEYS, "headers", "disabled", url_key}
        for unused in entry:
            if unused not in used:
                self.note(path + _path_key(unused), UNUSED_KEYS.get(unused, "not used: the gateway has no such setting"))

    def _transport(self, path: str, entry: Mapping[str, Any], url_key: str | None) -> str | None:
        type_key = next((k for k in TYPE_KEYS if k in entry), None)
        if type_key is None:
            if "command" in entry:
                return "stdio"
            if url_key is not None:
                return "streamable-http"
            self.errors.append(f"{path}: needs command (a program to run) or url")
            return None
        kind = entry[type_key]
        if not isinstance(kind, str):
            self.errors.append(f"{path}.{type_key}: must be a string (stdio, http or sse)")
            return None
        transport = TRANSPORT_OF_TYPE.get(kind.lower().replace("-", "").replace("_", ""))
        if transport is None:
            self.note(f"{path}.{type_key}", f"{kind!r} is not a transport the gateway speaks (stdio, http, sse): "
                                            "not served")
        return transport

    def _uses_placeholders(self, path: str, entry: Mapping[str, Any], url_key: str | None) -> bool:
        """Notes each ${...} in what says which program or URL it is; such a server is not served."""
        places: list[tuple[str, Any]] = [(f"{path}.{key}", entry.get(key)) for key in ("command", "cwd", url_key)
                                         if key is not None]
        args = entry.get("args")
        if isinstance(args, list):
            places += [(f"{path}.args[{index}]", arg) for index, arg in enumerate(args)]
        found = False
        for where, value in places:
            if isinstance(value, str) and PLACEHOLDER.search(value):
                self.note(where, f"uses {_placeholders(value)}: {NOT_EXPANDED}; server not served")
                found = True
        return found

    def _env_without_placeholders(self, path: str, env: Mapping[str, Any]) -> dict[str, Any]:
        kept: dict[str, Any] = {}
        for variable, value in env.items():
            if isinstance(value, str) and PLACEHOLDER.search(value):
                self.note(path + _path_key(variable), f"uses {_placeholders(value)}: {NOT_EXPANDED}; left out of "
                                                      "the server's environment")
            else:
                kept[variable] = value
        return kept

    def _backend_name(self, path: str, key: str) -> str | None:
        problem = _name_problem(key)
        if problem is None:
            return key
        base = NOT_IN_A_BACKEND_NAME.sub("-", key).strip("-_")[:MAX_BACKEND_NAME]
        if not base:
            self.note(path, f"not served: the name {problem}, and no such name can be made of it")
            return None
        name, number = base, 1
        while name in self.taken:
            number += 1
            suffix = f"-{number}"
            name = base[:MAX_BACKEND_NAME - len(suffix)] + suffix
        self.taken.add(name)
        self.note(path, f"served as backend {name!r} (its tools' prefix): a backend name {problem}")
        return name

    def _header_auth(self, path: str, headers: Any, backend: str) -> None:
        if not isinstance(headers, Mapping):
            self.errors.append(f"{path}: must be an object of header name to value")
            return
        usable: dict[str, Any] = {}
        for header, value in headers.items():
            where = path + _path_key(header)
            reason = NOT_INJECTABLE_HEADERS.get(header.lower())
            if reason:
                self.note(where, f"not sent: {reason}")
            elif isinstance(value, str) and PLACEHOLDER.search(value):
                self.note(where, f"not sent: its value uses {_placeholders(value)}: {NOT_EXPANDED}")
            else:
                usable[header] = value
        if len(usable) > 1:
            self.note(path, f"not sent ({', '.join(usable)}): {ONE_HEADER}")
            return
        for header, value in usable.items():
            self.auth[backend] = {"type": "header_injection",
                                  "headerInjection": {"headerName": header, "headerValue": value}}
            injection = f"outgoingAuth.backends.{backend}.headerInjection"
            self.sources[f"outgoingAuth.backends.{backend}"] = path
            self.sources[f"{injection}.headerName"] = path
            self.sources[f"{injection}.headerValue"] = path + _path_key(header)


def _name_problem(name: str) -> str | None:
    """What the gateway's backend-name rule says of ``name``, or None when it passes."""
    try:
        _backend_name(name)
    except ValidationError as error:
        return str(error.messages[0])
    return None


def _placeholders(value: str) -> str:
    # Only the ${...} parts: the rest of the value may be a credential.
    return ", ".join(dict.fromkeys(PLACEHOLDER.findall(value)))


def _path_key(key: str) -> str:
    return f".{key}" if PLAIN_KEY.fullmatch(key) else f"[{json.dumps(key, ensure_ascii=False)}]"


def _name_from_file(where: str) -> str:
    # ".mcp.json" (Claude Code) is named "mcp".
    return PurePath(where).stem.lstrip(".") or "mcp-servers"


class _DuplicateKey(Exception):
    pass


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # json keeps the last of two equal keys without a word; a server would vanish.
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _DuplicateKey(key)
        result[key] = value
    return result


def _parse_json(text: str, where: str) -> Any:
    if not text.strip():
        raise ConfigError([f"{where}: the file is empty (expected a JSON object holding mcpServers)"])
    try:
        return json.loads(_without_comments(text), object_pairs_hook=_no_duplicate_keys)
    except json.JSONDecodeError as exc:  # the message never quotes the text: it may hold a secret
        raise ConfigError([f"{where}: not JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}"]) from None
    except _DuplicateKey as exc:
        raise ConfigError([f"{where}: the key {exc.args[0]!r} appears twice in one object"]) from None
    except RecursionError:
        raise ConfigError([f"{where}: nested too deeply"]) from None


def _without_comments(text: str) -> str:
    """VS Code's mcp.json is JSON with comments: ``//`` and ``/* */`` comments and trailing
    commas become spaces, so json's line and column numbers still point into the file."""
    out = list(text)
    position, end_of_text = 0, len(text)
    trailing_candidate: int | None = None  # a comma that a closing bracket would make trailing
    while position < end_of_text:
        char = text[position]
        if char == '"':
            position += 1
            while position < end_of_text and text[position] != '"':
                position += 2 if text[position] == "\\" else 1
            trailing_candidate = None
        elif text.startswith("//", position) or text.startswith("/*", position):
            line_comment = text[position + 1] == "/"
            end = text.find("\n" if line_comment else "*/", position + 2)
            end = end_of_text if end < 0 else end + (0 if line_comment else 2)
            for index in range(position, end):
                if out[index] not in "\r\n":
                    out[index] = " "
            position = end
            continue
        elif char == ",":
            trailing_candidate = position
        elif char in "}]" and trailing_candidate is not None:
            out[trailing_candidate] = " "
            trailing_candidate = None
        elif not char.isspace():
            trailing_candidate = None
        position += 1
    return "".join(out)
