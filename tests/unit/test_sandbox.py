"""The stdio sandbox (issue 35): its config, the clear error where bubblewrap cannot run,
and what a child started by ``launch`` can and cannot reach (run here with bwrap directly,
no gateway: tests/security/test_hostile_stdio.py runs a hostile server through one)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from vmcp_actors.backends import _sandbox
from vmcp_actors.config import config_from_mapping, load_config
from vmcp_actors.exceptions import ConfigError
from vmcp_actors.runtime import start_runtime


def _backend(**fields):
    return config_from_mapping({"name": "t", "backends": [
        {"name": "tool", "transport": "stdio", "command": sys.executable, **fields}]}).backends[0]


def _run(backend, code: str, user: str | None = None, **env: str) -> subprocess.CompletedProcess:
    argv, environment = _sandbox.launch(backend, [sys.executable, "-c", code], {"PATH": "/usr/bin:/bin", **env},
                                        None, user)
    return subprocess.run(argv, env=environment, capture_output=True, text=True, timeout=30, check=False)


def test_the_sandbox_is_the_default_and_its_config_errors_name_the_field():
    assert _backend().sandbox.enabled and _backend().sandbox.network
    with pytest.raises(ConfigError) as failed:
        config_from_mapping({"name": "t", "backends": [{
            "name": "tool", "transport": "stdio", "command": "x",
            "sandbox": {"mode": "docker", "writable": ["relative", "/data/{user}"], "hidden": ["~/.ssh"]}}]})
    assert set(failed.value.errors) == {
        "backends[0].sandbox.mode: must be one of bubblewrap, none",
        "backends[0].sandbox.writable[0]: must be an absolute path (starting with /)",
        "backends[0].sandbox.writable[1]: only a scope: perUser or perSession backend can use {user} "
        "(a shared process serves every user)",
        "backends[0].sandbox.hidden[0]: must be an absolute path (starting with /)"}
    with pytest.raises(ConfigError) as http:
        config_from_mapping({"name": "t", "backends": [{"name": "web", "url": "http://127.0.0.1:1/mcp",
                                                        "sandbox": {"mode": "none"}}]})
    assert "backends[0].sandbox: is for transport stdio only" in str(http.value)


def test_a_gateway_whose_sandbox_cannot_run_refuses_to_start_and_says_why(monkeypatch):
    monkeypatch.setattr(_sandbox.shutil, "which", lambda name, path=None: None)
    _sandbox.bubblewrap_works.cache_clear()
    try:
        config = config_from_mapping({"name": "t", "backends": [
            {"name": "open", "transport": "stdio", "command": "x", "sandbox": {"mode": "none"}},
            {"name": "boxed", "transport": "stdio", "command": "x"}]})
        with pytest.raises(ConfigError) as refused:
            start_runtime(config)
    finally:
        _sandbox.bubblewrap_works.cache_clear()
    (line,) = refused.value.errors
    assert line.startswith("backends[1].sandbox.mode: bubblewrap (bwrap) is not installed")
    assert "apt-get install bubblewrap" in line and "sandbox.mode: none" in line and "'boxed'" in line


def test_unsandboxed_children_get_their_death_signal_from_setpriv_not_preexec_fn():
    argv, _env = _sandbox.launch(_backend(sandbox={"mode": "none"}), ["/bin/true"], {}, None, None)
    assert argv[:4] == [_sandbox.shutil.which("setpriv"), "--pdeathsig", "KILL", "--"] and argv[4:] == ["/bin/true"]
    sandboxed, _env = _sandbox.launch(_backend(), ["/bin/true"], {}, None, None)
    assert "--die-with-parent" in sandboxed and "--cap-drop" in sandboxed and sandboxed[-2:] == ["--", "/bin/true"]


def test_a_sandboxed_child_sees_its_own_processes_only_and_a_private_tmp(tmp_path):
    left = tmp_path / "left-by-the-gateway"
    left.write_text("x")
    done = _run(_backend(), "import os; print([p for p in os.listdir('/proc') if p.isdigit()]); "
                            f"print(os.path.exists({str(left)!r})); print(os.environ['HOME']); "
                            "open('/tmp/home/mine', 'w').write('ok'); print(os.listdir('/tmp/home'))")
    assert done.returncode == 0, done.stderr
    pids, seen, home, own = done.stdout.splitlines()
    assert len(eval(pids)) <= 3  # bwrap's init, the child (and its listing)  # noqa: S307 - our own output
    assert seen == "False" and home == "/tmp/home" and own == "['mine']"
    assert not (Path("/tmp/home") / "mine").exists()  # its /tmp is its own


def test_the_config_files_and_credentials_are_hidden_and_other_users_files_unseen(tmp_path, monkeypatch):
    place = Path("/var/tmp") / f"vmcp-sandbox-unit-{tmp_path.name}"
    try:
        (place / "users" / "someone-else").mkdir(parents=True)
        (place / "users" / "someone-else" / "secret").write_text("not yours")
        (place / "home" / ".ssh").mkdir(parents=True)
        (place / "home" / ".ssh" / "id_rsa").write_text("private key")
        config = place / "config.yaml"
        config.write_text("name: t\nbackends: [{name: b, url: 'http://127.0.0.1:1/mcp'}]\n")
        load_config(config)
        monkeypatch.setenv("HOME", str(place / "home"))
        backend = _backend(scope="perUser", env={"DATA": f"{place}/users/{{user}}"})
        done = _run(backend, "import os\nd = os.environ['DATA']; open(d + '/mine', 'w').write('ok')\n"
                             f"print(os.listdir({str(place / 'users')!r}))\n"
                             f"try:\n    print(open({str(config)!r}).read())\nexcept OSError:\n    print('unreadable')\n"
                             f"print(os.listdir({str(place / 'home' / '.ssh')!r}))",
                    user="me", DATA=f"{place}/users/me")
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines() == ["['me']", "unreadable", "[]"]
        assert (place / "users" / "me" / "mine").read_text() == "ok"  # its own, written through
    finally:
        subprocess.run(["rm", "-rf", str(place)], check=False)


@pytest.mark.parametrize("network", [True, False])
def test_network_false_leaves_a_child_no_way_to_the_gateways_loopback(network):
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    try:
        done = _run(_backend(sandbox={"network": network}),
                    f"import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), 5).close(); print('reached')\n"
                    "except OSError:\n    print('refused')")
    finally:
        listener.close()
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ("reached" if network else "refused")


def test_a_command_installed_under_tmp_runs_in_its_sandbox(tmp_path):
    """A virtualenv under /tmp (a CI checkout, say): its prefix stays visible, read-only,
    though every sandbox has a /tmp of its own."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    (venv / "module_here.py").write_text("print('from the venv')")
    argv, environment = _sandbox.launch(_backend(), [str(venv / "bin" / "python"), str(venv / "module_here.py")],
                                        {"PATH": "/usr/bin:/bin"}, None, None)
    done = subprocess.run(argv, env=environment, capture_output=True, text=True, timeout=30, check=False)
    assert (done.returncode, done.stdout.strip()) == (0, "from the venv"), done.stderr
    argv, environment = _sandbox.launch(_backend(), [str(venv / "bin" / "python"), "-c",
                                                     f"open({str(venv / 'x')!r}, 'w')"], {"PATH": "/usr/bin:/bin"},
                                        None, None)
    written = subprocess.run(argv, env=environment, capture_output=True, text=True, timeout=30, check=False)
    assert written.returncode != 0 and "Read-only file system" in written.stderr  # seen, not writable


