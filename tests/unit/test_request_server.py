"""Request server, roles and clients in one process, over real sockets, on an in-memory store.

The fake store keeps RocketMQ records in memory (``common.format.record``) and implements the part
of the store API the broker uses, so the server's mechanics (pipelining, coalescing, long polling,
overload, drain, slave refusal) are tested apart from the storage engine.
"""

from __future__ import annotations

import concurrent.futures
import socket
import threading
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import pytest
import zmq
from time_bounds import late_s, tier

from common.broker.broker import Broker
from common.client import Admin, Consumer, NoMasterError, Producer
from common.core import ports
from common.core.errors import (
    BrokerError,
    PullStatus,
    ResponseCode,
    SendStatus,
)
from common.format import protocol
from common.format.protocol import PROTOCOL_VERSION, RequestCode, decode_response
from common.ha import epochs as ep
from common.ha import promotion

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


def free_port() -> int:
    """Below the kernel's ephemeral range: an outgoing connection cannot take it meanwhile."""
    return ports.free_port()


def addr(broker: Broker) -> str:
    return f"127.0.0.1:{broker.cfg.listenPort}"


def test_send_pull_query_round_trip(make_broker: Callable[..., Broker]) -> None:
    broker = make_broker()
    with Producer([addr(broker)]) as p, Consumer([addr(broker)], group="g") as c:
        r = p.send("orders", b"hello", tags="TagA", keys="order-42", queue_id=1)
        assert r.status == SendStatus.SEND_OK and r.queue_id == 1 and r.queue_offset == 0
        pr = c.pull("orders", queue_id=1, offset=0, max_nums=32)
        assert pr.status == PullStatus.FOUND and pr.next_begin_offset == 1
        assert [m.body for m in pr.messages] == [b"hello"] and pr.messages[0].msg_id == r.msg_id
        c.commit_offset("orders", 1, pr.next_begin_offset)
        assert c.fetch_offset("orders", 1) == 1 and c.fetch_offset("orders", 0) == -1
    with Admin([addr(broker)]) as a:
        assert [m.body for m in a.query_by_key("orders", "order-42")] == [b"hello"]
        assert a.query_by_msg_id(r.msg_id).body == b"hello"  # type: ignore[union-attr]
        assert a.query_by_offset(r.commit_log_offset).tags == "TagA"  # type: ignore[union-attr]
        assert a.query_by_offset(r.commit_log_offset + 1) is None
        status = a.status(addr(broker))
    for key in (
        "brokerName",
        "brokerId",
        "role",
        "epoch",
        "minPhyOffset",
        "maxPhyOffset",
        "flushedPhyOffset",
        "masterAddress",
        "slaves",
    ):
        assert key in status
    assert status["role"] == "ASYNC_MASTER" and status["maxPhyOffset"] == broker.store.phy


def test_batch_and_round_robin(make_broker: Callable[..., Broker]) -> None:
    broker = make_broker(defaultTopicQueueNums=3)
    with Producer([addr(broker)]) as p:
        rs = p.send_batch("t", [b"a", b"b", b"c"], queue_id=2)
        assert [r.queue_offset for r in rs] == [0, 1, 2] and {r.queue_id for r in rs} == {2}
        assert len({r.msg_id for r in rs}) == 3
        queues = [p.send("rr", b"x").queue_id for _ in range(6)]
    assert sorted(queues) == [0, 0, 1, 1, 2, 2]
    assert (broker.cfg.store_root / "config" / "topics.json").exists()


