"""Fuzz the gRPC front end's conversion of a client's messages (``common/proxy/convert.py``):
protobuf bytes parsed as a SendMessageRequest, EndTransactionRequest, ReceiveMessageRequest
or ChangeInvisibleDurationRequest, then made into what the broker is sent as the front end
makes it (``outgoing``, the Producer's checks and SEND request), and that request decoded as
the broker decodes it. Only the refusals the front end answers may be raised (protobuf's
DecodeError, ValueError, BrokerError, ProtocolError, SelectorError), and a SEND the broker
accepts carries the message as sent: no property added or lost on the way.

Input: a byte choosing the request type, then its protobuf bytes.
Run: ``python fuzz/grpc_convert.py -max_total_time=600``.
"""

from __future__ import annotations

import atexit
import sys
from pathlib import Path
from typing import Any

from google.protobuf.message import DecodeError

sys.path[:0] = [str(Path(__file__).resolve().parent.parent)]

from fuzz._harness import Reader, instrumented, run, tolerated

with instrumented(__name__):
    from common.client import producer as producer_module
    from common.client.producer import Producer
    from common.core.errors import BrokerError
    from common.core.message import PROPERTY_UNIQ_KEY, Message, decode_properties, encode_properties
    from common.core.pop import ReceiptHandle
    from common.core.sql92 import SelectorError, compile_selector
    from common.format import boundary
    from common.format.protocol import (
        Limits,
        ProtocolError,
        RequestCode,
        decode_request,
        encode_request,
    )
    from common.proxy import convert
    from common.proxy.convert import pb, rpc

NAME = "grpc_convert"
KINDS = (rpc.SendMessageRequest, rpc.EndTransactionRequest, rpc.ReceiveMessageRequest,
         rpc.ChangeInvisibleDurationRequest)
LIMITS = Limits()
_producer: Any = None


def producer() -> Any:
    """A Producer for its checks and request making only: it never connects."""
    global _producer
    if _producer is None:
        _producer = Producer("127.0.0.1:9")
        atexit.register(_producer.close)
    return _producer


def _send(msg: Any) -> None:
    try:
        out = convert.outgoing(msg)
    except ValueError:
        return
    props = dict(out.properties)
    props.setdefault(PROPERTY_UNIQ_KEY, "FUZZ")  # the Producer's default is random
    try:
        props = producer_module._with_shard_key(props, out.shard_key, None) or {}
        if out.deliver_at_ms is not None:
            props = producer_module._with_timer(props, out.deliver_at_ms, None, 0)
        fields, body = producer().send_request(out.topic, out.body, out.tags, out.keys or None,
                                               props)
        frames = encode_request(RequestCode.SEND, 1, {**fields, "queueId": 0}, [body])
        req = decode_request(frames, LIMITS)
    except (BrokerError, ProtocolError):
        return
    f = req.fields
    stored = Message(f["topic"], req.bodies[0], f.get("tags"), f.get("keys"),
                     dict(f.get("properties") or {}), f["flag"], f["delayLevel"])
    want = stored.all_properties()
    got = decode_properties(encode_properties(want))
    if got != want and not tolerated("separators"):
        raise AssertionError(f"a property changed on its way to the record: {want} -> {got}")
    injected = boundary.BROKER_ONLY_PROPERTIES & set(got)
    if injected and not tolerated("broker-only-properties"):
        raise AssertionError(f"the broker accepted broker-only properties {sorted(injected)}")
    assert f["topic"] == out.topic and req.bodies[0] == out.body
    if out.tags:
        assert want.get("TAGS") == out.tags


def _end(req: Any) -> None:
    try:
        parsed = convert.parse_transaction_id(req.transaction_id)
    except ValueError:
        return
    again = convert.parse_transaction_id(convert.transaction_id(*parsed))
    assert again == parsed, (parsed, again)


def _receive(req: Any) -> None:
    convert.ms(req.invisible_duration)
    convert.ms(req.long_polling_timeout)
    expression = req.filter_expression
    if expression.type == pb.SQL:
        compile_selector.cache_clear()
        try:
            compile_selector(expression.expression)
        except SelectorError:
            pass
        except RecursionError:
            if not tolerated("sql92-recursion"):
                raise


def _change(req: Any) -> None:
    convert.ms(req.invisible_duration)
    try:
        handle = ReceiptHandle.decode(req.receipt_handle)
    except ValueError:
        return
    assert ReceiptHandle.decode(handle.encode()) == handle


def one_input(data: bytes) -> None:
    r = Reader(data)
    kind = r.byte() % len(KINDS)
    try:
        req = KINDS[kind].FromString(r.rest())
    except DecodeError:
        return
    if kind == 0:
        for msg in list(req.messages)[:8]:
            _send(msg)
    elif kind == 1:
        _end(req)
    elif kind == 2:
        _receive(req)
    else:
        _change(req)


def seeds() -> list[bytes]:
    from google.protobuf.timestamp_pb2 import Timestamp

    def message(**sp: Any) -> Any:
        return pb.Message(topic=pb.Resource(name="orders"), body=b"hello",
                          user_properties={"color": "blue"},
                          system_properties=pb.SystemProperties(message_id="01AB", **sp))

    sends = [
        rpc.SendMessageRequest(messages=[message(tag="TagA", keys=["k1", "k2"])]),
        rpc.SendMessageRequest(messages=[message(message_group="g1",
                                                 message_type=pb.FIFO)]),
        rpc.SendMessageRequest(messages=[message(
            message_type=pb.DELAY, delivery_timestamp=Timestamp(seconds=1_900_000_000))]),
        rpc.SendMessageRequest(messages=[message(body_encoding=pb.GZIP)]),
        rpc.SendMessageRequest(messages=[message(tag="t\x02REAL_TOPIC\x01victim")]),
        rpc.SendMessageRequest(messages=[message(), message(tag="b")]),
    ]
    tid = convert.transaction_id("broker-a", "orders", 4096, 7, "0A0B", "01AB")
    others = [
        (1, rpc.EndTransactionRequest(transaction_id=tid, resolution=pb.COMMIT)),
        (1, rpc.EndTransactionRequest(transaction_id="djEgYSBiIDEgMiBjIA")),
        (2, rpc.ReceiveMessageRequest(filter_expression=pb.FilterExpression(
            type=pb.SQL, expression="a > 5 AND b = 'x'"))),
        (2, rpc.ReceiveMessageRequest(filter_expression=pb.FilterExpression(
            type=pb.TAG, expression="A || B"))),
        (3, rpc.ChangeInvisibleDurationRequest(receipt_handle="rp1 b orders 2 7 99 1 2")),
    ]
    out = [bytes([0]) + m.SerializeToString() for m in sends]
    out += [bytes([k]) + m.SerializeToString() for k, m in others]
    return out


if __name__ == "__main__":
    run(NAME, one_input)
