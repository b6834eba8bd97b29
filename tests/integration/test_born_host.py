"""BORNHOST is the producer's address as the broker saw the connection (issue 21, item 7).

RocketMQ records the channel's remote address. The broker takes the IP from the ZeroMQ
message's ``Peer-Address`` and the port from the connection's descriptor, so a record says
which host and connection it came from. The client here connects through this machine's
outward address when it has one, so the address cannot be the loopback default by accident.
"""

from __future__ import annotations

import socket
from pathlib import Path

import psutil
import pytest
from broker_harness import BrokerProcess, brokers

from common.client import Consumer, Producer
from common.core.errors import SendStatus

pytestmark = pytest.mark.integration


def outward_ipv4() -> str:
    """The address this machine sends from (no packet leaves: a UDP connect only routes)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1
            ip = str(s.getsockname()[0])
        except OSError:
            return "127.0.0.1"
    return ip if not ip.startswith("127.") else "127.0.0.1"


def client_ports(ip: str, broker_port: int) -> set[int]:
    """Local ports of this process's TCP connections to the broker."""
    return {c.laddr.port for c in psutil.Process().net_connections(kind="tcp")
            if c.raddr and c.raddr.port == broker_port and c.laddr.ip == ip}


@pytest.mark.timeout(120)
def test_a_stored_record_names_the_producers_address_and_port(tmp_path: Path) -> None:
    b = BrokerProcess(tmp_path / "b")
    ip = outward_ipv4()
    with brokers(b):
        address = f"{ip}:{b.port}"
        with Producer([address]) as p:
            sync = p.send("born", b"sync", queue_id=0)  # the calling thread's own DEALER
            ports_sync = client_ports(ip, b.port)
            asy = p.send_async("born", b"async", queue_id=0).result(30)  # the I/O thread's
            ports_all = client_ports(ip, b.port)
        assert sync.status == asy.status == SendStatus.SEND_OK
        with Consumer([address]) as c:
            got = {m.body: m.born_host for m in c.pull("born", 0, 0, 8).messages}
    sync_ip, _, sync_port = got[b"sync"].rpartition(":")
    asy_ip, _, asy_port = got[b"async"].rpartition(":")
    assert sync_ip == asy_ip == ip, got  # before: always 127.0.0.1:0
    assert int(sync_port) in ports_sync, (got, ports_sync)
    assert int(asy_port) in ports_all and asy_port != sync_port, (got, ports_all)