def test_send_async_coalesces_into_batches(make_broker: Callable[..., Broker]) -> None:
    broker = make_broker(defaultTopicQueueNums=2)
    n = 2000
    most_in_flight = 0
    with Producer([addr(broker)]) as p:
        batches = p._transport.batches
        send_batch = batches._send_batch

        def counting(key: Any, batch: Any) -> None:
            nonlocal most_in_flight
            send_batch(key, batch)
            most_in_flight = max(most_in_flight, batch.in_flight)

        batches._send_batch = counting  # type: ignore[method-assign]
        p.send("co", b"warm", queue_id=0)
        before = broker.server.stats.requests
        futures = [p.send_async("co", f"m{i}".encode(), queue_id=i % 2) for i in range(n)]
        results = [f.result(30) for f in futures]
        requests = broker.server.stats.requests - before
    assert all(r.status == SendStatus.SEND_OK for r in results)
    for q in (0, 1):  # dense offsets, in the order sent, per queue
        offsets = [r.queue_offset for r in results if r.queue_id == q]
        assert offsets == list(range(offsets[0], offsets[0] + len(offsets)))
    assert requests < n / 4, f"{requests} requests for {n} messages: not coalesced"
    assert most_in_flight == 2, "a queue's second batch never left while its first was out"


LONG_POLL_SUSPEND_MS = 10_000


# answered by the arrival, not by the suspend running out (PR tier); at once (perf: 0.5 s)
@pytest.mark.parametrize("wake_bound_s", tier(LONG_POLL_SUSPEND_MS / 1000 / 2, 0.5))
def test_long_poll_wakes_on_arrival(make_broker: Callable[..., Broker],
                                    wake_bound_s: float) -> None:
    broker = make_broker()
    with Producer([addr(broker)]) as p, Consumer([addr(broker)]) as c:
        p.send("lp", b"first", queue_id=0)
        pool = concurrent.futures.ThreadPoolExecutor(1)
        fut = pool.submit(c.pull, "lp", 0, 1, 32, LONG_POLL_SUSPEND_MS)
        deadline = time.monotonic() + 5
        while broker.server.stats.long_polls == 0:
            assert time.monotonic() < deadline, "pull never parked"
            time.sleep(0.001)
        sent_at = time.monotonic()
        p.send("lp", b"second", queue_id=0)
        pr = fut.result(LONG_POLL_SUSPEND_MS / 1000 + 5)
        woke_after = time.monotonic() - sent_at
        pool.shutdown()
    assert pr.status == PullStatus.FOUND and [m.body for m in pr.messages] == [b"second"]
    print(f"long poll woke {woke_after * 1000:.1f} ms after the send")
    assert woke_after < wake_bound_s


def test_long_poll_times_out_with_no_new_msg(make_broker: Callable[..., Broker]) -> None:
    broker = make_broker()
    suspend_s = 0.3
    with Consumer([addr(broker)]) as c:
        started = time.monotonic()
        pr = c.pull("empty", 0, 0, 32, suspend_ms=int(suspend_s * 1000))
    took = time.monotonic() - started
    # answered at its suspend: not before it (50 ms of slack, as before), not long after
    assert pr.status == PullStatus.NO_NEW_MSG and suspend_s - 0.05 <= took < late_s(suspend_s)


def test_slave_refuses_writes_naming_master(make_broker: Callable[..., Broker]) -> None:
    broker = make_broker(brokerRole="SLAVE", brokerId=1, haMasterAddress="10.1.2.3:10912")
    with Producer([addr(broker)], retries=0) as p:
        p._cluster._master = addr(broker)  # write to the slave directly, as a confused client would
        with pytest.raises(BrokerError) as e:
            p.send("t", b"x", queue_id=0)
    assert e.value.code == ResponseCode.SERVICE_NOT_AVAILABLE
    assert "SLAVE" in e.value.remark and "10.1.2.3:10912" in e.value.remark
    assert broker.store.phy == 0
    with Producer([addr(broker)], retries=0, timeout_ms=500) as p, pytest.raises(BrokerError) as e:
        p.send("t", b"x")  # discovery finds no master (waited for one timeout_ms)
    assert e.value.code == ResponseCode.SERVICE_NOT_AVAILABLE


