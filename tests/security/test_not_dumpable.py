"""A gateway worker is non-dumpable (issue 35): a process of the same user, such as a stdio
child, can no longer read its /proc/<pid>/environ or memory, nor attach to it. (The
suite runs as root, who reads /proc regardless: what is checked is the flag itself, and
that a child does not inherit it.)"""

from __future__ import annotations

import ctypes
import subprocess
import sys

import pytest

from tests.gateway import backend_entry

pytestmark = [pytest.mark.timeout(60), pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux prctl")]

PR_GET_DUMPABLE = 3


def dumpable() -> int:
    return ctypes.CDLL(None, use_errno=True).prctl(PR_GET_DUMPABLE, 0, 0, 0, 0)


def test_the_worker_is_not_dumpable_and_its_children_start_dumpable(start_gateway):
    start_gateway({"name": "t", "backends": [backend_entry("x", type("Served", (), {"url": "http://127.0.0.1:9"}))]})
    assert dumpable() == 0
    child = subprocess.run([sys.executable, "-c", "import ctypes; print(ctypes.CDLL(None).prctl(3, 0, 0, 0, 0))"],
                           capture_output=True, text=True, timeout=30, check=True)
    assert child.stdout.strip() == "1"  # exec resets it: a child's own /proc stays its own
