"""Local mode's sends (``common/proxy/local.py``, ``common/broker/local_calls.py``): the gRPC
front end in the broker hands a plain message to its own request server in-process; what it
cannot take there (a message group, a delivery time, a topic it does not have, a retriable
refusal) goes through the front end's Producer, and a refusal that is final is answered as
the broker gave it."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import msgpack
import pytest
from helpers.brokers import addr, free_port
from helpers.fake_slave import FakeSlave, ha_service
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc
from rocketmq.grpc_protocol import service_pb2_grpc

from common.broker.broker import Broker
from common.broker.local_calls import IDENTITY, LocalCall, LocalCalls
from common.client import Admin, Consumer, Producer
from common.client.in_process import call_in_process
from common.client.results import ClientTimeoutError
from common.client.transport import Transport
from common.core.errors import BrokerError, ResponseCode
from common.core.message import PROPERTY_UNIQ_KEY
from common.format.protocol import (
    Limits,
    RequestCode,
    Response,
    decode_request,
    encode_request,
    encode_response,
)
from common.proxy.local import LocalBroker, LocalSend
from common.proxy.service import MessagingService

pytestmark = [pytest.mark.unit, pytest.mark.timeout(120)]


@pytest.fixture
def broker(make_broker: Callable[..., Broker]) -> Broker:
    b = make_broker(real_store=True, brokerName="gl", grpcServerPort=free_port(),
                    defaultTopicQueueNums=2)
    with Admin([addr(b)]) as admin:
        admin.create_topic("orders", 2)
        admin.create_topic("fifo", 2, attributes={"message.type": "FIFO"})
    return b


@pytest.fixture
def stub(broker: Broker) -> Iterator[service_pb2_grpc.MessagingServiceStub]:
    with grpc.insecure_channel(f"127.0.0.1:{broker.cfg.grpcServerPort}") as ch:
        yield service_pb2_grpc.MessagingServiceStub(ch)


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def service(broker: Broker) -> MessagingService:
    grpc_front = broker._grpc
    assert grpc_front is not None and grpc_front.service is not None
    return grpc_front.service


def front_loop(broker: Broker) -> asyncio.AbstractEventLoop:
    loop = broker._grpc._loop if broker._grpc is not None else None
    assert loop is not None
    return loop


def send(stub: service_pb2_grpc.MessagingServiceStub, topic: str, body: bytes,
         **system: Any) -> rpc.SendResultEntry:
    msg = pb.Message(topic=pb.Resource(name=topic), body=body, system_properties=pb.
                     SystemProperties(message_id=f"id-{body.decode()}", body_encoding=pb.IDENTITY,
                                      **system))
    resp = stub.SendMessage(rpc.SendMessageRequest(messages=[msg]), timeout=10)
    [entry] = resp.entries
    return entry


def stored(broker: Broker, topic: str, count: int = 0) -> list[Any]:
    """The topic's messages once ``count`` are readable: a SEND_OK does not promise its
    record is dispatched yet (the thread that appended dispatches right after, unless the
    reput thread is mid-pass, which then does), as in RocketMQ."""
    got: list[Any] = []

    def readable() -> bool:
        with Consumer([addr(broker)]) as c:
            got[:] = [m for q in range(2) for m in c.pull(topic, q, 0, 64).messages]
        return len(got) >= count

    wait_for(readable, f"{count} messages of {topic}")
    return got


def test_a_plain_send_is_stored_in_process_with_the_front_ends_born_host(
        broker: Broker, stub: service_pb2_grpc.MessagingServiceStub) -> None:
    local = service(broker).local
    assert local is not None
    entries = [send(stub, "orders", b"m%d" % i, tag="A") for i in range(4)]
    assert [e.status.code for e in entries] == [pb.OK] * 4
    assert (local.sent, local.passed_on) == (4, 0)  # not one through the client socket
    got = stored(broker, "orders", 4)
    assert sorted(m.body for m in got) == [b"m0", b"m1", b"m2", b"m3"]
    assert {m.queue_id for m in got} == {0, 1}  # spread over the topic's queues
    assert all(m.tags == "A" for m in got)
    assert {m.born_host for m in got} == {f"127.0.0.1:{broker.cfg.grpcServerPort}"}
    assert {e.message_id for e in entries} == {m.properties[PROPERTY_UNIQ_KEY] for m in got}
    assert broker.server.local.pending() == 0


def test_what_the_broker_cannot_take_at_once_goes_through_the_producer(
        broker: Broker, stub: service_pb2_grpc.MessagingServiceStub) -> None:
    local = service(broker).local
    assert local is not None
    # a message group and a delivery time are the Producer's (its hash, its timer fields)
    assert send(stub, "fifo", b"g1", message_group="g", message_type=pb.FIFO).status.code \
        == pb.OK
    delay = pb.SystemProperties().delivery_timestamp
    delay.GetCurrentTime()
    assert send(stub, "orders", b"d1", delivery_timestamp=delay,
                message_type=pb.DELAY).status.code == pb.OK
    assert (local.sent, local.passed_on) == (0, 0)
    # a topic this broker does not have: the Producer auto-creates it as for any client
    assert send(stub, "fresh", b"f1").status.code == pb.OK
    assert (local.sent, local.passed_on) == (0, 1)
    assert [m.body for m in stored(broker, "fresh", 1)] == [b"f1"]


def test_a_final_refusal_is_answered_as_the_broker_gave_it(
        broker: Broker, stub: service_pb2_grpc.MessagingServiceStub) -> None:
    local = service(broker).local
    assert local is not None
    entry = send(stub, "fifo", b"nogroup")  # a FIFO topic takes no message without a group
    assert entry.status.code != pb.OK and "group" in entry.status.message
    assert (local.sent, local.passed_on) == (0, 0)  # not retried elsewhere
    assert stored(broker, "fifo") == []


def test_a_receive_its_ack_and_a_delayed_send_go_in_process_too(
        broker: Broker, stub: service_pb2_grpc.MessagingServiceStub) -> None:
    with Producer([addr(broker)]) as p:
        for i in range(3):
            p.send("orders", b"r%d" % i)
    calls = broker.server.local
    before = calls.calls
    req = rpc.ReceiveMessageRequest(group=pb.Resource(name="g"), batch_size=32, message_queue=
                                    pb.MessageQueue(topic=pb.Resource(name="orders"),
                                                    broker=pb.Broker(name="gl")))
    req.invisible_duration.seconds = 60
    got: list[Any] = []
    receives = 0
    while len(got) < 3:  # a POP takes from one queue at a time
        assert receives < 10
        got += [r.message for r in stub.ReceiveMessage(req, timeout=10)
                if r.HasField("message")]
        receives += 1
    assert sorted(m.body for m in got) == [b"r0", b"r1", b"r2"]
    assert calls.calls == before + receives  # one POP each, in-process
    before += receives
    ack = stub.AckMessage(rpc.AckMessageRequest(
        group=pb.Resource(name="g"), topic=pb.Resource(name="orders"),
        entries=[rpc.AckMessageEntry(receipt_handle=m.system_properties.receipt_handle,
                                     message_id=m.system_properties.message_id)
                 for m in got]), timeout=10)
    assert ack.status.code == pb.OK and calls.calls == before + 1
    delay = pb.SystemProperties().delivery_timestamp
    delay.GetCurrentTime()
    assert send(stub, "orders", b"later", delivery_timestamp=delay,
                message_type=pb.DELAY).status.code == pb.OK
    assert calls.calls == before + 2  # Producer.send's SEND, by its in_process
    assert calls.pending() == 0


# ---- LocalSend over a broker it does not run in ---------------------------------------------
class Answering:
    """LocalCalls' stand-in: answers each call with what ``answer_with`` makes of it."""

    def __init__(self, answer_with: Callable[[Any], Response | BrokerError]):
        self.answer_with = answer_with
        self.requests: list[Any] = []

    def call(self, frames_of: Callable[[int], list[bytes]], answer: Callable[[Any], None]) -> None:
        req = decode_request(frames_of(5), Limits())
        self.requests.append(req)
        threading.Thread(target=answer, args=(self.answer_with(req),)).start()


