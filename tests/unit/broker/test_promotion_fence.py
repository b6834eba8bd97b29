"""A promotion fences replication (issue 21, item 4): bytes an HA client that did not stop in
time appends late never land in the new master's log, after its epoch began.

Two brokers in this process, each on a real store: a master and its replicating slave. The
slave's HA client is made to stall inside an append (as a thread stalled on a slow disk or the
GIL would), its stop times out, the slave is promoted anyway, and then the stalled append goes
on. The store refuses it: the promotion closed the replication fence, under the put lock,
before it wrote the new epoch.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.brokers import free_port

import slave.ha_client as ha_client_module
from common.broker.broker import Broker
from common.cli.bootstrap import make_role
from common.client import Admin, Producer
from common.core.config import load_config
from common.core.errors import ReplicationFencedError, SendStatus, StoreError
from common.ha import epochs
from common.ha import slave_core as sc
from common.store.message_store import MessageStore

pytestmark = [pytest.mark.unit, pytest.mark.timeout(90)]


def wait_for(cond: Callable[[], Any], what: str, timeout_s: float = 10.0) -> None:
    done = threading.Event()
    deadline = threading.Event()
    timer = threading.Timer(timeout_s, deadline.set)
    timer.start()
    try:
        while not cond():
            assert not deadline.is_set(), f"timed out after {timeout_s} s waiting for {what}"
            done.wait(0.005)
    finally:
        timer.cancel()


@pytest.fixture
def brokers(tmp_path: Path) -> Iterator[Callable[..., Broker]]:
    made: list[Broker] = []

    def start(name: str, **fields: Any) -> Broker:
        listen, ha = free_port(), free_port()
        cfg = load_config(None, (), env={}, listenPort=listen, haListenPort=ha,
                          storePathRootDir=str(tmp_path / name),
                          mappedFileSizeCommitLog=1024 * 1024, **fields)
        broker = Broker(cfg, MessageStore(cfg), make_role)
        broker.start()
        made.append(broker)
        return broker

    yield start
    for b in reversed(made):
        b.shutdown()


def address(b: Broker) -> str:
    return f"127.0.0.1:{b.cfg.listenPort}"


def test_a_late_replicated_append_after_promotion_is_fenced(
        brokers: Callable[..., Broker], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ha_client_module, "JOIN_TIMEOUT_S", 0.3)  # the stop gives up soon
    master = brokers("m", brokerRole="ASYNC_MASTER")
    slave = brokers("s", brokerRole="SLAVE", brokerId=1,
                    haMasterAddress=f"127.0.0.1:{master.cfg.ha_port}")
    with Producer([address(master)]) as p:
        assert p.send("t", b"first", queue_id=0).status == SendStatus.SEND_OK
    wait_for(lambda: slave.store.max_phy_offset == master.store.max_phy_offset,
             "the slave to catch up")

    assert slave.role is not None
    client = slave.role.ha_client  # type: ignore[attr-defined]
    inside, go_on = threading.Event(), threading.Event()
    late: list[BaseException | None] = []
    do = client._do

    def stalled_do(action: sc.SlaveAction) -> None:
        if isinstance(action, sc.Append) and not inside.is_set():
            inside.set()
            go_on.wait(30)  # stalled (a slow disk, the GIL) past the stop's timeout
            try:
                do(action)
                late.append(None)
            except BaseException as e:
                late.append(e)
                raise
            return
        do(action)

    client._do = stalled_do
    with Producer([address(master)]) as p:
        assert p.send("t", b"second", queue_id=0).status == SendStatus.SEND_OK
    wait_for(inside.is_set, "the slave's append to stall")
    before = slave.store.max_phy_offset

    with Admin([address(slave)]) as a:
        status = a.promote(address(slave), role="ASYNC_MASTER")
    assert status["role"] == "ASYNC_MASTER"
    history = epochs.load(slave.cfg.store_root)
    assert history[-1].start_phy_offset == before

    go_on.set()  # the stalled append goes on, after the new epoch began
    wait_for(lambda: late, "the stalled append to end")
    assert isinstance(late[0], ReplicationFencedError), late
    assert isinstance(late[0], StoreError)
    assert slave.store.max_phy_offset == before  # nothing of the old master's term landed
    client._thread.join(10)
    assert not client._thread.is_alive()

    with Producer([address(slave)]) as p:  # the new master's own first record is at the start
        r = p.send("t", b"new term", queue_id=0)
    assert r.status == SendStatus.SEND_OK and r.commit_log_offset == before


def test_the_fence_refuses_stale_writers_and_opens_for_the_next_client(tmp_path: Path) -> None:
    cfg = load_config(None, (), env={}, storePathRootDir=str(tmp_path), brokerRole="SLAVE",
                      brokerId=1, mappedFileSizeCommitLog=64 * 1024)
    store = MessageStore(cfg)
    store.start()
    try:
        first = store.open_replication()
        assert store.append_replicated(0, b"a" * 100, first) == 100
        store.fence_replication()
        for call in (lambda: store.append_replicated(100, b"b" * 10, first),
                     lambda: store.append_replicated(100, b"b" * 10),
                     lambda: store.truncate_to(50, first),
                     lambda: store.reset_to(0, first)):
            with pytest.raises(ReplicationFencedError, match="fenced"):
                call()
        with pytest.raises(ReplicationFencedError), store.replication_guard(first):
            pass
        assert store.max_phy_offset == 100  # nothing changed
        second = store.open_replication()  # a new HA client (a failed promotion's resume)
        with pytest.raises(ReplicationFencedError):
            store.append_replicated(100, b"b" * 10, first)  # the old one stays fenced
        assert store.append_replicated(100, b"b" * 10, second) == 110
    finally:
        store.shutdown()
