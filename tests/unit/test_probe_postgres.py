"""The PostgreSQL readiness probe speaks the wire protocol itself: check it against a fake server."""

from __future__ import annotations

import socket
import struct
import threading

import pytest

from tests.services import _probe as probe  # the probe file, loaded once


def _message(kind: bytes, body: bytes) -> bytes:
    return kind + struct.pack("!I", 4 + len(body)) + body


def _serve(replies: list[bytes]) -> str:
    """A one-connection server on loopback that answers each client message with the next reply."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def answer() -> None:
        connection, _ = listener.accept()
        with connection, listener:
            for reply in replies:
                connection.recv(65536)
                connection.sendall(reply)
            connection.recv(65536)  # the client's Terminate, or its close

    threading.Thread(target=answer, daemon=True).start()
    return f"127.0.0.1:{port}"


READY = _message(b"Z", b"I")


def test_a_trusting_server_answers_with_its_version() -> None:
    # given a server that trusts the client and answers the query with one row
    version = b"PostgreSQL 15.8 (Debian 15.8-0+deb12u1) on x86_64"
    startup = (_message(b"R", struct.pack("!I", 0)) + _message(b"S", b"server_version\x0015.8\x00")
               + _message(b"K", struct.pack("!II", 1, 2)) + READY)
    row = _message(b"D", struct.pack("!Hi", 1, len(version)) + version)
    query = _message(b"T", b"...") + row + _message(b"C", b"SELECT 1\x00") + READY
    address = _serve([startup, query])
    # when probed, then the line names the server and its version
    assert probe.probe_postgres(address) == f"postgres {address}: PostgreSQL 15.8"


def test_a_server_that_wants_a_password_is_not_ready() -> None:
    # the server then waits for the password: the probe must not wait with it
    address = _serve([_message(b"R", struct.pack("!I", 10) + b"SCRAM-SHA-256\x00\x00")])
    with pytest.raises(RuntimeError, match="password"):
        probe.probe_postgres(address)


def test_a_server_still_starting_reports_its_error() -> None:
    error = b"SFATAL\x00C57P03\x00Mthe database system is starting up\x00\x00"
    address = _serve([_message(b"E", error)])
    with pytest.raises(RuntimeError, match="starting up"):
        probe.probe_postgres(address)
