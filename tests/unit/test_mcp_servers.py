"""Unit tests for reading a desktop client's mcpServers file into the gateway's config."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from vmcp_actors.config import BackendConfig, import_mcp_servers, read_mcp_servers
from vmcp_actors.exceptions import ConfigError

SECRET = "Bearer s3cret-value"


def write_json(path: Path, data: Any) -> Path:
    path.write_text(json.dumps(data))
    return path


def note_at(notes: tuple[str, ...], path: str) -> str:
    found = [note for note in notes if note.startswith(f"{path}: ")]
    assert len(found) == 1, f"expected one note at {path!r}: {notes}"
    return found[0]


def config_errors(data: Any) -> tuple[str, ...]:
    with pytest.raises(ConfigError) as raised:
        import_mcp_servers(data, "test").config()
    return raised.value.errors


CLAUDE_DESKTOP = {
    "mcpServers": {
        "files": {
            "command": "npx",
            "args": ["-y", "@modelcontextprotocol/server-filesystem", "/srv/shared"],
            "env": {"LOG_LEVEL": "info"},
            "cwd": "/srv",
        },
        "remote": {"url": "https://x.example.com/mcp"},
        "legacy": {"type": "sse", "url": "https://old.example.com/sse"},
        "windsurf": {"serverUrl": "https://w.example.com/mcp"},
    },
}


def test_claude_desktop_file_becomes_stdio_and_http_backends_named_after_the_file(tmp_path: Path) -> None:
    imported = read_mcp_servers(write_json(tmp_path / "claude_desktop_config.json", CLAUDE_DESKTOP))
    config = imported.config()

    assert config.name == "claude_desktop_config"
    assert imported.notes == ()
    assert config.backends == (
        BackendConfig(name="files", transport="stdio", command="npx",
                      args=("-y", "@modelcontextprotocol/server-filesystem", "/srv/shared"),
                      env={"LOG_LEVEL": "info"}, cwd="/srv", scope="perSession"),
        BackendConfig(name="remote", url="https://x.example.com/mcp", transport="streamable-http"),
        BackendConfig(name="legacy", url="https://old.example.com/sse", transport="sse"),
        BackendConfig(name="windsurf", url="https://w.example.com/mcp", transport="streamable-http"),
    )
    assert config.outgoing_auth.backends == {}


def test_a_dotted_file_name_names_the_gateway_without_its_dot(tmp_path: Path) -> None:
    imported = read_mcp_servers(write_json(tmp_path / ".mcp.json", CLAUDE_DESKTOP))
    assert imported.config().name == "mcp"
    assert read_mcp_servers(tmp_path / ".mcp.json", name="desk").config().name == "desk"


VS_CODE = """\
{
  // 💡 Inputs are prompted on first server start, then stored by VS Code.
  "inputs": [{"type": "promptString", "id": "api-key", "description": "API key", "password": true}],
  "servers": {
    "memory": {"type": "stdio", "command": "npx", "args": ["-y", "@modelcontextprotocol/server-memory"],
               "env": {"MEMORY_FILE": "/tmp/memory.json", "API_KEY": "${input:api-key}"}},
    "docs": {"type": "http", "url": "https://docs.example.com/mcp"},  /* a remote one */
    "old": {"type": "sse", "url": "https://old.example.com/sse"},
    "streamy": {"type": "streamableHttp", "url": "https://s.example.com/mcp"},
  },
}
"""


def test_vs_code_servers_with_types_comments_and_trailing_commas(tmp_path: Path) -> None:
    path = tmp_path / "mcp.json"
    path.write_text(VS_CODE, encoding="utf-8")
    imported = read_mcp_servers(path)
    backends = {backend.name: backend for backend in imported.config().backends}

    assert {name: backend.transport for name, backend in backends.items()} == {
        "memory": "stdio", "docs": "streamable-http", "old": "sse", "streamy": "streamable-http",
    }
    assert dict(backends["memory"].env) == {"MEMORY_FILE": "/tmp/memory.json"}
    assert "${input:api-key}" in note_at(imported.notes, "servers.memory.env.API_KEY")
    assert "not the servers' to read" in note_at(imported.notes, "servers.memory.env.API_KEY")
    assert "asks no one" in note_at(imported.notes, "inputs")


def test_one_header_becomes_the_backends_header_injection() -> None:
    imported = import_mcp_servers(
        {"mcpServers": {"github": {"url": "https://api.example.com/mcp", "headers": {"Authorization": SECRET}}}},
        "test")
    auth = imported.config().outgoing_auth.for_backend("github")

    assert auth.type == "header_injection"
    assert auth.header_injection is not None
    assert auth.header_injection.header_name == "Authorization"
    assert auth.header_injection.header_value == SECRET
    assert imported.notes == ()
    assert SECRET not in repr(imported)


def test_two_headers_are_not_sent_and_the_note_names_them_but_not_their_values() -> None:
    imported = import_mcp_servers(
        {"mcpServers": {"github": {"url": "https://api.example.com/mcp",
                                   "headers": {"Authorization": SECRET, "X-Tenant": "acme-tenant"}}}},
        "test")

    note = note_at(imported.notes, "mcpServers.github.headers")
    assert "Authorization" in note and "X-Tenant" in note and "one header per backend" in note
    assert SECRET not in note and "acme-tenant" not in note
    assert imported.config().outgoing_auth.backends == {}


def test_a_header_the_gateway_sets_itself_is_dropped_and_the_other_one_is_injected() -> None:
    imported = import_mcp_servers(
        {"mcpServers": {"api": {"url": "https://api.example.com/mcp",
                                "headers": {"Accept": "application/json", "X-Api-Key": "k-123"}}}},
        "test")

    assert "gateway sets it" in note_at(imported.notes, "mcpServers.api.headers.Accept")
    injection = imported.config().outgoing_auth.for_backend("api").header_injection
    assert injection is not None and injection.header_name == "X-Api-Key"


def test_a_header_value_with_a_placeholder_is_not_sent() -> None:
    imported = import_mcp_servers(
        {"servers": {"gh": {"type": "http", "url": "https://api.example.com/mcp",
                            "headers": {"Authorization": "Bearer ${env:GITHUB_TOKEN}"}}}},
        "test")

    assert "${env:GITHUB_TOKEN}" in note_at(imported.notes, "servers.gh.headers.Authorization")
    assert imported.config().outgoing_auth.backends == {}


def test_headers_on_a_program_are_noted_as_not_used() -> None:
    imported = import_mcp_servers({"mcpServers": {"p": {"command": "srv", "headers": {"X-A": "b"}}}}, "test")
    assert "takes no headers" in note_at(imported.notes, "mcpServers.p.headers")
    assert imported.config().outgoing_auth.backends == {}


def test_a_name_the_gateway_refuses_is_repaired_without_taking_a_name_the_file_uses() -> None:
    imported = import_mcp_servers(
        {"mcpServers": {"my server.v2": {"command": "a"}, "my-server-v2": {"command": "b"}, "…": {"command": "c"}}},
        "test")
    names = [backend.name for backend in imported.config().backends]

    assert names == ["my-server-v2-2", "my-server-v2"]
    assert "'my-server-v2-2'" in note_at(imported.notes, 'mcpServers["my server.v2"]')
    assert "1-63 letters" in note_at(imported.notes, 'mcpServers["my server.v2"]')
    assert "not served" in note_at(imported.notes, 'mcpServers["…"]')


def test_a_disabled_entry_is_skipped_with_a_note() -> None:
    imported = import_mcp_servers(
        {"mcpServers": {"on": {"command": "a"}, "off": {"command": "b", "disabled": True}}}, "test")

    assert [backend.name for backend in imported.config().backends] == ["on"]
    assert "disabled" in note_at(imported.notes, "mcpServers.off")


def test_a_placeholder_in_args_means_the_server_is_not_served() -> None:
    imported = import_mcp_servers(
        {"servers": {"fs": {"type": "stdio", "command": "npx", "args": ["-y", "fs", "${workspaceFolder}"]},
                     "ok": {"type": "stdio", "command": "srv"}}},
        "test")

    assert [backend.name for backend in imported.config().backends] == ["ok"]
    assert "${workspaceFolder}" in note_at(imported.notes, "servers.fs.args[2]")


def test_settings_of_the_desktop_client_and_unknown_types_are_noted() -> None:
    imported = import_mcp_servers(
        {"mcpServers": {"a": {"command": "srv", "autoApprove": ["x"], "envFile": ".env"},
                        "w": {"type": "websocket", "url": "wss://w.example.com"}},
         "globalShortcut": "Ctrl+Space"},
        "test")

    assert [backend.name for backend in imported.config().backends] == ["a"]
    assert "no such setting" in note_at(imported.notes, "mcpServers.a.autoApprove")
    assert "list the variables under env" in note_at(imported.notes, "mcpServers.a.envFile")
    assert "'websocket'" in note_at(imported.notes, "mcpServers.w.type")
    assert "only mcpServers" in note_at(imported.notes, "globalShortcut")


def test_what_the_gateway_refuses_is_reported_at_the_files_paths_without_values() -> None:
    errors = config_errors({"mcpServers": {
        "a": {"url": "ftp://files.example.com", "headers": {"Authorization": "Bearer s3cret\n"}},
        "b": {"type": "stdio", "args": ["x", 3]},
        "c": {"type": "http"},
    }})

    assert "mcpServers.a.url: must be an http(s) URL with a host" in errors
    assert any(line.startswith("mcpServers.a.headers.Authorization: must be printable ASCII") for line in errors)
    assert "mcpServers.b.command: is required for transport stdio" in errors
    assert "mcpServers.b.args[1]: must be a string" in errors
    assert "mcpServers.c.url: is required for transport streamable-http" in errors
    assert not any("s3cret" in line for line in errors)


def test_a_file_with_no_usable_server_is_not_a_valid_config() -> None:
    errors = config_errors({"mcpServers": {"off": {"command": "a", "disabled": True}}})
    assert errors == ("mcpServers: must list at least one backend",)


@pytest.mark.parametrize(("text", "expected"), [
    ('{"mcpServers": {"a": {"command": "x"}', "not JSON: Expecting ',' delimiter at line 1"),
    ("", "the file is empty"),
    ('{"tools": {}}', "has neither mcpServers (Claude Desktop, Cursor, Windsurf) nor servers (VS Code)"),
    ('{"mcpServers": {}, "servers": {}}', "has both mcpServers and servers"),
    ("[1, 2]", "must be a JSON object holding mcpServers"),
    ('{"mcpServers": {"a": {"command": "x"}, "a": {"command": "y"}}}', "the key 'a' appears twice"),
])
def test_a_file_that_is_not_an_mcp_servers_file_is_a_clear_error(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "servers.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as raised:
        read_mcp_servers(path)
    (line,) = raised.value.errors
    assert line.startswith(f"{path}: ")
    assert expected in line


@pytest.mark.parametrize(("data", "expected"), [
    ({"mcpServers": []}, "mcpServers: must be an object of server name to its settings"),
    ({"mcpServers": {"a": "npx x"}}, "mcpServers.a: must be an object (command and args, or url)"),
    ({"servers": {"a": {"env": {}}}}, "servers.a: needs command (a program to run) or url"),
    ({"servers": {"a": {"type": 3, "url": "https://x.example.com"}}}, "servers.a.type: must be a string"),
    ({"mcpServers": {"a": {"url": "https://x.example.com", "headers": ["A: b"]}}},
     "mcpServers.a.headers: must be an object of header name to value"),
])
def test_a_malformed_entry_is_an_error_at_its_path(data: Any, expected: str) -> None:
    with pytest.raises(ConfigError) as raised:
        import_mcp_servers(data, "test")
    assert any(line.startswith(expected) for line in raised.value.errors), raised.value.errors


def test_a_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        read_mcp_servers(tmp_path / "nowhere.json")


def test_comment_markers_inside_strings_are_kept(tmp_path: Path) -> None:
    path = write_json(tmp_path / "m.json", {"mcpServers": {"a": {"command": "srv", "args": ["//x", "/*y*/", "a,]"]}}})
    assert read_mcp_servers(path).config().backends[0].args == ("//x", "/*y*/", "a,]")


def test_an_entrys_scope_chooses_how_its_process_is_shared(tmp_path: Path) -> None:
    """A file's stdio server gets a process per client session unless its entry says otherwise."""
    imported = read_mcp_servers(write_json(tmp_path / "mcp.json", {"mcpServers": {
        "own": {"command": "npx"}, "team": {"command": "npx", "scope": "shared"},
        "mine": {"command": "npx", "scope": "perUser"}}}))

    assert {backend.name: backend.scope for backend in imported.config().backends} == \
        {"own": "perSession", "team": "shared", "mine": "perUser"}
    assert imported.notes == ()