def local_send(calls: Any, master: bool = True, queues: int = 3) -> LocalSend:
    broker = LocalBroker(calls, (), "gl", lambda _topic: queues, lambda: master)
    return LocalSend(broker, Producer(["127.0.0.1:1"]))


def run(local: LocalSend) -> Any:
    try:
        return asyncio.run(local.send("orders", b"body", None, None, {"UNIQ_KEY": "u"}))
    finally:
        local.producer.close()


def test_a_retriable_refusal_is_passed_on_and_a_final_one_raised() -> None:
    busy = local_send(Answering(lambda req: Response(ResponseCode.SYSTEM_BUSY, req.opaque,
                                                     "busy", {}, [])))
    assert run(busy) is None and (busy.sent, busy.passed_on) == (0, 1)
    stopped = local_send(Answering(lambda req: BrokerError(
        ResponseCode.SERVICE_NOT_AVAILABLE, "stopped")))
    assert run(stopped) is None and stopped.passed_on == 1
    illegal = local_send(Answering(lambda req: Response(ResponseCode.MESSAGE_ILLEGAL,
                                                       req.opaque, "no", {}, [])))
    with pytest.raises(BrokerError) as e:
        run(illegal)
    assert e.value.code == ResponseCode.MESSAGE_ILLEGAL and illegal.passed_on == 0