def test_what_env_and_args_name_never_makes_the_root_or_devices_writable():
    backend = _backend(env={"DATA": "/", "SINK": "/dev/null"}, args=["/"])
    argv, _env = _sandbox.launch(backend, [sys.executable, "/"], {"DATA": "/", "SINK": "/dev/null"}, None, None)
    binds = [argv[index + 1] for index, word in enumerate(argv) if word == "--bind"]
    assert binds == [], binds
    done = _run(backend, "open('/etc/x', 'w')", DATA="/", SINK="/dev/null")
    assert done.returncode != 0 and "Read-only file system" in done.stderr


def test_a_config_file_inside_a_visible_checkout_under_tmp_stays_hidden(tmp_path):
    checkout = tmp_path / "checkout"
    venv = checkout / ".venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    config = checkout / "config.yaml"
    config.write_text("name: t\nbackends: [{name: b, url: 'http://127.0.0.1:1/mcp'}]\n")
    load_config(config)
    argv, environment = _sandbox.launch(_backend(cwd=str(checkout)), [
        str(venv / "bin" / "python"), "-c",
        f"import os\ntry:\n    print(open({str(config)!r}).read())\nexcept OSError:\n    print('unreadable')\n"
        f"print(os.path.isdir({str(venv)!r}))"], {"PATH": "/usr/bin:/bin"}, str(checkout), None)
    done = subprocess.run(argv, env=environment, capture_output=True, text=True, timeout=30, check=False)
    assert done.stdout.splitlines() == ["unreadable", "True"], done.stderr
