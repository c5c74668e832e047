"""Process backends when a user's requests land on different gateway processes (issue 23,
item 8): two ``vmcp-actors serve`` processes behind a round-robin balancer with no sticky
routing, and 2026-07-28 requests (each may land on either). Each process runs its own
children: a ``shared`` backend is another process on each; a ``perUser`` backend is
another process per person on each, with the same ``{user}`` digest, so the same files."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.idp import LocalIdP
from tests.integration.test_modern import answer, modern_post
from tests.integration.test_two_processes import two_gateways  # noqa: F401 - the fixture

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120), pytest.mark.filterwarnings("ignore::DeprecationWarning")]

AUDIENCE = "vmcp"
SERVER = textwrap.dedent('''
    import os, uuid
    from mcp.server.mcpserver import MCPServer
    srv = MCPServer("notes")
    PROCESS = uuid.uuid4().hex  # not its pid: in its sandbox, every child is pid 2

    @srv.tool()
    def whoami() -> str:
        """This process and the user it was started for."""
        return f"{PROCESS} {os.environ.get('PERSON', '-')}"

    @srv.tool()
    def note(text: str) -> str:
        """Append a line to this user's notes."""
        with open(os.environ["NOTES"], "a", encoding="utf-8") as notes:
            notes.write(text + "\\n")
        return "noted"

    @srv.tool()
    def notes() -> str:
        """This user's notes."""
        try:
            with open(os.environ["NOTES"], encoding="utf-8") as notes:
                return notes.read().strip()
        except FileNotFoundError:
            return ""

    srv.run("stdio")
''')


@pytest.fixture
def idp():
    provider = LocalIdP("workers-idp").start()
    yield provider
    provider.stop()


def call(url: str, token: str, tool: str, arguments: dict | None = None) -> str:
    response = modern_post(url, "tools/call", {"name": tool, "arguments": arguments or {}},
                           headers={"Authorization": f"Bearer {token}"})
    result = answer(response)["result"]
    assert not result.get("isError"), result
    return result["content"][0]["text"]


def test_each_process_runs_its_own_children_and_a_person_keeps_their_files(two_gateways, idp, tmp_path: Path):  # noqa: F811
    script = tmp_path / "notes_server.py"
    script.write_text(SERVER, encoding="utf-8")
    notes_dir = tmp_path / "notes"
    notes_dir.mkdir()
    stdio: dict[str, Any] = {"transport": "stdio", "command": sys.executable, "args": [str(script)]}
    balancer = two_gateways({
        "name": "gw",
        "incomingAuth": {"type": "oidc", "oidc": {"issuer": idp.issuer, "audience": AUDIENCE}},
        "backends": [
            {"name": "common", **stdio, "env": {"NOTES": str(notes_dir / "common.txt")}},
            {"name": "mine", **stdio, "scope": "perUser",
             "env": {"PERSON": "{user}", "NOTES": str(notes_dir / "{user}.txt")}}]})
    alice, bob = (idp.issue_token(person, AUDIENCE) for person in ("alice", "bob"))

    # shared: one child per process, serving everyone that lands there
    shared = [call(balancer.url, token, "common_whoami").split()[0] for token in (alice, bob, alice, bob)]
    assert len(set(shared)) == 2, shared

    # perUser: one child per person per process, each started with the person's digest
    seen = {name: [call(balancer.url, token, "mine_whoami").split() for _ in range(2)]
            for name, token in (("alice", alice), ("bob", bob))}
    for name, answers in seen.items():
        pids, digests = {pid for pid, _ in answers}, {digest for _, digest in answers}
        assert len(pids) == 2 and len(digests) == 1, (name, answers)  # two processes, one person
    assert seen["alice"][0][1] != seen["bob"][0][1]
    assert not {pid for pid, _ in seen["alice"]} & {pid for pid, _ in seen["bob"]}

    # the same {user} paths: what alice wrote through one process, the other reads
    landed = len(balancer.landed)
    assert call(balancer.url, alice, "mine_note", {"text": "first"}) == "noted"
    assert call(balancer.url, alice, "mine_note", {"text": "second"}) == "noted"
    assert len(set(balancer.landed[landed:])) == 2  # the two notes went through different processes
    assert call(balancer.url, alice, "mine_notes") == "first\nsecond"
    assert call(balancer.url, alice, "mine_notes") == "first\nsecond"  # and from the other process
    assert call(balancer.url, bob, "mine_notes") == ""
    # bob's {user} path is a link to nothing: he wrote no note
    assert sorted(path.name for path in notes_dir.iterdir() if path.name != ".vmcp-sandbox" and path.exists()) == \
        [f"{seen['alice'][0][1]}.txt"]