def test_the_request_is_the_producers_and_a_slave_or_a_topic_without_queues_is_passed_on(
        ) -> None:
    ok = Answering(lambda req: Response(ResponseCode.SUCCESS, req.opaque, "", {
        "storeHost": "0" * 16, "commitLogOffset": 10, "queueId": req.fields["queueId"],
        "queueOffset": 0}, []))
    local = local_send(ok)
    result = run(local)
    [req] = ok.requests
    assert req.code == RequestCode.SEND and req.fields["topic"] == "orders"
    assert req.bodies == [b"body"] and req.fields["properties"] == {"UNIQ_KEY": "u"}
    assert result.queue_id == req.fields["queueId"] < 3 and result.broker_name == "gl"
    for slave_or_none in (local_send(ok, master=False), local_send(ok, queues=0)):
        assert run(slave_or_none) is None and slave_or_none.passed_on == 1
    assert len(ok.requests) == 1  # neither was asked of the broker


# ---- the clients' in_process ------------------------------------------------------------------
class Recording:
    """A broker's in-process calls that answer SUCCESS, or never (``silent``)."""

    def __init__(self, silent: bool = False):
        self.silent = silent
        self.codes: list[RequestCode] = []

    def call(self, frames_of: Callable[[int], list[bytes]], answer: Callable[[Any], None]) -> None:
        _version, code, opaque, _fields = msgpack.unpackb(frames_of(9)[0])
        self.codes.append(RequestCode(code))
        if not self.silent:
            answer(Response(ResponseCode.SUCCESS, opaque, "in-process", {}, []))


def test_a_clients_in_process_broker_takes_only_calls_that_leave_no_trace() -> None:
    here, there = Recording(), "127.0.0.1:1"
    t = Transport(in_process={there: here})
    try:
        resp = t.call_sync(there, RequestCode.POP_MESSAGE, {"topic": "t"}, timeout_ms=500)
        assert resp.remark == "in-process" and here.codes == [RequestCode.POP_MESSAGE]
        # a producer's heartbeat registers its connection for the broker's own requests: a socket's
        with pytest.raises(BrokerError):
            t.call_sync(there, RequestCode.PRODUCER_HEARTBEAT, {"group": "g"}, timeout_ms=300)
        assert here.codes == [RequestCode.POP_MESSAGE]
    finally:
        t.close()


