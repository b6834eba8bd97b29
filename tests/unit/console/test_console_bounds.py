"""The console's bounds against a client that is not its page: a body's length checked, and
a change's session, before any body is read; a Host that is not the console's refused (DNS
rebinding); idle sockets timed out; connections capped. The rules are
``common/format/boundary.py``'s."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest
from helpers.brokers import free_port

from common.client import Admin
from common.console import server as console_server
from common.console.actions import Actions
from common.console.collector import Collector
from common.console.server import Console
from common.format.boundary import content_length_refusal, host_refusal

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

PASSWORD = "correct horse battery"


def make_console(**options: object) -> Console:
    admin = Admin([f"127.0.0.1:{free_port()}"], timeout_ms=500, retries=0)  # no broker
    console = Console(Collector(admin, 30), Actions(admin), "127.0.0.1", 0, PASSWORD,
                      **options)  # type: ignore[arg-type]
    console.start()
    return console


@pytest.fixture
def console() -> Iterator[Console]:
    c = make_console(allowed_hosts=["console.internal"])
    yield c
    c.stop()
    c.actions.close()
    c.collector.admin.close()


def connect(console: Console) -> socket.socket:
    host, port = console.address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=5)
    return sock


def answer(sock: socket.socket) -> bytes:
    """What the console answers, its headers and body (by its Content-Length), within 5 s."""
    got = b""
    while b"\r\n\r\n" not in got:
        chunk = sock.recv(4096)
        if not chunk:
            return got
        got += chunk
    head, _, body = got.partition(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    while len(body) < length and (chunk := sock.recv(4096)):
        body += chunk
    return head + b"\r\n\r\n" + body


def status_of(raw: bytes) -> int:
    return int(raw.split(b" ", 2)[1])


def test_the_rules() -> None:
    assert content_length_refusal("-1", 100) is not None
    assert content_length_refusal(None, 100) is not None
    assert content_length_refusal("1e3", 100) is not None
    assert content_length_refusal("101", 100) is not None
    assert content_length_refusal(" 100", 100) is None
    names = frozenset({"localhost", "console.internal"})
    for ok in ("localhost", "LOCALHOST:8080", "127.0.0.1:8080", "[::1]:80", "console.internal",
               "10.1.2.3"):
        assert host_refusal(ok, names) is None, ok
    for bad in ("evil.example", "evil.example:8080", "127.0.0.1.evil.example", "", None):
        assert host_refusal(bad, names) is not None, bad


def test_a_negative_length_is_refused_before_the_body_is_read(console: Console) -> None:
    with connect(console) as sock:
        sock.sendall(b"POST /api/login HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     b"Content-Length: -1\r\n\r\n" + b"x" * 65536)
        raw = answer(sock)  # the stream still open: a read to the end would never answer
    assert status_of(raw) == 400 and b"not a length" in raw


def test_a_change_without_a_session_is_refused_before_its_body(console: Console) -> None:
    with connect(console) as sock:
        sock.sendall(b"POST /api/topics HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     b"Content-Length: 60000\r\n\r\n")  # the body never comes
        raw = answer(sock)
    assert status_of(raw) == 403 and b"log in" in raw


def test_an_oversized_or_missing_length_is_refused(console: Console) -> None:
    for head, status in ((b"Content-Length: 1000000", 413), (b"", 411),
                         (b"Transfer-Encoding: chunked", 411)):
        with connect(console) as sock:
            sock.sendall(b"POST /api/login HTTP/1.1\r\nHost: 127.0.0.1\r\n" + head
                         + b"\r\n\r\n")
            assert status_of(answer(sock)) == status, head


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8080", ""])
def test_a_foreign_host_reads_nothing(console: Console, host: str) -> None:
    with connect(console) as sock:
        line = b"Host: " + host.encode() + b"\r\n" if host else b""
        sock.sendall(b"GET /api/acl HTTP/1.1\r\n" + line + b"\r\n")
        assert status_of(answer(sock)) == 421


@pytest.mark.parametrize("host", ["127.0.0.1:1", "localhost:8080", "console.internal"])
def test_the_console_s_own_names_are_served(console: Console, host: str) -> None:
    with connect(console) as sock:
        sock.sendall(b"GET /api/session HTTP/1.1\r\nHost: " + host.encode() + b"\r\n\r\n")
        assert status_of(answer(sock)) == 200


def test_an_idle_connection_is_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    assert console_server._Handler.timeout is not None
    assert 0 < console_server._Handler.timeout <= 60
    monkeypatch.setattr(console_server._Handler, "timeout", 0.3)
    console = make_console()
    try:
        with connect(console) as sock:
            sock.sendall(b"GET /api/session HTTP/1.1\r\n")  # and no more
            started = time.monotonic()
            assert sock.recv(4096) == b""  # closed by the console
            assert time.monotonic() - started < 4
    finally:
        console.stop()
        console.actions.close()
        console.collector.admin.close()


def test_connections_past_the_cap_are_answered_503() -> None:
    console = make_console(max_connections=2)
    try:
        held = [connect(console) for _ in range(2)]
        deadline = time.monotonic() + 5
        while console.httpd.open_connections < 2:  # type: ignore[attr-defined]
            assert time.monotonic() < deadline
            time.sleep(0.01)
        with connect(console) as third:
            assert status_of(answer(third)) == 503
        for sock in held:
            sock.close()
        deadline = time.monotonic() + 5
        while console.httpd.open_connections:  # type: ignore[attr-defined]
            assert time.monotonic() < deadline
            time.sleep(0.01)
        with connect(console) as again:  # served again once they closed
            again.sendall(b"GET /api/session HTTP/1.1\r\nHost: localhost\r\n\r\n")
            assert status_of(answer(again)) == 200
        assert console.httpd.refused_connections == 1  # type: ignore[attr-defined]
    finally:
        console.stop()
        console.actions.close()
        console.collector.admin.close()
