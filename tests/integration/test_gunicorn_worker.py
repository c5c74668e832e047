"""The gateway's gunicorn worker (vmcp_actors.web.worker) under real gunicorn: many
kept-alive clients over few threads are all answered, each on its own connection, while
threads linger on connections and hand them back to the poller."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import requests

from tests.gateway import wait_until
from tests.ports import free_port

APP = '''
def app(environ, start_response):
    body = ("%s %s" % (environ["REMOTE_PORT"], environ["PATH_INFO"])).encode()
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]
'''
CLIENTS = 6
REQUESTS_EACH = 40


def test_more_kept_alive_clients_than_threads_are_all_answered_on_their_own_connections(tmp_path: Path):
    (tmp_path / "tiny_app.py").write_text(APP)
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "--chdir", str(tmp_path), "--bind", f"127.0.0.1:{port}",
         "--worker-class", "vmcp_actors.web.worker.LingeringThreadWorker", "--threads", "2", "--keep-alive", "30",
         "--graceful-timeout", "5", "tiny_app:app"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_until(lambda: _answers(base), timeout=30)
        ports: dict[int, set[str]] = {}
        failures: list[str] = []

        def client(number: int) -> None:
            with requests.Session() as http:
                seen = ports.setdefault(number, set())
                for n in range(REQUESTS_EACH):
                    answer = http.get(f"{base}/c{number}/{n}", timeout=30)
                    port_seen, path = answer.text.split(" ", 1)
                    if path != f"/c{number}/{n}":
                        failures.append(f"client {number} asked /c{number}/{n}, got {path}")
                    seen.add(port_seen)

        threads = [threading.Thread(target=client, args=(n,)) for n in range(CLIENTS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert not any(thread.is_alive() for thread in threads), "a client was never answered"
        assert failures == []
        assert all(len(seen) == 1 for seen in ports.values()), f"a connection was dropped: {ports}"
        assert len({port for seen in ports.values() for port in seen}) == CLIENTS
    finally:
        server.terminate()
        _, stderr = server.communicate(timeout=30)
    assert "LingeringThreadWorker" in stderr and "Traceback" not in stderr, stderr[-2000:]


def _answers(base: str) -> bool:
    try:
        return requests.get(f"{base}/ready", timeout=2).ok
    except requests.RequestException:
        return False