def test_promote_slave_then_writes_succeed(make_broker: Callable[..., Broker]) -> None:
    broker = make_broker(brokerRole="SLAVE", brokerId=1, haMasterAddress="127.0.0.1:1")
    with Admin([addr(broker)]) as a:
        status = a.promote(addr(broker), role="ASYNC_MASTER")
    assert status["role"] == "ASYNC_MASTER" and status["epoch"] == 256 + 1  # next_epoch(0, id 1)
    assert broker.store.promotions == 1  # the store continued its queue offsets
    with Producer([addr(broker)]) as p:
        assert p.send("t", b"x").status == SendStatus.SEND_OK


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
            s.listen(1)
            return True
        except OSError:
            return False


def test_a_slave_holds_its_ha_port_until_promoted(make_broker: Callable[..., Broker]) -> None:
    """Nothing can take a slave's haListenPort meanwhile (a drill's promotion once found it
    taken); the promoted master's HA service binds it, and shutdown frees it."""
    broker = make_broker(brokerRole="SLAVE", brokerId=1, haMasterAddress="127.0.0.1:1")
    port = broker.cfg.ha_port
    assert not _bindable(port)
    with Admin([addr(broker)]) as a:
        assert a.promote(addr(broker), role="ASYNC_MASTER")["role"] == "ASYNC_MASTER"
    assert not _bindable(port)  # now the HA service's ROUTER
    broker.shutdown()
    assert _bindable(port)


def test_a_failed_promotion_leaves_a_replicating_slave(
    make_broker: Callable[..., Broker], tmp_path: Path
) -> None:
    """A master role that cannot start (here: its HA service) undoes the promotion: the answer
    says so, the broker is a SLAVE with a new HA client, holds its HA port again, its epoch
    history is what it was and writes are still refused; a later promotion succeeds."""
    broker = make_broker(brokerRole="SLAVE", brokerId=1, haMasterAddress="127.0.0.1:1")
    port, root = broker.cfg.ha_port, broker.cfg.store_root
    history = (ep.EpochEntry(256, 0),)  # a term it replicated from its old master
    root.mkdir(parents=True, exist_ok=True)
    ep.save(root, history)
    old_role = broker.role
    assert old_role is not None and old_role.ha_client.running
    real_factory = broker.role_factory

    class FailingMaster:
        name = "SYNC_MASTER"

        def __init__(self) -> None:
            self.stopped = False

        def start(self) -> None:
            raise OSError(98, "Address already in use (as if another process took the port)")

        def stop(self) -> None:
            self.stopped = True

    failing = FailingMaster()
    broker.role_factory = lambda state, b: real_factory(state, b) if state.name == "SLAVE" else failing
    with Admin([addr(broker)], retries=0) as a, pytest.raises(BrokerError) as e:
        a.promote(addr(broker), role="SYNC_MASTER")
    assert e.value.code == ResponseCode.SYSTEM_ERROR
    assert "still a SLAVE" in e.value.remark and "Address already in use" in e.value.remark
    assert failing.stopped
    role = broker.role
    assert role is not None and role is not old_role and role.name == "SLAVE"
    assert role.ha_client.running and not old_role.ha_client.running
    assert not _bindable(port)  # held again
    assert ep.load(root) == history and broker.store.promotions == 1 and broker.store.demotions == 2
    assert not promotion.path_of(root).exists()  # no master term for a restart to resume
    with Producer([addr(broker)], retries=0) as p:
        p._cluster._master = addr(broker)
        with pytest.raises(BrokerError) as refused:
            p.send("t", b"x", queue_id=0)
    assert refused.value.code == ResponseCode.SERVICE_NOT_AVAILABLE and broker.store.phy == 0
    broker.role_factory = real_factory
    with Admin([addr(broker)]) as a:
        status = a.promote(addr(broker), role="ASYNC_MASTER")
    epoch = ep.next_epoch(256, 1)  # the same as the failed attempt would have opened
    assert status["role"] == "ASYNC_MASTER" and status["epoch"] == epoch
    assert ep.last_epoch(ep.load(root)) == epoch


