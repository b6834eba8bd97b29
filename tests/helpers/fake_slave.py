"""A test's stand-in for a slave on a master's HA port (a DEALER that says HELLO, reads DATA
and acks when told), and the master's HA service of a broker started in the test."""

from __future__ import annotations

from typing import Any

import zmq

from common.broker.broker import Broker
from common.ha.protocol import Ack, Data, Frame, Heartbeat, Hello, HelloReply, Limits, decode
from common.ha.protocol import encode as encode_frame
from helpers.zmq_sockets import bounded_socket
from master.ha_service import HaService


class FakeSlave:
    """The test plays a slave: a DEALER that says HELLO, reads DATA, acks when told."""

    def __init__(self, broker: Broker, session: int = 7) -> None:
        self.ctx: zmq.Context[Any] = zmq.Context()
        self.sock = bounded_socket(self.ctx, zmq.DEALER, recv_timeout_ms=5000)
        self.sock.connect(f"tcp://127.0.0.1:{broker.cfg.ha_port}")
        self.session = session
        self.name = broker.cfg.brokerName
        self.limits = Limits.from_config(broker.cfg)

    def hello(self) -> HelloReply:
        self.send(Hello(self.session, self.name, 1, 0, "127.0.0.1:1", ()))
        reply = self.recv()
        assert isinstance(reply, HelloReply), reply
        return reply

    def send(self, frame: Frame) -> None:
        self.sock.send_multipart(encode_frame(frame))

    def recv(self) -> Frame:
        while True:
            frame = decode(self.sock.recv_multipart(), self.limits)
            if not isinstance(frame, Heartbeat):
                return frame

    def data(self) -> Data:
        frame = self.recv()
        assert isinstance(frame, Data), frame
        return frame

    def ack(self, offset: int) -> None:
        self.send(Ack(self.session, offset))

    def close(self) -> None:
        self.sock.close(0)
        self.ctx.term()


def ha_service(broker: Broker) -> HaService:
    service = getattr(broker.role, "ha_service", None)
    assert isinstance(service, HaService)
    return service
