"""Requests the broker sends to clients, on the connections they opened, over real sockets
(a broker on the in-memory store): a producer group's members heartbeat and are listed, the
broker asks each for its running figures, a code the client does not serve is answered so, a
client that does not answer times out, nobody answers for another client, and a client cannot
send the broker a request meant for clients."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import msgpack
import pytest
import zmq
from helpers.zmq_sockets import bounded_socket

from common.broker.broker import Broker
from common.broker.producer_groups import MAX_PRODUCERS_PER_GROUP, ProducerGroups
from common.client import Admin, Producer
from common.core.errors import BrokerError, ResponseCode
from common.format.protocol import (
    PROTOCOL_VERSION,
    Limits,
    Request,
    RequestCode,
    Response,
    decode_response,
    encode_request,
)

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

_LIMITS = Limits().for_responses()


def addr(broker: Broker) -> str:
    return f"127.0.0.1:{broker.cfg.listenPort}"


def wait_for(cond: Callable[[], Any], what: str, timeout_s: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (value := cond()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)
    return value


def test_a_producer_group_is_listed_with_each_members_running_figures(
        make_broker: Callable[..., Broker]) -> None:
    broker = make_broker()
    with Producer([addr(broker)], group="orders-pg", client_id="p-1", heartbeat_ms=200) as p1, \
            Producer([addr(broker)], group="orders-pg", client_id="p-2") as p2, \
            Admin([addr(broker)]) as admin:
        wait_for(lambda: len(broker.producer_groups.live("orders-pg")) == 2, "two heartbeats")
        plain = admin.producer_connections("orders-pg")
        assert [p["clientId"] for p in plain] == ["p-1", "p-2"]
        assert all(p["address"].startswith("127.0.0.1:") for p in plain)
        assert "runningInfo" not in plain[0]
        p1.send_async("t", b"x").result(10)
        detailed = admin.producer_connections("orders-pg", running_info=True)
        info = {p["clientId"]: p["runningInfo"] for p in detailed}
        assert info["p-1"]["clientId"] == "p-1" and info["p-2"]["clientId"] == "p-2"
        assert info["p-1"]["group"] == "orders-pg" and info["p-1"]["uptimeMs"] >= 0
        assert info["p-1"]["sendAsyncPending"] == 0
        assert broker.status()["producerGroups"] == {"orders-pg": 2}
        assert admin.producer_connections("other-pg") == []
        assert p2.group == "orders-pg"
    # closing says it leaves: gone at once, not after the 120 s expiry
    wait_for(lambda: not broker.producer_groups.live("orders-pg"), "both left")
    figures = broker.status()["server"]["clientRequests"]
    assert figures["asked"] == 2 and figures["answered"] == 2 and figures["inFlight"] == 0


def test_a_code_the_client_does_not_serve_is_answered_so(
        make_broker: Callable[..., Broker]) -> None:
    broker = make_broker()
    with Producer([addr(broker)], group="pg") as _p:
        channel = wait_for(lambda: broker.producer_groups.pick("pg"), "the heartbeat")
        resp = broker.server.client_requests.ask(channel.identity, RequestCode.STATUS).result(5)
        assert resp.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
        assert "serves no STATUS" in resp.remark


def test_a_client_that_does_not_answer_in_time_fails_the_ask_and_its_late_answer_is_dropped(
        make_broker: Callable[..., Broker]) -> None:
    broker = make_broker()
    release = threading.Event()
    with Producer([addr(broker)], group="pg") as p:
        def slow(address: str, req: Request) -> Response:
            release.wait(10)
            return Response(ResponseCode.SUCCESS, req.opaque, "", {"late": 1}, [])

        p._transport.serve(RequestCode.GET_CLIENT_RUNNING_INFO, slow)
        channel = wait_for(lambda: broker.producer_groups.pick("pg"), "the heartbeat")
        asked = broker.server.client_requests.ask(
            channel.identity, RequestCode.GET_CLIENT_RUNNING_INFO, timeout_ms=200)
        err = asked.exception(5)
        assert isinstance(err, BrokerError) and err.retriable
        assert "did not answer GET_CLIENT_RUNNING_INFO within 200 ms" in err.remark
        release.set()
        requests = broker.server.client_requests
        wait_for(lambda: requests.stray_answers == 1, "the late answer, dropped")
        assert requests.timed_out == 1


def test_an_answer_counts_only_from_the_client_asked(make_broker: Callable[..., Broker]) -> None:
    """A second connection answering with the opaque of a request sent to the first is
    dropped; the first one's own answer settles it."""
    broker = make_broker()
    ctx: zmq.Context[Any] = zmq.Context()
    asked_sock = bounded_socket(ctx, zmq.DEALER)
    other = bounded_socket(ctx, zmq.DEALER)
    try:
        for s in (asked_sock, other):
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.RCVTIMEO, 5000)
            s.connect(f"tcp://{addr(broker)}")
        # the heartbeat that tells the broker who asked_sock is
        asked_sock.send_multipart(encode_request(RequestCode.PRODUCER_HEARTBEAT, 1, {
            "group": "pg", "clientId": "raw"}))
        assert decode_response(asked_sock.recv_multipart(), _LIMITS).ok
        channel = broker.producer_groups.live("pg")[0]
        asked = broker.server.client_requests.ask(channel.identity,
                                                  RequestCode.GET_CLIENT_RUNNING_INFO)
        frames = asked_sock.recv_multipart()
        header = msgpack.unpackb(frames[0])
        assert header[:2] == [PROTOCOL_VERSION, int(RequestCode.GET_CLIENT_RUNNING_INFO)]
        opaque = header[2]
        other.send_multipart([msgpack.packb([PROTOCOL_VERSION, 0, opaque, "", {"forged": 1}])])
        wait_for(lambda: broker.server.client_requests.stray_answers == 1, "the forged answer")
        assert not asked.done()
        asked_sock.send_multipart([msgpack.packb([PROTOCOL_VERSION, 0, opaque, "",
                                                  {"genuine": 1}])])
        assert asked.result(5).fields == {"genuine": 1}
    finally:
        asked_sock.close(0)
        other.close(0)
        ctx.term()