def test_a_slave_whose_ha_port_is_taken_refuses_to_start(
    make_broker: Callable[..., Broker],
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match=f"haListenPort {port} is in use"):
            make_broker(brokerRole="SLAVE", brokerId=1, haMasterAddress="127.0.0.1:1",
                        haListenPort=port)


def test_sync_master_without_replication_reports_slave_not_available(
    make_broker: Callable[..., Broker],
) -> None:
    broker = make_broker(brokerRole="SYNC_MASTER")
    with Producer([addr(broker)]) as p:
        r = p.send("t", b"x", queue_id=0)
    assert r.status == SendStatus.SLAVE_NOT_AVAILABLE and broker.store.phy > 0


def raw_call(address: str, frames: list[bytes], timeout_ms: int = 3000) -> Any:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, timeout_ms)
    try:
        sock.connect(f"tcp://{address}")
        sock.send_multipart(frames)
        return decode_response(
            sock.recv_multipart(), protocol.Limits()
        )
    finally:
        sock.close()
        ctx.term()


def test_malformed_frames_get_typed_errors(make_broker: Callable[..., Broker]) -> None:
    broker = make_broker()
    resp = raw_call(addr(broker), [b"\x93\x01"])
    assert resp.code == ResponseCode.BAD_REQUEST and resp.fields["field"] == "header"
    header = msgpack.packb([PROTOCOL_VERSION, RequestCode.SEND, 77, {"topic": "t", "queueId": -1}])
    resp = raw_call(addr(broker), [header, b"x"])
    assert (resp.code, resp.opaque, resp.fields["field"]) == (
        ResponseCode.BAD_REQUEST,
        77,
        "queueId",
    )
    resp = raw_call(addr(broker), [msgpack.packb([PROTOCOL_VERSION, 4242, 5, {}])])
    assert resp.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED and resp.opaque == 5
    assert broker.store.phy == 0


def test_overload_answers_system_busy(make_broker: Callable[..., Broker]) -> None:
    broker = make_broker(maxInflightRequests=2)
    with Consumer([addr(broker)], timeout_ms=5000) as c:
        pool = concurrent.futures.ThreadPoolExecutor(2)
        parked = [pool.submit(c.pull, "busy", 0, 0, 32, 2000) for _ in range(2)]
        deadline = time.monotonic() + 5
        while broker.server.stats.inflight < 2:
            assert time.monotonic() < deadline
            time.sleep(0.001)
        with Consumer([addr(broker)], retries=0) as c2, pytest.raises(BrokerError) as e:
            c2.pull("busy", 0, 0, 32, 1000)
        assert e.value.code == ResponseCode.SYSTEM_BUSY and e.value.retriable
        assert all(f.result(10).status == PullStatus.NO_NEW_MSG for f in parked)
        pool.shutdown()


def test_drain_answers_parked_polls(make_broker: Callable[..., Broker]) -> None:
    broker = make_broker()
    suspend_s = 20.0
    with Consumer([addr(broker)], retries=0) as c:
        pool = concurrent.futures.ThreadPoolExecutor(1)
        fut = pool.submit(c.pull, "d", 0, 0, 32, int(suspend_s * 1000))
        deadline = time.monotonic() + 5
        # parked, not merely in flight: the client's discovery STATUS counts in flight too,
        # and a drain that ends with it leaves the pull to arrive at a closed loop
        while broker.server.stats.long_polls < 1:
            assert time.monotonic() < deadline
            time.sleep(0.001)
        started = time.monotonic()
        assert broker.server.drain(5.0)
        assert fut.result(5).status == PullStatus.NO_NEW_MSG
        assert time.monotonic() - started < suspend_s / 2  # by the drain, not its suspend
        pool.shutdown()


