"""``send_frames``: send_multipart(NOBLOCK) with plain int flags, same message boundaries."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import zmq
from helpers.zmq_sockets import bounded_socket

from common.format.zmq_frames import POLLIN, recv_buffers, recv_message, send_frames

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


@pytest.fixture
def ctx() -> Iterator[zmq.Context[zmq.Socket[bytes]]]:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    yield context
    context.term()


def test_frames_arrive_as_one_message_each_with_the_identity_first(
    ctx: zmq.Context[zmq.Socket[bytes]],
) -> None:
    router = bounded_socket(ctx, zmq.ROUTER)
    dealer = bounded_socket(ctx, zmq.DEALER)
    try:
        router.bind("inproc://frames")
        dealer.setsockopt(zmq.ROUTING_ID, b"peer-1")
        dealer.connect("inproc://frames")
        send_frames(dealer, [b"header", memoryview(b"body-bytes")[5:]])
        send_frames(dealer, [b"only"])
        assert router.poll(2000) & POLLIN
        assert router.recv_multipart() == [b"peer-1", b"header", b"bytes"]
        assert router.recv_multipart() == [b"peer-1", b"only"]
        send_frames(router, [b"a", b"b", b"c"], b"peer-1")  # first: the ROUTER's address
        assert dealer.poll(2000)
        assert dealer.recv_multipart() == [b"a", b"b", b"c"]
    finally:
        router.close(0)
        dealer.close(0)


def test_nothing_is_sent_when_the_socket_cannot_take_it(ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
    dealer = bounded_socket(ctx, zmq.DEALER)
    router = bounded_socket(ctx, zmq.ROUTER)
    try:
        with pytest.raises(zmq.Again):  # no peer at all: the first frame is refused
            send_frames(dealer, [b"lost-header", b"lost-body"])
        router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        router.bind("inproc://mandatory")
        with pytest.raises(zmq.ZMQError):  # EHOSTUNREACH on the identity frame
            send_frames(router, [b"h"], b"unknown-peer")
        dealer.setsockopt(zmq.ROUTING_ID, b"d")
        dealer.connect("inproc://mandatory")
        send_frames(dealer, [b"next"])
        assert router.poll(2000)
        assert router.recv_multipart() == [b"d", b"next"]  # no leftover of the refused one
        assert not router.poll(50)
    finally:
        router.close(0)
        dealer.close(0)


def test_an_identity_alone_is_refused() -> None:
    with pytest.raises(ValueError):
        send_frames(None, [], b"peer")  # type: ignore[arg-type]  # refused before any send


def test_whole_messages_are_received_as_bytes_or_as_buffers(
    ctx: zmq.Context[zmq.Socket[bytes]],
) -> None:
    router = bounded_socket(ctx, zmq.ROUTER)
    dealer = bounded_socket(ctx, zmq.DEALER)
    try:
        router.bind("inproc://whole")
        dealer.setsockopt(zmq.ROUTING_ID, b"peer-2")
        dealer.connect("inproc://whole")
        with pytest.raises(zmq.Again):
            recv_buffers(router)  # nothing there: nothing taken
        send_frames(dealer, [b"header", b"x" * 70_000])  # a body past libzmq's small messages
        send_frames(dealer, [b"one"])
        assert router.poll(2000) & POLLIN
        frames = recv_buffers(router)
        assert [type(f) for f in frames] == [memoryview] * 3
        assert [bytes(f) for f in frames] == [b"peer-2", b"header", b"x" * 70_000]
        assert recv_message(router) == [b"peer-2", b"one"]
        with pytest.raises(zmq.Again):
            recv_message(router)
    finally:
        router.close(0)
        dealer.close(0)