def test_a_frame_that_looks_like_an_answer_but_is_garbage_is_answered_bad_request(
        make_broker: Callable[..., Broker]) -> None:
    """A request whose array header a bit flip made a response's (0x94 -> 0x95) does not
    decode: it is answered BAD_REQUEST like any malformed frame, not swallowed as a stray
    answer, and the broker serves the next request (found by test_broker_fuzz, seed
    20260421 frame 14)."""
    broker = make_broker()
    ctx: zmq.Context[Any] = zmq.Context()
    sock = bounded_socket(ctx, zmq.DEALER)
    try:
        sock.setsockopt(zmq.RCVTIMEO, 5000)
        sock.connect(f"tcp://{addr(broker)}")
        sock.send_multipart([b"\x95\x01\n\x01\x82\xa5topic\xa4fuzz\xa7queueId@", b"body"])
        resp = decode_response(sock.recv_multipart(), _LIMITS)
        assert resp.code == ResponseCode.BAD_REQUEST
        assert "malformed msgpack" in resp.remark
        sock.send_multipart(encode_request(RequestCode.PRODUCER_HEARTBEAT, 2, {
            "group": "pg", "clientId": "raw"}))
        assert decode_response(sock.recv_multipart(), _LIMITS).ok
    finally:
        sock.close(0)
        ctx.term()


def test_a_client_cannot_send_the_broker_a_request_meant_for_clients(
        make_broker: Callable[..., Broker]) -> None:
    broker = make_broker()
    with Admin([addr(broker)], retries=0) as admin:
        resp = admin._cluster.request(addr(broker), RequestCode.GET_CLIENT_RUNNING_INFO, {})
    assert resp.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
    assert "the broker sends to clients" in resp.remark


def test_the_registry_expires_replaces_and_bounds_its_producers() -> None:
    now = [0.0]
    groups = ProducerGroups(clock=lambda: now[0], expiry_s=120.0)
    assert groups.heartbeat("g", "a", b"conn-1", "10.0.0.1:1") == 1
    assert groups.heartbeat("g", "a", b"conn-2", "10.0.0.1:2") == 1  # reconnected: replaced
    assert groups.live("g")[0].identity == b"conn-2"
    now[0] = 100.0
    groups.heartbeat("g", "b", b"conn-3", "10.0.0.2:1")
    now[0] = 121.0  # a's last heartbeat was 121 s ago
    assert [c.client_id for c in groups.live("g")] == ["b"]
    assert groups.heartbeat("g", "b", b"conn-3", "", leave=True) == 0
    assert groups.groups() == {}
    for i in range(MAX_PRODUCERS_PER_GROUP + 5):
        now[0] += 0.001
        groups.heartbeat("big", f"c{i:05d}", b"x", "")
    live = groups.live("big")
    assert len(live) == MAX_PRODUCERS_PER_GROUP and live[0].client_id == "c00005"
    picked = {groups.pick("big").client_id for _ in range(3)}  # type: ignore[union-attr]
    assert len(picked) == 3  # in turn


def test_a_producer_that_did_not_answer_is_passed_over_until_it_heartbeats() -> None:
    """A killed producer stays listed until its expiry (120 s): a check-back asking it times
    out; it is not asked again while another of its group answers."""
    groups = ProducerGroups()
    groups.heartbeat("g", "dead", b"conn-1", "")
    groups.heartbeat("g", "alive", b"conn-2", "")
    dead = next(c for c in groups.live("g") if c.client_id == "dead")
    groups.silent(dead)
    assert {groups.pick("g").client_id for _ in range(6)} == {"alive"}  # type: ignore[union-attr]
    groups.heartbeat("g", "dead", b"conn-3", "")  # back: asked again
    assert {groups.pick("g").client_id for _ in range(6)} == {"alive", "dead"}  # type: ignore[union-attr]
    groups.silent(groups.live("g")[0])
    groups.silent(groups.live("g")[1])  # all silent: still asked, in turn
    assert {groups.pick("g").client_id for _ in range(6)} == {"alive", "dead"}  # type: ignore[union-attr]




def test_replog_producers_lists_the_group_with_running_info(
        make_broker: Callable[..., Broker], capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from common.cli.main import main

    broker = make_broker()
    with Producer([addr(broker)], group="cli-pg", client_id="p-cli"):
        wait_for(lambda: broker.producer_groups.live("cli-pg"), "the heartbeat")
        capsys.readouterr()
        assert main(["producers", "-s", addr(broker), "--group", "cli-pg", "--running-info",
                     "--json"]) == 0
        doc = json.loads(capsys.readouterr().out)
    (row,) = doc["producers"]
    assert doc["group"] == "cli-pg" and row["clientId"] == "p-cli"
    assert row["master"] == addr(broker) and row["runningInfo"]["clientId"] == "p-cli"
