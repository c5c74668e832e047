"""The hang-up watcher: a client that closes its connection while its answer is pending
is told apart from one that is waiting or one that sends more."""

from __future__ import annotations

import socket
import threading

import pytest

from vmcp_actors.web._hangups import Hangups, request_socket


@pytest.fixture
def hangups():
    watcher = Hangups()
    yield watcher
    watcher.stop()


@pytest.fixture
def connection():
    """(the server's end, the client's end) of a loopback TCP connection."""
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    server, _ = listener.accept()
    listener.close()
    yield server, client
    server.close()
    client.close()


def test_a_client_that_closes_is_told(hangups, connection):
    server, client = connection
    told = threading.Event()
    hangups.watch(server, told.set)
    assert not told.wait(0.2), "a waiting client is not a hang-up"
    client.close()
    assert told.wait(2.0)
    assert hangups.count() == 0


def test_a_reset_connection_is_a_hang_up(hangups, connection):
    server, client = connection
    told = threading.Event()
    hangups.watch(server, told.set)
    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    client.close()  # linger 0: an RST, not a FIN
    assert told.wait(2.0)


def test_an_unwatched_socket_is_not_told(hangups, connection):
    server, client = connection
    told = threading.Event()
    unwatch = hangups.watch(server, told.set)
    unwatch()
    client.close()
    assert not told.wait(0.3)
    assert hangups.count() == 0


def test_a_client_sending_more_is_no_longer_watched_and_its_bytes_stay(hangups, connection):
    server, client = connection
    told = threading.Event()
    hangups.watch(server, told.set)
    client.sendall(b"GET / HTTP/1.1\r\n")
    for _ in range(50):
        if hangups.count() == 0:
            break
        threading.Event().wait(0.02)
    assert hangups.count() == 0
    client.close()
    assert not told.wait(0.3)
    assert server.recv(64) == b"GET / HTTP/1.1\r\n", "peeking must not consume what the client sent"


def test_many_sockets_each_told_once(hangups):
    listener = socket.create_server(("127.0.0.1", 0))
    pairs, told = [], [threading.Event() for _ in range(20)]
    for event in told:
        client = socket.create_connection(listener.getsockname())
        server, _ = listener.accept()
        hangups.watch(server, event.set)
        pairs.append((server, client))
    listener.close()
    for _, client in pairs[::2]:
        client.close()
    assert all(event.wait(2.0) for event in told[::2])
    assert not any(event.is_set() for event in told[1::2])
    assert hangups.count() == 10
    for server, client in pairs:
        server.close()
        client.close()


def test_what_cannot_be_watched_is_not(hangups):
    assert hangups.watch(None, lambda: None)() is None
    assert request_socket({}) is None
    assert request_socket({"werkzeug.socket": "not a socket"}) is None
