"""The shape the code keeps: packages named by role import only downwards, loading a
config starts no runtime, and the composition root reads secrets with their field paths."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from vmcp_actors.config import config_from_mapping
from vmcp_actors.exceptions import ConfigError

PACKAGE = Path(__file__).resolve().parents[2] / "vmcp_actors"

# Lower ranks never import higher ones (imports inside functions, which run only when
# called, are the library API's way to reach the runtime and are not counted).
RANKS = {
    "protocol": 0, "exceptions": 0, "identity": 0, "signing": 0, "concurrency": 0, "pooled": 0,
    "metrics": 0, "shared_cache": 0, "__init__": 0,
    "config": 1, "workflows": 1,
    "codemode": 2,  # the script sandbox: config, metrics and protocol only
    "workflows.engine": 2, "tracing": 2, "backends": 2, "limits": 2,
    "core": 3,
    "decorators": 4,
    "users": 5,
    "edge": 6, "oauth": 6,  # the authorization server checks tokens as edge's authenticators do
    "runtime": 7,
    "web": 8,
    "cli": 9, "demo": 9,
}


def _rank(module: str) -> int:
    parts = module.split(".")[1:]  # without "vmcp_actors"
    if parts[:2] == ["workflows", "engine"]:
        return RANKS["workflows.engine"]
    return RANKS[parts[0] if parts else "__init__"]


def _module_of(path: Path) -> str:
    relative = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(relative.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _top_level_imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    found = []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("vmcp_actors"):
            found.append(node.module)
        elif isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names if alias.name.startswith("vmcp_actors"))
    return found


def test_packages_import_only_downwards():
    upward = []
    for path in PACKAGE.rglob("*.py"):
        module = _module_of(path)
        for imported in _top_level_imports(path):
            if imported != "vmcp_actors" and _rank(imported) > _rank(module):
                upward.append(f"{module} imports {imported}")
    assert upward == []


def test_loading_a_config_imports_no_runtime():
    code = ("import sys, vmcp_actors.config as c; "
            "c.config_from_mapping({'name': 'x', 'backends': [{'name': 'a', 'url': 'http://127.0.0.1:1/mcp'}], "
            "'compositeTools': [{'name': 'w', 'description': 'd', 'steps': [{'id': 's', 'tool': 'a.t'}]}]}); "
            "print(sorted(m for m in ('pykka', 'flask', 'requests', 'gunicorn', 'werkzeug') if m in sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "[]", loaded.stderr


@pytest.mark.parametrize("section, field", [
    ({"admin": {"tokenEnv": "VMCP_TEST_UNSET_ADMIN"}}, "admin.tokenEnv"),
    ({"admin": {"tokenEnv": "VMCP_TEST_SET_ADMIN", "metricsTokenEnv": "VMCP_TEST_UNSET_METRICS"}},
     "admin.metricsTokenEnv"),
])
def test_the_runtime_names_the_field_of_a_secret_that_is_not_set(monkeypatch, section, field):
    """The composition root reads its own secrets with their field paths: it does not rely
    on another module (outgoing auth) having checked the same variables first."""
    from vmcp_actors import runtime
    from vmcp_actors.runtime import start_runtime

    monkeypatch.setattr(runtime, "build_outgoing_auth", lambda config, cache: {})

    monkeypatch.delenv("VMCP_TEST_UNSET_ADMIN", raising=False)
    monkeypatch.delenv("VMCP_TEST_UNSET_METRICS", raising=False)
    monkeypatch.setenv("VMCP_TEST_SET_ADMIN", "a-long-enough-admin-token")
    config = config_from_mapping({"name": "x", "backends": [{"name": "a", "url": "http://127.0.0.1:1/mcp"}],
                                  **section})
    with pytest.raises(ConfigError) as refused:
        start_runtime(config).stop()
    assert any(problem.startswith(f"{field}:") for problem in refused.value.errors), refused.value.errors
