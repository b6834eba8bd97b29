"""A msgId finds its message on the brokers holding that broker's records, and only there
(docs/protocol.md QUERY_BY_MSG_ID): two brokers whose logs hold records at the same offsets
answer each other's msgIds "not here", naming the host:port the msgId names; a slave answers
for its master's records; ``Admin.query_by_msg_id`` and ``replog query --msg-id`` ask the
given brokers in turn. A brokerIP1 that resolves to no IPv4 address stops the start."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from broker_harness import REPO, BrokerProcess, brokers, run_cli
from replication_harness import master_and_slave, wait_converged, wait_in_sync

from common.client import Admin, Producer, Transport
from common.core.errors import ResponseCode, SendStatus
from common.core.message import decode_msg_id
from common.format.protocol import RequestCode

pytestmark = pytest.mark.integration


@pytest.mark.timeout(120)
def test_a_msg_id_is_found_only_on_the_broker_that_stored_it(tmp_path: Path) -> None:
    a = BrokerProcess(tmp_path / "a", brokerRole="ASYNC_MASTER")
    b = BrokerProcess(tmp_path / "b", brokerRole="ASYNC_MASTER")
    with brokers(a, b):
        sent = {}
        for broker in (a, b):  # the same offsets in both logs: 0, then the next record
            with Producer([broker.address]) as p:
                sent[broker.address] = [p.send("t", f"{broker.port}-{i}".encode(), queue_id=0)
                                        for i in range(3)]
        for r in sent[a.address] + sent[b.address]:
            assert r.status == SendStatus.SEND_OK
        assert [r.commit_log_offset for r in sent[a.address]] == \
            [r.commit_log_offset for r in sent[b.address]]
        wanted = sent[a.address][1]
        ip, port, offset = decode_msg_id(wanted.msg_id)
        assert (ip, port) == ("127.0.0.1", a.port)
        transport = Transport(name="msgid-test")
        try:
            resp = transport.call_sync(b.address, RequestCode.QUERY_BY_MSG_ID,
                                       {"msgId": wanted.msg_id}, (), 5000)
        finally:
            transport.close()
        assert resp.code == ResponseCode.QUERY_NOT_FOUND and not resp.bodies
        assert f"127.0.0.1:{a.port}" in resp.remark and str(offset) in resp.remark
        with Admin([b.address], timeout_ms=5000) as admin:
            assert admin.query_by_msg_id(wanted.msg_id) is None
            assert admin.query_by_msg_id(wanted.msg_id, address=a.address) is not None
        with Admin([b.address, a.address], timeout_ms=5000) as admin:  # asked in turn
            found = admin.query_by_msg_id(wanted.msg_id)
            assert found is not None and found.body == f"{a.port}-1".encode()
            assert found.msg_id == wanted.msg_id and found.store_host == f"127.0.0.1:{a.port}"
        rc, doc = run_cli("query", "-s", f"{b.address},{a.address}", "--msg-id", wanted.msg_id)
        assert rc == 0 and doc["messages"][0]["body"] == f"{a.port}-1", doc
        rc, doc = run_cli("query", "-s", b.address, "--msg-id", wanted.msg_id)
        assert rc == 1 and doc == {"found": 0, "messages": []}, doc


@pytest.mark.timeout(120)
def test_a_slave_answers_for_its_masters_records(tmp_path: Path) -> None:
    master, slave = master_and_slave(tmp_path, "SYNC_MASTER")
    with brokers(master, slave):
        wait_in_sync(master)
        with Producer([master.address]) as p:
            sent = [p.send("t", f"m{i}".encode()) for i in range(5)]
        assert all(r.status == SendStatus.SEND_OK for r in sent)
        wait_converged(master, slave)
        with Admin([slave.address], timeout_ms=5000) as admin:
            for i, r in enumerate(sent):
                found = admin.query_by_msg_id(r.msg_id, address=slave.address)
                assert found is not None and found.body == f"m{i}".encode()
                assert found.store_host == f"127.0.0.1:{master.port}"  # the master's bytes


@pytest.mark.timeout(60)
def test_a_broker_ip_without_an_ipv4_address_stops_the_start(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "b", brokerRole="ASYNC_MASTER",
                           brokerIP1="no-such-broker.invalid")
    done = subprocess.run([sys.executable, "-m", "common.cli", "broker", "-c",
                           str(broker.config_path)], cwd=REPO, capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 1, done.stderr[-2000:]
    line = [x for x in done.stderr.splitlines() if "cannot start" in x]
    assert line and "brokerIP1" in line[0] and "IPv4" in line[0], done.stderr[-2000:]
    assert "Traceback" not in done.stderr