@pytest.mark.parametrize("blocking", [False, True])
def test_sends_wait_for_a_master_within_their_timeout_without_using_retries(
    make_broker: Callable[..., Broker], blocking: bool
) -> None:
    """A send made while no broker of the group answers (a master restarting) waits for one
    up to its timeout_ms, as Kafka's producer waits for a leader; that uses none of its
    retries (here 0). Both used to fail after the first discovery (~2 s)."""
    port = free_port()
    with Producer([f"127.0.0.1:{port}"], retries=0, timeout_ms=15_000) as p:
        pool = concurrent.futures.ThreadPoolExecutor(1)
        if blocking:
            fut = pool.submit(p.send, "t", b"x", queue_id=0)
        else:
            fut = p.send_async("t", b"x", queue_id=0)
        time.sleep(2.5)  # more than one discovery (2 s) has found nobody
        assert not fut.done()
        make_broker(listenPort=port)
        assert fut.result(20).status == SendStatus.SEND_OK
        pool.shutdown()
    with Producer([f"127.0.0.1:{free_port()}"], retries=0, timeout_ms=1_000) as p:
        started = time.monotonic()
        with pytest.raises(NoMasterError):
            p.send("t", b"x", queue_id=0)
        # the send waits for a master up to its timeout_ms (1 s); the discovery begun last
        # may take its own 1 s (min(timeout_ms, DISCOVERY_TIMEOUT_MS)); then it is out
        assert time.monotonic() - started < late_s(2 * 1.0)


def _restart(make_broker: Callable[..., Broker], broker: Broker, **fields: Any) -> Broker:
    """The same store directory and YAML (plus ``fields``), new ports: a restart."""
    root = broker.cfg.store_root
    broker.shutdown()
    base = {"brokerRole": "SLAVE", "brokerId": 1, "haMasterAddress": "127.0.0.1:1",
            "groupServers": broker.cfg.groupServers}
    return make_broker(**{**base, **fields, "storePathRootDir": str(root)})


def _promoted(make_broker: Callable[..., Broker], peer: Broker | None) -> tuple[Broker, int]:
    """A slave (with ``peer`` as its groupServers) promoted to ASYNC_MASTER, and its epoch."""
    broker = make_broker(brokerRole="SLAVE", brokerId=1, haMasterAddress="127.0.0.1:1",
                         groupServers=addr(peer) if peer is not None else "")
    with Admin([addr(broker)]) as a:
        return broker, a.promote(addr(broker), role="ASYNC_MASTER")["epoch"]


def _slave_peer(make_broker: Callable[..., Broker]) -> Broker:
    return make_broker(brokerRole="SLAVE", brokerId=2, haMasterAddress="127.0.0.1:1")


def test_a_promotion_survives_a_restart_from_the_unchanged_yaml(
    make_broker: Callable[..., Broker],
) -> None:
    """The YAML still says SLAVE of the old master; restarted, the promoted broker asks its
    group (a slave answers), is the master it became, in the epoch its promotion opened (not a
    new one), and takes writes."""
    broker, epoch = _promoted(make_broker, _slave_peer(make_broker))
    record = promotion.load(broker.cfg.store_root)
    assert record is not None and (record.role, record.epoch) == ("ASYNC_MASTER", epoch)
    assert (record.configured_role, record.configured_master) == ("SLAVE", "127.0.0.1:1")
    for _ in range(2):  # and again: resuming does not spend the record
        broker = _restart(make_broker, broker)
        status = broker.status()
        assert (status["role"], status["epoch"]) == ("ASYNC_MASTER", epoch), status
        with Producer([addr(broker)], retries=0) as p:
            assert p.send("t", b"x").status == SendStatus.SEND_OK


