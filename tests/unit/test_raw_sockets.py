"""Every ZeroMQ socket a test makes by hand comes from ``helpers.zmq_sockets.bounded_socket``:
a blocking send with no pipe to take it (a failed handshake, a full queue) waits for ever in
libzmq, and one such send hung a whole CI run. An AST walk over tests/ keeps it so."""

from __future__ import annotations

import ast
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import zmq
from helpers.zmq_sockets import BoundedSocket, SendTimedOut, bounded_socket

pytestmark = pytest.mark.unit

TESTS = Path(__file__).resolve().parents[1]
HELPER = TESTS / "helpers" / "zmq_sockets.py"


def hand_made_sockets(tree: ast.AST) -> list[int]:
    """Lines that make a ZeroMQ socket other than by ``bounded_socket``: ``x.socket(...)`` on
    anything but the ``socket`` module, ``zmq.Socket(...)`` and ``socket_class=``."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        by_attribute = isinstance(func, ast.Attribute) and (
            func.attr == "Socket" or func.attr == "socket" and not (
                isinstance(func.value, ast.Name) and func.value.id == "socket"))
        if by_attribute or any(k.arg == "socket_class" for k in node.keywords):
            found.append(node.lineno)
    return found


def test_no_test_makes_a_zmq_socket_but_by_the_helper() -> None:
    offenders = [f"{path.relative_to(TESTS)}:{line}"
                 for path in sorted(TESTS.rglob("*.py")) if path != HELPER
                 for line in hand_made_sockets(ast.parse(path.read_text(), str(path)))]
    assert not offenders, ("ZeroMQ sockets made by hand (use helpers.zmq_sockets."
                           f"bounded_socket): {offenders}")


@pytest.mark.parametrize("source", [
    "s = ctx.socket(zmq.DEALER)",
    "with self.ctx.socket(zmq.PUSH) as push: pass",
    "s = zmq.Context.instance().socket(zmq.REQ)",
    "s = zmq.Socket(ctx, zmq.DEALER)",
    "s = ctx.socket(zmq.DEALER, socket_class=Mine)",
])
def test_the_walk_sees_each_way_of_making_one(source: str) -> None:
    assert hand_made_sockets(ast.parse(source)) == [1]


def test_the_walk_leaves_tcp_sockets_and_the_helper_alone() -> None:
    assert hand_made_sockets(ast.parse("s = socket.socket()\nb = bounded_socket(ctx, 5)")) == []



def refused_dealer(ctx: zmq.Context[Any], server: BoundedSocket) -> BoundedSocket:
    """A DEALER pinning the wrong server key of a CURVE ``server``, with a queue of one
    message: no handshake succeeds, so nothing ever drains it."""
    public, secret = zmq.curve_keypair()
    server.curve_secretkey = secret
    server.curve_publickey = public
    server.curve_server = True
    port = server.bind_to_random_port("tcp://127.0.0.1")
    dealer = bounded_socket(ctx, zmq.DEALER, send_timeout_ms=300)
    dealer.sndhwm = 1
    dealer.curve_publickey, dealer.curve_secretkey = zmq.curve_keypair()
    dealer.curve_serverkey = zmq.curve_keypair()[0]  # not the server's
    dealer.connect(f"tcp://127.0.0.1:{port}")
    return dealer


def test_a_send_no_peer_takes_fails_fast_where_a_blocking_one_hangs() -> None:
    ctx: zmq.Context[Any] = zmq.Context()
    server = bounded_socket(ctx, zmq.ROUTER)
    dealer = refused_dealer(ctx, server)
    outcome: list[BaseException | None] = []

    def send_for_ever() -> None:
        try:
            dealer.send_multipart([b"header", b"body"])
            outcome.append(None)
        except zmq.ZMQError as e:  # ETERM, once the context ends below
            outcome.append(e)
        finally:
            dealer.close()

    blocked = threading.Thread(target=send_for_ever, daemon=True)
    try:
        started = time.monotonic()
        with pytest.raises(SendTimedOut, match="no peer took the send within 300 ms"):
            for _ in range(2):  # the queue's one place, then none
                dealer.send_multipart([b"header", b"body"])
        assert time.monotonic() - started < 3
        dealer.sndtimeo = -1  # the same socket as tests used to make them: no bound
        blocked.start()
        blocked.join(1.0)
        assert blocked.is_alive() and not outcome, "a send no peer can take went (or failed)"
    finally:
        server.close()
        if not blocked.is_alive():
            dealer.close()
        ctx.term()  # ETERM wakes the blocked send; its thread closes the DEALER
    blocked.join(5)
    assert isinstance(outcome[0], zmq.ContextTerminated)
