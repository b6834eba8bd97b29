"""Property injection through the strings a producer sends: ``tags``, ``keys`` and a batch's
per-message tags and keys become ``name\\x01value\\x02`` in the record's properties, so a
separator in one of them would add properties of the client's choosing (a second
``REAL_TOPIC``, ``__TIMER_TICK``, ``__POP``...: the last one wins when read). Every such send is
refused, over the client port and over gRPC, and nothing is stored anywhere."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import grpc
import pytest
from helpers.brokers import addr, free_port, wait_for
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc
from rocketmq.grpc_protocol import service_pb2_grpc

from common.broker.broker import Broker
from common.client import Admin, Consumer, Producer
from common.core.errors import BrokerError, ResponseCode
from common.core.message import Message
from common.core.pop import revive_topic
from common.core.timer import TIMER_TICK, RecallHandle
from common.format.protocol import RequestCode

pytestmark = [pytest.mark.unit, pytest.mark.timeout(120)]

INTO_VICTIM = "t\x02REAL_TOPIC\x01victim"
YEAR_2100_MS = "4102444800000"


@pytest.fixture
def broker(make_broker: Callable[..., Broker]) -> Broker:
    b = make_broker(real_store=True, brokerName="ib", grpcServerPort=free_port(),
                    messageDelayLevel="1s 2s", timerPrecisionMs=100)
    with Admin([addr(b)]) as admin:
        admin.create_topic("mine", 1)
        admin.create_topic("victim", 1)
    return b


def stored(broker: Broker, topic: str) -> list[Any]:
    with Consumer([addr(broker)], group="g") as c:
        return list(c.pull(topic, 0, 0, 64).messages)


def refused(send: Callable[[], object]) -> BrokerError:
    with pytest.raises(BrokerError) as e:
        send()
    assert e.value.code == ResponseCode.BAD_REQUEST, e.value
    assert "\\x01 or \\x02" in e.value.remark
    return e.value


def test_a_delayed_or_timer_send_cannot_name_another_real_topic(broker: Broker) -> None:
    with Producer([addr(broker)]) as p:
        refused(lambda: p.send("mine", b"lvl", tags=INTO_VICTIM, queue_id=0, delay_level=1))
        refused(lambda: p.send("mine", b"tmr", tags=INTO_VICTIM, queue_id=0, delay=100))
        refused(lambda: p.send("mine", b"key", keys=["k\x02REAL_TOPIC\x01victim"], queue_id=0,
                               delay_level=1))
        p.send("mine", b"due", queue_id=0, delay_level=1)  # the delay service still works
    wait_for(lambda: stored(broker, "mine"), "the delayed message's delivery")
    assert [m.body for m in stored(broker, "mine")] == [b"due"]
    assert stored(broker, "victim") == []


def test_a_plain_send_cannot_carry_a_timer_tick_or_a_real_queue(broker: Broker) -> None:
    with Producer([addr(broker)]) as p:
        refused(lambda: p.send("mine", b"x", tags=f"t\x02{TIMER_TICK}\x01{YEAR_2100_MS}",
                               queue_id=0))
        refused(lambda: p.send("mine", b"x", tags="t\x02REAL_QID\x01-1", queue_id=0, delay=100))
        refused(lambda: p.send("mine", b"x", tags="t\x02REAL_QID\x01-1", queue_id=0,
                               delay_level=1))
    assert stored(broker, "mine") == []
    status = broker.store.timer_status()
    assert status["pending"] == 0


def test_a_delayed_send_cannot_forge_a_pop_record(broker: Broker) -> None:
    revive = revive_topic(broker.cfg.brokerClusterName)
    ck = (f"ck\x02REAL_TOPIC\x01{revive}\x02REAL_QID\x010\x02__POP\x01ck")
    with Producer([addr(broker)]) as p:
        refused(lambda: p.send("mine", b"\x80", tags=ck, queue_id=0, delay_level=1))


def test_a_batch_entry_cannot_carry_a_separator(broker: Broker) -> None:
    with Producer([addr(broker)]) as p:
        for tags, keys in ((INTO_VICTIM, None), (None, "k\x02__TRAN_HALF\x015")):
            msgs = [Message("mine", b"ok"), Message("mine", b"bad", tags=tags, keys=keys)]
            refused(lambda m=msgs: p.send_batch("mine", m, queue_id=0))  # type: ignore[misc]
    assert stored(broker, "mine") == []


def test_a_recall_handle_cannot_carry_properties_into_its_marker(broker: Broker) -> None:
    """The handle's message key goes into the marker's TIMER_DEL_UNIQKEY."""
    due = int(time.time() * 1000) + 60_000
    handle = RecallHandle("mine", "ib", due, "K\x02REAL_QID\x01-1").encode()
    with Producer([addr(broker)]) as p:
        resp = p._routed("mine", 0, None, None, lambda c, a, _m: c.request(
            a, RequestCode.RECALL_MESSAGE, {"topic": "mine", "recallHandle": handle}))
    assert resp.code == ResponseCode.MESSAGE_ILLEGAL and "message key" in resp.remark
    assert broker.store.timer_status()["pending"] == 0


def test_a_raw_send_is_refused_by_the_decoder_whatever_the_client(broker: Broker) -> None:
    """The codec refuses it, not a client-side check: a raw request as any client makes."""
    answers = []
    with Producer([addr(broker)]) as p:
        for fields in ({"tags": INTO_VICTIM}, {"keys": "a\x01b"}):
            answers.append(p._routed("mine", 0, None, None, lambda c, a, _m, f=fields: c.request(
                a, RequestCode.SEND, {"topic": "mine", "queueId": 0, **f}, [b"x"])))
    assert [(r.code, r.fields.get("field")) for r in answers] == [
        (ResponseCode.BAD_REQUEST, "tags"), (ResponseCode.BAD_REQUEST, "keys")]
    assert stored(broker, "mine") == []


def test_grpc_send_message_with_a_separator_in_its_tag_or_keys_is_refused(
        broker: Broker) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{broker.cfg.grpcServerPort}") as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        for tag, keys in ((INTO_VICTIM, []), ("t", ["k\x02REAL_TOPIC\x01victim"])):
            props = pb.SystemProperties(tag=tag, keys=keys, message_id="01AB",
                                        message_type=pb.DELAY, body_encoding=pb.IDENTITY)
            props.delivery_timestamp.FromMilliseconds(int(time.time() * 1000) + 200)
            msg = pb.Message(topic=pb.Resource(name="mine"), body=b"x",
                             system_properties=props)
            resp = stub.SendMessage(rpc.SendMessageRequest(messages=[msg]), timeout=10)
            assert resp.status.code == pb.BAD_REQUEST, resp.status
            assert "\\x01 or \\x02" in resp.status.message
    assert broker.store.timer_status()["pending"] == 0  # nothing held to deliver
    assert stored(broker, "mine") == [] and stored(broker, "victim") == []


def test_a_producer_may_not_set_the_schedules_mark_or_the_record_crc(broker: Broker) -> None:
    """__SCHED_SRC would tell the delay service a message was delivered; __CRC32# at the end
    of the properties would make readers check a CRC never computed."""
    with Producer([addr(broker)]) as p:
        for name in ("__SCHED_SRC", "__CRC32#"):
            with pytest.raises(BrokerError) as e:
                p.send("mine", b"x", queue_id=0, properties={name: "0000000000"})
            assert e.value.code == ResponseCode.MESSAGE_ILLEGAL and name in e.value.remark
            with pytest.raises(BrokerError) as batch:
                p.send_batch("mine", [Message("mine", b"x", properties={name: "0"})],
                             queue_id=0)
            assert name in batch.value.remark
    assert stored(broker, "mine") == []