def test_an_in_process_call_not_answered_in_time_times_out() -> None:
    started = time.monotonic()
    with pytest.raises(ClientTimeoutError):
        call_in_process(Recording(silent=True), "127.0.0.1:1", RequestCode.SEND,
                        {"topic": "t"}, [b"x"], 200)
    assert 0.2 <= time.monotonic() - started < 2.0


# ---- LocalCalls -------------------------------------------------------------------------------
def test_local_calls_answer_by_opaque_and_fail_what_waits_when_closed() -> None:
    posted: list[Any] = []
    calls = LocalCalls(posted.append, Limits())
    got: dict[str, Any] = {}
    assert len(IDENTITY) > 255  # no ZeroMQ routing id is this long
    calls.call(lambda op: [b"a", b"%d" % op], lambda out: got.__setitem__("a", out))
    calls.call(lambda op: [b"b", b"%d" % op], lambda out: got.__setitem__("b", out))
    assert all(type(item) is LocalCall for item in posted)
    op_a, op_b = (int(item.frames[1]) for item in posted)
    assert op_a != op_b and calls.pending() == 2
    calls.deliver(encode_response(ResponseCode.SUCCESS, op_b, "for b"))
    assert got["b"].remark == "for b" and "a" not in got
    calls.deliver(encode_response(ResponseCode.SUCCESS, 999_999, "nobody's"))  # dropped
    calls.close("stopped")
    assert isinstance(got["a"], BrokerError) and got["a"].retriable
    assert calls.pending() == 0
    with pytest.raises(BrokerError) as e:
        calls.call(lambda op: [b"c"], lambda out: None)
    assert e.value.code == ResponseCode.SERVICE_NOT_AVAILABLE


def test_a_call_the_mailbox_refuses_is_not_left_waiting() -> None:
    def full(_item: Any) -> None:
        raise BrokerError(ResponseCode.SYSTEM_BUSY, "server mailbox full")

    calls = LocalCalls(full, Limits())
    with pytest.raises(BrokerError):
        calls.call(lambda op: [b"x"], lambda out: None)
    assert calls.pending() == 0


def test_calls_made_together_are_answered_each_and_refused_each() -> None:
    """``call_many``: each call its opaque and its own answer; a closed LocalCalls answers
    each SERVICE_NOT_AVAILABLE, and a mailbox that fills midway answers the rest its error
    (the ones posted before stay waiting for theirs)."""
    posted: list[Any] = []
    calls = LocalCalls(posted.append, Limits())
    got: dict[int, Any] = {}
    calls.call_many([(lambda op, i=i: [b"%d" % i, b"%d" % op],
                      lambda out, i=i: got.__setitem__(i, out)) for i in range(3)])
    assert [item.frames[0] for item in posted] == [b"0", b"1", b"2"]  # in order
    opaques = [int(item.frames[1]) for item in posted]
    assert len(set(opaques)) == 3 and calls.pending() == 3
    for i in (2, 0, 1):
        calls.deliver(encode_response(ResponseCode.SUCCESS, opaques[i], f"for {i}"))
    assert [got[i].remark for i in range(3)] == ["for 0", "for 1", "for 2"]

    room = [1]

    def filling(item: Any) -> None:
        if not room[0]:
            raise BrokerError(ResponseCode.SYSTEM_BUSY, "server mailbox full")
        room[0] -= 1

    full = LocalCalls(filling, Limits())
    answers: dict[int, Any] = {}
    full.call_many([(lambda op: [b"x"], lambda out, i=i: answers.__setitem__(i, out))
                    for i in range(3)])
    assert sorted(answers) == [1, 2] and full.pending() == 1  # the first one was posted
    assert all(answers[i].code == ResponseCode.SYSTEM_BUSY for i in (1, 2))
    full.close("stopped")
    assert answers[0].code == ResponseCode.SERVICE_NOT_AVAILABLE
    closed: list[Any] = []
    full.call_many([(lambda op: [b"y"], closed.append)] * 2)
    assert [c.code for c in closed] == [ResponseCode.SERVICE_NOT_AVAILABLE] * 2


