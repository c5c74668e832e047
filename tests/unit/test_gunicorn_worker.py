"""The gunicorn worker's rule for keeping a thread on a connection it just answered
(vmcp_actors.web.worker): on a real socket pair, with gunicorn's own connection object."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time

import pytest
from gunicorn.config import Config
from gunicorn.workers.gthread import TConn, ThreadWorker

from tests.gateway import wait_until
from vmcp_actors.web import worker as worker_module
from vmcp_actors.web.worker import LingeringThreadWorker

REQUEST = b"GET /healthz HTTP/1.1\r\nHost: gw\r\n\r\n"
LONG_LINGER = 5.0  # a refusal must come at once, far sooner than this


def make_worker(threads: int = 8) -> LingeringThreadWorker:
    cfg = Config()
    cfg.set("threads", threads)
    return LingeringThreadWorker(0, os.getppid(), [], None, 30, cfg, logging.getLogger("test-worker"))


@pytest.fixture
def pair():
    served, client = socket.socketpair()
    conn = TConn(make_worker().cfg, served, ("127.0.0.1", 50000), ("127.0.0.1", 8000))
    conn.init()  # as after its first request: blocking, with its HTTP parser
    yield conn, client
    served.close()
    client.close()


def came(worker: LingeringThreadWorker, conn: TConn) -> tuple[bool, float]:
    began = time.monotonic()
    result = worker._next_request_came(conn)
    assert (worker._lingering, worker._waiting) == (0, 0), "the counters are left as they were"
    return result, time.monotonic() - began


def test_a_request_already_sent_is_served_on_this_thread(pair):
    conn, client = pair
    client.sendall(REQUEST)
    assert came(make_worker(), conn)[0] is True


def test_a_request_read_ahead_into_the_parser_is_served_without_waiting(pair, monkeypatch):
    conn, _client = pair
    monkeypatch.setattr(worker_module, "LINGER", LONG_LINGER)
    conn.parser.unreader.unread(REQUEST)
    result, took = came(make_worker(), conn)
    assert result is True and took < LONG_LINGER / 2


def test_a_quiet_connection_goes_back_to_the_poller_after_the_linger(pair, monkeypatch):
    conn, _client = pair
    monkeypatch.setattr(worker_module, "LINGER", 0.02)
    result, took = came(make_worker(), conn)
    assert result is False and took >= 0.015


def test_a_client_that_hangs_up_while_the_thread_waits_ends_the_wait(pair, monkeypatch):
    conn, client = pair
    monkeypatch.setattr(worker_module, "LINGER", LONG_LINGER)
    client.close()  # readable with nothing to read: gunicorn's parser then closes the connection
    result, took = came(make_worker(), conn)
    assert result is True and took < LONG_LINGER / 2


@pytest.mark.parametrize("load", ["more requests wait than threads are free", "a quarter of the threads linger",
                                  "too few threads are free", "the worker is stopping"])
def test_no_linger_when_other_work_needs_the_thread(pair, monkeypatch, load):
    conn, _client = pair
    monkeypatch.setattr(worker_module, "LINGER", LONG_LINGER)
    worker = make_worker(threads=8)  # lingering at most 2, and only while at most 6 are busy
    if load == "more requests wait than threads are free":
        worker._waiting, worker._busy = 3, 6
    elif load == "a quarter of the threads linger":
        worker._lingering = 2
    elif load == "too few threads are free":
        worker._busy = 7
    else:
        worker.alive = False
    began = time.monotonic()
    assert worker._next_request_came(conn) is False
    assert time.monotonic() - began < LONG_LINGER / 2


def test_a_thread_lingers_while_the_pool_has_room(pair, monkeypatch):
    """The control of the test above: the same worker, below every limit, waits."""
    conn, _client = pair
    monkeypatch.setattr(worker_module, "LINGER", 0.02)
    worker = make_worker(threads=8)
    worker._lingering, worker._busy = 1, 6
    began = time.monotonic()
    assert worker._next_request_came(conn) is False
    assert time.monotonic() - began >= 0.015, "it waited its linger"
    assert worker._lingering == 1, "and gave its slot back"


def linger_in_thread(worker: LingeringThreadWorker, conn: TConn) -> tuple[threading.Thread, dict[str, object]]:
    outcome: dict[str, object] = {}

    def linger() -> None:
        began = time.monotonic()
        outcome["came"] = worker._next_request_came(conn)
        outcome["took"] = time.monotonic() - began

    lingering = threading.Thread(target=linger)
    lingering.start()
    wait_until(lambda: worker._lingering == 1, timeout=LONG_LINGER / 2)
    return lingering, outcome


def test_a_request_for_the_pool_when_no_thread_is_free_ends_a_linger_at_once(pair, monkeypatch):
    """Work that finds no free thread wakes a lingering one, which hands its own connection
    back (False) to take the work, instead of making it wait out the linger."""
    conn, _client = pair
    monkeypatch.setattr(worker_module, "LINGER", LONG_LINGER)
    monkeypatch.setattr(ThreadWorker, "enqueue_req", lambda self, conn: None)  # the pool itself is not under test
    worker = make_worker(threads=8)
    lingering, outcome = linger_in_thread(worker, conn)
    worker._busy = 8  # every thread is serving (or lingering on) a connection
    worker.enqueue_req(object())
    lingering.join(timeout=LONG_LINGER * 2)
    assert outcome["came"] is False and outcome["took"] < LONG_LINGER / 2
    assert (worker._lingering, worker._waiting, worker._to_wake) == (0, 1, {})
    worker._waiting, worker._busy = 0, 0
    monkeypatch.setattr(worker_module, "LINGER", 0.05)
    began = time.monotonic()
    assert worker._next_request_came(conn) is False
    assert time.monotonic() - began >= 0.04, "the next linger is not cut short by the old poke"


def test_a_request_for_the_pool_with_threads_free_leaves_a_linger_alone(pair, monkeypatch):
    """The control: a free thread takes the work, and the lingering one keeps waiting."""
    conn, _client = pair
    monkeypatch.setattr(worker_module, "LINGER", 0.3)
    monkeypatch.setattr(ThreadWorker, "enqueue_req", lambda self, conn: None)
    worker = make_worker(threads=8)
    lingering, outcome = linger_in_thread(worker, conn)
    worker.enqueue_req(object())
    lingering.join(timeout=LONG_LINGER)
    assert outcome["came"] is False and outcome["took"] >= 0.25