def test_a_promotion_replaced_by_a_newer_one_is_not_resumed(
    make_broker: Callable[..., Broker], tmp_path: Path
) -> None:
    """While it was down, another broker was promoted (a newer epoch): with groupServers the
    restarted broker finds that master and joins it as a slave; without, it starts as its YAML
    says. Never a second master."""
    peer_root = tmp_path / "newer"
    peer_root.mkdir()
    newer = make_broker(brokerRole="ASYNC_MASTER", storePathRootDir=str(peer_root))
    broker, epoch = _promoted(make_broker, newer)
    newer.shutdown()
    ep.save(peer_root, (ep.EpochEntry(ep.next_epoch(epoch, 0), 0),))  # promoted after it
    newer = make_broker(brokerRole="ASYNC_MASTER", storePathRootDir=str(peer_root))
    broker = _restart(make_broker, broker, groupServers=addr(newer))
    status = broker.status()
    assert status["role"] == "SLAVE" and status["haMasterAddress"] == newer.status()["haAddress"]
    assert not promotion.path_of(broker.cfg.store_root).exists()  # spent
    broker, _ = _promoted(make_broker, None)
    broker = _restart(make_broker, broker)  # no groupServers
    assert broker.status()["role"] == "SLAVE"
    assert promotion.load(broker.cfg.store_root) is not None  # kept: still the YAML's to end


def test_an_edited_yaml_or_a_newer_epoch_ends_a_recorded_promotion(
    make_broker: Callable[..., Broker],
) -> None:
    broker, epoch = _promoted(make_broker, _slave_peer(make_broker))
    root = broker.cfg.store_root
    # the operator pointed the file at another master: the file decides
    broker = _restart(make_broker, broker, haMasterAddress="127.0.0.1:2")
    assert broker.status()["role"] == "SLAVE"
    # the unchanged file again, but the store has since copied a newer master's epoch
    broker.shutdown()
    ep.save(root, (*ep.load(root), ep.EpochEntry(epoch + 1, 0)))
    broker = _restart(make_broker, broker)
    assert broker.status()["role"] == "SLAVE"


def test_an_unreadable_promotion_record_starts_the_broker_as_configured(
    make_broker: Callable[..., Broker],
) -> None:
    broker, _ = _promoted(make_broker, _slave_peer(make_broker))
    path = promotion.path_of(broker.cfg.store_root)
    broker.shutdown()
    path.write_bytes(b'{"brokerRole": "ASYNC_MASTER", "epoch": "seven"')  # torn
    broker = _restart(make_broker, broker)
    assert broker.status()["role"] == "SLAVE"  # never a second master by accident
    with Admin([addr(broker)]) as a:
        assert a.status(addr(broker))["role"] == "SLAVE"  # and it serves


def test_a_groups_first_heartbeat_makes_its_retry_topic_on_a_master_only(
        make_broker: Callable[..., Broker]) -> None:
    """RocketMQ's heartbeat creates %RETRY%<group> (one queue): members read it before any
    send-back, and a new master has it from the members' next heartbeats. A slave's topics
    are its master's copy: a heartbeat there changes nothing."""
    master = make_broker()
    with Consumer([addr(master)], group="billing") as c:
        c.heartbeat("member-1")
        c.heartbeat("member-1", leave=True)
    assert master.topics.queue_nums("%RETRY%billing") == 1
    slave = make_broker(brokerRole="SLAVE", brokerId=1, haMasterAddress="127.0.0.1:1")
    with Consumer([addr(slave)], group="billing", read_from=addr(slave)) as c:
        c._cluster._master = addr(slave)  # a client that takes the slave for the master
        c.heartbeat("member-1")
    assert slave.topics.queue_nums("%RETRY%billing") == 0
    with Consumer([addr(master)], group="g" * 250) as c:  # its retry topic would be too long
        c.heartbeat("member-1")
    assert master.topics.queue_nums("%RETRY%" + "g" * 250) == 0


# ---- answers held for the controller lease (Broker._reply_gate) ------------------------------
def _lapsed(resp: Any) -> Any:
    return resp._replace(code=ResponseCode.FLUSH_SLAVE_TIMEOUT, remark="lease lapsed")