def test_sends_of_one_turn_of_the_event_loop_are_one_burst_in_the_broker(
        broker: Broker, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under load (other callbacks ready in the turn) the front end's plain sends wait for the
    turn's end and go to the broker together, in one call of the server: one native put takes
    them all where the C extension is built (else ``_serve`` each), each answered with its own
    queue offset, all readable."""
    front = service(broker)
    local = front.local
    assert local is not None
    server = broker.server
    path = server.put_path_of()

    async def many(attempt: int) -> list[Any]:
        loop = asyncio.get_running_loop()
        loop.call_soon(lambda: None)  # another callback ready: a loaded turn
        return await asyncio.gather(*(local.send("orders", b"burst-%d-%d" % (attempt, i), None,
                                                 None, {PROPERTY_UNIQ_KEY: f"u{attempt}-{i}"})
                                      for i in range(8)))

    bursts: list[int] = []  # the native path's calls, each with how many it was offered
    served: list[int] = []  # the server's calls for several local calls, each with how many
    if path is not None:
        take = path.take

        def counted(burst: Any, start: int, *args: Any) -> Any:
            bursts.append(len(burst) - start)
            return take(burst, start, *args)

        monkeypatch.setattr(path, "take", counted)
    serve_many = server.local._serve_many
    assert serve_many is not None

    def serving(many: list[list[bytes]]) -> bool:
        served.append(len(many))
        return serve_many(many)

    monkeypatch.setattr(server.local, "_serve_many", serving)
    for attempt in range(10):  # the I/O thread met awake posts the calls: tried again
        inline, together = server.local.inline, local.together
        bursts.clear()
        served.clear()
        results = asyncio.run_coroutine_threadsafe(many(attempt),
                                                   front_loop(broker)).result(20)
        assert all(r is not None and r.status.name == "SEND_OK" for r in results)
        assert local.together - together == 8 and served == [8]
        offsets = sorted((r.queue_id, r.queue_offset) for r in results)
        assert len(set(offsets)) == 8
        if server.local.inline - inline == 8:
            break
    else:
        pytest.fail("10 bursts to an idle broker, none served on the front end's thread")
    if path is not None:
        assert bursts == [8]  # served on the loop's thread, in one call of the native path
    bodies = {m.body for m in stored(broker, "orders", 8 * (attempt + 1))}
    assert {b"burst-%d-%d" % (attempt, i) for i in range(8)} <= bodies


def test_a_send_alone_in_its_turn_is_served_at_once(broker: Broker) -> None:
    front = service(broker)
    local = front.local
    assert local is not None
    together = local.together
    result = asyncio.run_coroutine_threadsafe(
        local.send("orders", b"alone", None, None, {}), front_loop(broker)).result(20)
    assert result is not None and local.together == together


def test_a_call_made_while_the_loop_sleeps_is_served_on_the_callers_thread(
        broker: Broker) -> None:
    """No hand-off to the I/O thread and back: the answer is there before ``call`` returns,
    given on the caller's thread, and the record is readable. (An idle loop sleeps nearly
    all the time; a call that meets it awake is posted, and the next one tried.)"""
    server = broker.server
    for attempt in range(20):
        before = server.local.inline
        got: list[Any] = []
        answered_on: list[int] = []

        def answer(out: Any, got: list[Any] = got, on: list[int] = answered_on) -> None:
            got.append(out)
            on.append(threading.get_ident())

        body = b"inline-%d" % attempt
        server.local.call(lambda op, body=body: encode_request(
            RequestCode.SEND, op, {"topic": "orders", "queueId": 0}, [body]), answer)
        if server.local.inline == before + 1:
            break
        wait_for(lambda got=got: bool(got), "a posted call's answer")
    else:
        pytest.fail("20 calls to an idle broker, none served on the caller's thread")
    assert got and got[0].code == ResponseCode.SUCCESS, got  # before call returned
    assert answered_on == [threading.get_ident()]
    assert body in [m.body for m in stored(broker, "orders", attempt + 1)]


def test_a_call_made_during_the_loops_turn_is_posted_and_served_there(
        broker: Broker) -> None:
    """The turn lock held (as the loop holds it while it works): the call is posted, not
    served beside the loop, and answered on the I/O thread once the turn is let go."""
    server = broker.server
    before = server.local.inline
    got: list[Any] = []
    answered_on: list[int] = []

    def answer(out: Any) -> None:
        got.append(out)
        answered_on.append(threading.get_ident())

    assert server._turn.acquire(timeout=5)
    try:
        server.local.call(lambda op: encode_request(RequestCode.SEND, op, {
            "topic": "orders", "queueId": 1}, [b"posted"]), answer)
        time.sleep(0.2)
        assert not got and server.local.inline == before and server.local.pending() == 1
    finally:
        server._turn.release()
    wait_for(lambda: bool(got), "the posted call's answer")
    assert got[0].code == ResponseCode.SUCCESS, got
    assert answered_on != [threading.get_ident()]


def test_a_sync_put_served_inline_is_streamed_and_answered_at_its_deadline(
        make_broker: Callable[..., Broker]) -> None:
    """A SYNC put served on the caller's thread, for a slave that never acks: the append
    pokes the HA service, which streams the record on the I/O thread, and the loop answers
    FLUSH_SLAVE_TIMEOUT at the wait's deadline (slaveTimeout 300 ms). This does not show that
    ``_serve_local``'s recheck wakes the loop: unwoken, the loop's longest sleep (100 ms)
    would still answer within the bound checked here. A put that meets the loop awake is
    posted, answered the same, and tried again."""
    with sync_master_and_slave(make_broker, "gw", slaveTimeout=300,
                               haMaxTimeSlaveNotCatchup=20_000) as (b, slave):
        for attempt in range(5):
            got: list[Any] = []
            inline = b.server.local.inline
            started = time.monotonic()
            b.server.local.call(lambda op: encode_request(RequestCode.SEND, op, {
                "topic": "orders", "queueId": 0}, [b"w"]), got.append)
            slave.data()  # streamed by the I/O thread, poked by the append
            wait_for(lambda got=got: bool(got), "the held put's answer", timeout_s=10)
            took = time.monotonic() - started
            assert got[0].code == ResponseCode.FLUSH_SLAVE_TIMEOUT, got
            assert 0.3 <= took < 2.0, took
            if b.server.local.inline == inline + 1:
                break
        else:
            pytest.fail("5 puts to an idle broker, none served on the caller's thread")


@contextlib.contextmanager
def sync_master_and_slave(make_broker: Callable[..., Broker], name: str,
                          **cfg: Any) -> Iterator[tuple[Broker, FakeSlave]]:
    """A SYNC_MASTER with gRPC and topic ``orders``, and a fake slave in sync (acking only
    when told)."""
    b = make_broker(real_store=True, brokerName=name, brokerRole="SYNC_MASTER",
                    grpcServerPort=free_port(), **cfg)
    with Admin([addr(b)]) as admin:
        admin.create_topic("orders", 1)
    slave = FakeSlave(b)
    try:
        slave.hello()
        wait_for(lambda: ha_service(b).in_sync_count() == 1, "the fake slave in sync")
        yield b, slave
    finally:
        slave.close()


@contextlib.contextmanager
def sync_master(make_broker: Callable[..., Broker]) -> Iterator[
        tuple[Broker, FakeSlave, service_pb2_grpc.MessagingServiceStub]]:
    """A SYNC_MASTER with gRPC, a fake slave in sync (acking only when told), and a stub."""
    with sync_master_and_slave(make_broker, "gs", slaveTimeout=20_000) as (b, slave), \
            grpc.insecure_channel(f"127.0.0.1:{b.cfg.grpcServerPort}") as ch:
        yield b, slave, service_pb2_grpc.MessagingServiceStub(ch)


def test_a_sync_masters_local_send_waits_for_its_slave_and_a_stop_answers_it(
        make_broker: Callable[..., Broker]) -> None:
    with sync_master(make_broker) as (b, slave, stub), \
            concurrent.futures.ThreadPoolExecutor(2) as pool:
        first = pool.submit(send, stub, "orders", b"s1")
        data = slave.data()  # streamed once the local call's turn ended
        end = data.phy_offset + len(data.data)
        assert end == b.store.max_phy_offset
        assert not first.done()  # a SYNC put is not answered before an ack covers it
        slave.ack(end)
        assert first.result(10).status.code == pb.OK
        second = pool.submit(send, stub, "orders", b"s2")
        slave.data()
        assert not second.done()
        b.server.stop(5.0)  # held, never acked: the stop gives it its final answer
        entry = second.result(10)
        assert entry.status.code == pb.SLAVE_PERSISTENCE_TIMEOUT, entry.status
    local = service(b).local
    assert local is not None and (local.sent, local.passed_on) == (2, 0)
    assert b.server.local.pending() == 0
    with pytest.raises(BrokerError) as e:  # the loop has ended: refused at once
        b.server.local.call(lambda op: [b"x"], lambda out: None)
    assert e.value.code == ResponseCode.SERVICE_NOT_AVAILABLE and e.value.retriable


def test_a_sync_masters_burst_of_sends_waits_for_its_slave_as_one_run(
        make_broker: Callable[..., Broker]) -> None:
    """A loaded turn's sends to a SYNC_MASTER: one native run, held until the slave's ack
    covers its last byte, then each answered SEND_OK on the event loop."""
    with sync_master(make_broker) as (b, slave, _stub):
        local = service(b).local
        assert local is not None

        async def burst() -> list[Any]:
            asyncio.get_running_loop().call_soon(lambda: None)  # a loaded turn
            return await asyncio.gather(*(local.send("orders", b"sync-%d" % i, None, None, {})
                                          for i in range(4)))

        together = local.together
        sent = asyncio.run_coroutine_threadsafe(burst(), front_loop(b))
        slave.data()  # streamed
        time.sleep(0.2)
        assert not sent.done()  # held: no ack covers them yet
        deadline = time.monotonic() + 10
        while not sent.done() and time.monotonic() < deadline:  # (a posted burst streams
            slave.ack(b.store.max_phy_offset)  # its sends one by one: ack what is there)
            time.sleep(0.05)
        results = sent.result(10)
        assert [r.status.name for r in results] == ["SEND_OK"] * 4
        assert local.together - together == 4


def test_a_held_local_send_answered_after_the_front_end_stopped_harms_nothing(
        make_broker: Callable[..., Broker]) -> None:
    """Broker.shutdown stops the gRPC front end before the server drains: the SYNC put it
    left held is answered into a closed event loop, which must not stop the I/O thread."""
    with sync_master(make_broker) as (b, slave, stub), \
            concurrent.futures.ThreadPoolExecutor(1) as pool:
        held = pool.submit(send, stub, "orders", b"h1")
        slave.data()
        assert b.server.local.pending() == 1
        assert b._grpc is not None
        b._grpc.stop()  # as Broker.shutdown does first
        with pytest.raises(grpc.RpcError):
            held.result(10)
    b.server.stop(5.0)
    assert b.server.failure == "" and b.server.local.pending() == 0
