"""What a stdio child was given never reaches the gateway's log (issue 35): a literal
``env`` value (where mcpServers files put API keys) echoed on the child's stderr is logged
as ``[redacted]``, and so is the admin state's last stderr line."""

from __future__ import annotations

import logging
import sys
import textwrap

import pytest

from tests.gateway import admin_get, wait_until

pytestmark = [pytest.mark.timeout(60)]

API_KEY = "sk-live-0123456789abcdef"

# Says its key on stderr, then serves initialize and an empty tools/list over stdio.
TALKATIVE = textwrap.dedent("""
    import json, os, sys
    print("starting with key " + os.environ["API_KEY"] + " and level " + os.environ["LEVEL"], file=sys.stderr,
          flush=True)
    for line in sys.stdin:
        message = json.loads(line)
        if "id" not in message:
            continue
        if message["method"] == "initialize":
            result = {"protocolVersion": message["params"]["protocolVersion"], "capabilities": {"tools": {}},
                      "serverInfo": {"name": "talkative", "version": "1"}}
        else:
            result = {"tools": []}
        print(json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result}), flush=True)
""")


def test_a_literal_env_secret_echoed_on_stderr_is_never_logged(start_gateway, tmp_path, caplog, monkeypatch):
    caplog.set_level(logging.INFO, logger="vmcp_actors")
    monkeypatch.setenv("SECRETS_ADMIN_TOKEN", "secrets-admin-token")
    script = tmp_path / "talkative.py"
    script.write_text(TALKATIVE, encoding="utf-8")
    gateway = start_gateway({"name": "t", "admin": {"tokenEnv": "SECRETS_ADMIN_TOKEN"}, "backends": [
        {"name": "talk", "transport": "stdio", "command": sys.executable, "args": [str(script)],
         "env": {"API_KEY": API_KEY, "LEVEL": "info"}}]})
    session = gateway.initialize()
    assert "result" in gateway.rpc(session, "tools/list")

    def said() -> list[str]:
        return [record.getMessage() for record in caplog.records if "starting with key" in record.getMessage()]

    assert wait_until(said, timeout=20), "the child's stderr line was not logged"
    assert "[redacted]" in said()[0] and "level info" in said()[0]  # a short value stays readable
    assert not any(API_KEY in record.getMessage() for record in caplog.records)
    state = admin_get(gateway, token="secrets-admin-token").text
    assert API_KEY not in state and "[redacted]" in state
