"""Every spawn has a timeout (issue 35): a start whose child the spawner thread has not
forked in time fails (the backend is reported unavailable, not waited on forever), and a
child it forks after that is killed and reaped, never left running unread."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from tests.gateway import wait_until
from vmcp_actors.backends import _stdio


def test_a_spawn_not_done_in_time_fails_and_its_late_child_is_killed(monkeypatch):
    monkeypatch.setattr(_stdio, "SPAWN_TIMEOUT", 0.2)
    go = threading.Event()
    started: list[subprocess.Popen] = []
    real_popen = subprocess.Popen

    def slow_popen(*args, **kwargs):  # the spawner thread busy with something else
        go.wait(30)
        started.append(real_popen(*args, **kwargs))
        return started[-1]

    monkeypatch.setattr(_stdio.subprocess, "Popen", slow_popen)
    spawner = _stdio._Spawner()
    with pytest.raises(TimeoutError):
        spawner.popen([sys.executable, "-c", "import time; time.sleep(60)"], {}, None)
    go.set()
    assert wait_until(lambda: started and started[0].poll() is not None, timeout=20), "the late child still runs"
