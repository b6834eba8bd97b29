"""replog's ZMTP 3.1 server side (common/format/zmtp.py): messages bounded before they are
kept, every split of the byte stream read alike, libzmq's own DEALER understood. Every test
runs twice: on the Python path alone, and with the C codec's frame scan and encode where it is
built (test_zmtp_native.py holds the two to the same results on random streams)."""

from __future__ import annotations

import random
import time
from typing import Any

import pytest
import zmq
from helpers.zmq_sockets import bounded_socket

from common.format import zmtp
from common.format.zmtp import Connection, Oversized, ZmtpError


@pytest.fixture(autouse=True, params=["python", "c"])
def path(request: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test on the Python path alone, and on the C scan and encode (skipped unbuilt)."""
    if request.param == "python":
        monkeypatch.setattr(zmtp, "_scan", None)
        monkeypatch.setattr(zmtp, "encode", zmtp._encode)
    elif zmtp._native is None:
        pytest.skip("the C codec is not built (or PURE_PYTHON_REPLOG is set)")
    return str(request.param)


def client_greeting(mechanism: bytes = b"NULL", major: int = 3) -> bytes:
    return (b"\xff" + bytes(8) + b"\x7f" + bytes((major, 1)) + mechanism.ljust(20, b"\x00")
            + b"\x00" + bytes(31))


def client_hello(socket_type: bytes = b"DEALER") -> bytes:
    return client_greeting() + zmtp.ready(socket_type)


def ready_conn(max_frames: int = 8, max_bytes: int = 1024) -> Connection:
    conn = Connection(max_frames, max_bytes)
    assert conn.feed(client_hello()) == []
    assert conn.state == zmtp.TRAFFIC and conn.peer_type == b"DEALER"
    return conn


def feed_in_pieces(conn: Connection, data: bytes, cuts: list[int]) -> list[list[bytes]]:
    out: list[list[bytes]] = []
    last = 0
    for cut in sorted(cuts) + [len(data)]:
        out.extend(conn.feed(data[last:cut]))
        last = cut
    return out


def test_encode_and_feed_round_trip_short_and_long_frames() -> None:
    messages = [[b"header", b"x" * 300], [b""], [b"a", b"", b"b" * 255, b"c" * 256]]
    conn = ready_conn(max_bytes=10_000)
    wire = b"".join(zmtp.encode(m) for m in messages)
    assert conn.feed(wire) == messages


def test_a_message_of_no_frames_is_refused_not_sent_as_no_bytes() -> None:
    with pytest.raises(ValueError, match="at least one frame"):
        zmtp.encode([])  # a STREAM socket would take b"" as "close this connection"


@pytest.mark.parametrize("seed", range(20))
def test_every_split_of_the_stream_reads_the_same(seed: int) -> None:
    rng = random.Random(seed)
    messages = [[rng.randbytes(rng.choice((0, 1, 200, 256, 700))) for _ in range(rng.randint(1, 4))]
                for _ in range(6)]
    data = client_hello() + b"".join(zmtp.encode(m) for m in messages)
    conn = Connection(8, 100_000)
    cuts = rng.sample(range(1, len(data)), min(len(data) - 1, rng.randint(1, 40)))
    assert feed_in_pieces(conn, data, cuts) == messages


def test_a_stream_fed_one_byte_at_a_time() -> None:
    messages = [[b"h", b"b" * 300], [b"z"]]
    data = client_hello() + b"".join(zmtp.encode(m) for m in messages)
    conn = Connection(8, 1000)
    assert feed_in_pieces(conn, data, list(range(1, len(data)))) == messages


def test_too_many_frames_are_dropped_and_the_next_message_is_served() -> None:
    conn = ready_conn(max_frames=3)
    wire = zmtp.encode([b"head"] + [b"f"] * 10) + zmtp.encode([b"next"])
    assert conn.feed(wire) == [[b"next"]]
    assert conn.oversized == [Oversized(b"head", 11, 14, "more than 3 frames")]


def test_too_many_bytes_are_dropped_as_they_arrive_and_never_kept() -> None:
    conn = ready_conn(max_bytes=1024)
    big = zmtp.encode([b"head", b"y" * 100_000, b"tail"])
    out = feed_in_pieces(conn, big + zmtp.encode([b"next"]), list(range(0, len(big), 8192)))
    assert out == [[b"next"]]
    assert conn.oversized == [Oversized(b"head", 3, 100_008, "more than 1024 bytes")]
    assert conn._part is None and conn._frames == [] and conn._buf == b""


def test_a_first_frame_past_the_bound_has_no_head() -> None:
    conn = ready_conn(max_bytes=10)
    assert conn.feed(zmtp.encode([b"h" * 50]) + zmtp.encode([b"ok"])) == [[b"ok"]]
    assert conn.oversized == [Oversized(None, 1, 50, "more than 10 bytes")]


def test_memory_follows_the_bytes_received_not_the_size_claimed() -> None:
    conn = ready_conn(max_bytes=8 << 20)
    conn.feed(b"\x02" + (8 << 20).to_bytes(8, "big") + b"x" * 10)  # claims 8 MiB, sends 10
    assert conn._part is not None and len(conn._part) == 10


def test_a_ping_is_answered_pong_with_its_context() -> None:
    conn = ready_conn()
    assert conn.feed(zmtp.command(b"PING", b"\x00\x0actx") + zmtp.encode([b"m"])) == [[b"m"]]
    assert conn.replies == [zmtp.command(b"PONG", b"ctx")]


@pytest.mark.parametrize("data, reason", [
    (b"GET / HTTP/1.1\r\n", "not a ZMTP peer"),
    (client_greeting(major=2), "ZMTP 2.x"),
    (client_greeting(b"CURVE"), "mechanism b'CURVE'"),
    (client_greeting() + zmtp.ready(b"PUB"), "socket type b'PUB'"),
    (client_greeting() + zmtp.encode([b"m"]), "a message before READY"),
    (client_greeting() + zmtp.command(b"PING", b"\x00\x00"), "b'PING' before READY"),
    (client_hello() + b"\x08\x01x", "reserved flag bits"),
    (client_hello() + zmtp.command(b"ERROR", b"\x03bye"), "ERROR b'bye'"),
    (client_hello() + zmtp.command(b"SUBSCRIBE", b"t"), "unexpected command"),
    (client_hello() + b"\x06" + (1 << 20).to_bytes(8, "big"), "a command of 1048576 bytes"),
    (client_greeting() + zmtp.command(b"READY", b"\x0bSocket-Type\x00\x00\x00\x09DEALER"),
     "malformed metadata"),
])
def test_a_peer_that_breaks_the_protocol_is_refused(data: bytes, reason: str) -> None:
    with pytest.raises(ZmtpError, match=reason):
        Connection(8, 1024).feed(data)


def test_libzmq_dealer_talks_to_it() -> None:
    """The server side over a real STREAM socket, libzmq's DEALER (with its heartbeat) on the
    other: the greeting, READY, messages both ways, PING answered, a bounded message refused."""
    ctx: zmq.Context[Any] = zmq.Context()
    try:
        server = bounded_socket(ctx, zmq.STREAM)
        port = server.bind_to_random_port("tcp://127.0.0.1")
        client = bounded_socket(ctx, zmq.DEALER)
        client.setsockopt(zmq.HEARTBEAT_IVL, 100)
        client.setsockopt(zmq.HEARTBEAT_TIMEOUT, 2000)
        client.connect(f"tcp://127.0.0.1:{port}")
        client.send_multipart([b"hello", b"x" * 5000])
        client.send_multipart([b"big"] + [b"y"] * 20)
        conns: dict[bytes, Connection] = {}
        got: list[list[bytes]] = []
        pongs = 0
        deadline = time.monotonic() + 10
        while (len(got) < 1 or pongs < 2) and time.monotonic() < deadline:
            if not server.poll(100):
                continue
            identity, chunk = server.recv_multipart()
            if identity not in conns:
                assert chunk == b""
                conns[identity] = Connection(8, 10_000)
                server.send_multipart([identity, zmtp.SERVER_HELLO])
                continue
            conn = conns[identity]
            for message in conn.feed(chunk):
                got.append(message)
                server.send_multipart([identity, zmtp.encode([b"re:" + message[0]])])
            pongs += len(conn.replies)
            for reply in conn.replies:
                server.send_multipart([identity, reply])
            conn.replies.clear()
        assert got == [[b"hello", b"x" * 5000]]
        (conn,) = conns.values()
        assert conn.oversized == [Oversized(b"big", 21, 23, "more than 8 frames")]
        assert pongs >= 2
        assert client.poll(5000)
        assert client.recv_multipart() == [b"re:hello"]
    finally:
        ctx.destroy(linger=0)