def test_a_send_ok_held_by_the_gate_leaves_once_the_gate_lets_it(
        make_broker: Callable[..., Broker]) -> None:
    """The answer waits while the gate holds it (a lapsed lease, still master) and leaves as
    SEND_OK as soon as the gate lets it: the put is not turned indeterminate."""
    broker = make_broker()
    confirmed = threading.Event()
    broker.server.reply_hold_s = 30.0
    broker.server.reply_gate = lambda resp, final: resp if confirmed.is_set() or final else None
    with Producer([addr(broker)], retries=0) as p:
        pool = concurrent.futures.ThreadPoolExecutor(1)
        fut = pool.submit(p.send, "held", b"m", queue_id=0)
        deadline = time.monotonic() + 10
        while broker.server.stats.answers_held_for_lease < 1:
            assert time.monotonic() < deadline, "the answer was never held"
            time.sleep(0.005)
        time.sleep(0.2)
        assert not fut.done() and broker.server.stats.inflight >= 1
        confirmed.set()
        assert fut.result(10).status == SendStatus.SEND_OK
        assert broker.server.stats.inflight == 0
        pool.shutdown()


def test_a_held_send_ok_gets_the_gates_final_answer_at_its_deadline(
        make_broker: Callable[..., Broker]) -> None:
    broker = make_broker()
    broker.server.reply_hold_s = 0.3
    broker.server.reply_gate = lambda resp, final: _lapsed(resp) if final else None
    with Producer([addr(broker)], retries=0) as p:
        started = time.monotonic()
        r = p.send("held", b"m", queue_id=0)
        assert r.status == SendStatus.FLUSH_SLAVE_TIMEOUT
        assert time.monotonic() - started >= 0.3
    assert broker.server.stats.answers_held_for_lease == 1 and broker.server.stats.inflight == 0


def test_a_drain_gives_held_answers_the_gates_final_word(
        make_broker: Callable[..., Broker]) -> None:
    broker = make_broker()
    broker.server.reply_hold_s = 60.0
    broker.server.reply_gate = lambda resp, final: _lapsed(resp) if final else None
    with Producer([addr(broker)], retries=0) as p:
        pool = concurrent.futures.ThreadPoolExecutor(1)
        fut = pool.submit(p.send, "held", b"m", queue_id=0)
        deadline = time.monotonic() + 10
        while broker.server.stats.answers_held_for_lease < 1:
            assert time.monotonic() < deadline
            time.sleep(0.005)
        assert broker.server.drain(5.0)  # the held answer counts in flight: it is answered
        assert fut.result(5).status == SendStatus.FLUSH_SLAVE_TIMEOUT
        pool.shutdown()


class _Lease:
    def __init__(self, master: bool, fresh: bool):
        self.master, self.fresh = master, fresh
        self.stats = types.SimpleNamespace(fenced_writes=0)

    def acknowledge_ok(self) -> bool:
        return self.master and self.fresh

    def is_master(self) -> bool:
        return self.master


@pytest.mark.parametrize(("master", "fresh", "final", "want"), [
    (True, True, False, "ok"),
    (True, True, True, "ok"),
    (True, False, False, "hold"),  # lapsed, still master: its session may be confirmed again
    (True, False, True, "flush"),  # the hold ended: indeterminate
    (False, False, False, "flush"),  # no longer master (session lost, replaced): never OK
])
def test_the_broker_gate_holds_only_a_master_whose_lease_lapsed(
        master: bool, fresh: bool, final: bool, want: str) -> None:
    gate_owner = types.SimpleNamespace(controller=_Lease(master, fresh))
    resp = protocol.Response(ResponseCode.SUCCESS, 7, "", {"msgId": "x"}, [])
    out = Broker._reply_gate(gate_owner, resp, final)  # type: ignore[arg-type]
    if want == "ok":
        assert out is resp
    elif want == "hold":
        assert out is None and gate_owner.controller.stats.fenced_writes == 0
    else:
        assert out is not None and out.code == ResponseCode.FLUSH_SLAVE_TIMEOUT
        assert gate_owner.controller.stats.fenced_writes == 1
