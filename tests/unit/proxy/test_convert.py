"""The gRPC front end's conversions (``common/proxy/convert.py``) field by field, without a
broker: what the official consumers read of a stored message."""

from __future__ import annotations

import dataclasses
import zlib
from types import SimpleNamespace
from typing import Any

import pytest
from rocketmq.grpc_protocol import definition_pb2 as pb

from common.core.message import PROPERTY_SHARDING_KEY, PROPERTY_UNIQ_KEY, MessageExt
from common.proxy import convert

pytestmark = pytest.mark.unit


STORED = MessageExt(
    topic="orders", queue_id=3, queue_offset=41, commit_log_offset=9000, store_size=300,
    body=b"payload", properties={PROPERTY_UNIQ_KEY: "AC1100010000", "TAGS": "paid",
                                 "KEYS": "k1 k2", "color": "blue", "REAL_TOPIC": "x",
                                 PROPERTY_SHARDING_KEY: "g7"},
    born_timestamp=1_700_000_000_123, born_host="10.0.0.5:5555",
    store_timestamp=1_700_000_001_456, store_host="10.0.0.9:10911",
    reconsume_times=2, msg_id="0A00000900002A9F0000000000002328")


def stored(**fields: Any) -> MessageExt:
    return dataclasses.replace(STORED, **fields)


def test_a_stored_message_becomes_the_grpc_message_field_by_field() -> None:
    out = convert.message_of(stored(), "orders", pb.NORMAL)
    sp = out.system_properties
    assert out.topic.name == "orders" and out.body == b"payload"
    assert dict(out.user_properties) == {"color": "blue"}  # system properties left out
    assert sp.message_id == "AC1100010000"
    assert (sp.body_digest.type, sp.body_digest.checksum) == (
        pb.CRC32, format(zlib.crc32(b"payload"), "08X"))
    assert sp.body_encoding == pb.IDENTITY and sp.message_type == pb.NORMAL
    assert (sp.born_timestamp.seconds, sp.born_timestamp.nanos) == (1_700_000_000, 123_000_000)
    assert (sp.store_timestamp.seconds, sp.store_timestamp.nanos) == (
        1_700_000_001, 456_000_000)
    assert sp.born_host == "10.0.0.5" and sp.store_host == "10.0.0.9:10911"
    assert sp.tag == "paid" and list(sp.keys) == ["k1", "k2"]


def test_a_bare_message_keeps_its_times_present_and_no_tag_or_keys() -> None:
    out = convert.message_of(stored(properties={}, born_timestamp=0, store_timestamp=0,
                                    born_host="", store_host=""), "orders", pb.NORMAL)
    sp = out.system_properties
    assert sp.message_id == "0A00000900002A9F0000000000002328"  # no id given: its msgId
    assert sp.HasField("born_timestamp") and sp.HasField("store_timestamp")
    assert not sp.HasField("tag") and list(sp.keys) == [] and dict(out.user_properties) == {}


def test_a_received_message_carries_its_handle_queue_attempt_and_group() -> None:
    out = convert.incoming(SimpleNamespace(message=stored(), receipt_handle="handle-1"))
    sp = out.system_properties
    assert sp.receipt_handle == "handle-1"
    assert (sp.queue_id, sp.queue_offset, sp.delivery_attempt) == (3, 41, 3)
    assert sp.message_type == pb.FIFO and sp.message_group == "g7"
    assert out.SerializeToString() == pb.Message.FromString(out.SerializeToString()) \
        .SerializeToString()


@pytest.mark.parametrize(("system", "user", "words"), [
    ({"tag": "t\x02REAL_TOPIC\x01victim"}, {}, "system_properties.tag may not hold"),
    ({"keys": ["ok", "k\x01"]}, {}, "system_properties.keys may not hold"),
    ({"message_group": "g\x02__POP\x01ck"}, {}, "system_properties.message_group may not hold"),
    ({"message_id": "01\x02__TRAN_STATE\x01ROLLBACK"}, {}, "message_id may not hold"),
    ({}, {"a\x02REAL_QID": "x"}, "user_properties: property"),
    ({}, {"region": "eu\x01"}, "user_properties: property"),
    ({}, {"__TIMER_TICK": "4102444800000"}, "set by the broker"),
    ({}, {"__SCHED_SRC": "0"}, "set by the broker"),
    # an index key of the broker's own: it would hide a delivery's or a commit's record
    ({"keys": ["ok", "__TIMER_SRC4096"]}, {}, "system_properties.keys may not start with"),
    ({"keys": ["a __TRAN_HALF0"]}, {}, "system_properties.keys may not start with"),
    ({"message_id": "__SCHED_SRC77"}, {}, "message_id may not start with __SCHED_SRC"),
])
def test_a_send_with_a_separator_or_a_brokers_property_is_refused_at_the_front_end(
        system: dict[str, Any], user: dict[str, str], words: str) -> None:
    msg = pb.Message(topic=pb.Resource(name="mine"), body=b"x", user_properties=user,
                     system_properties=pb.SystemProperties(**system))
    with pytest.raises(ValueError, match=words):
        convert.outgoing(msg)


def test_a_received_message_shows_no_brokers_property_as_a_user_property() -> None:
    """A client that sends a received message on keeps its user properties: one only the
    broker sets (a delayed delivery's __SCHED_SRC) would get it refused."""
    props = {**STORED.properties, "__SCHED_SRC": "4096", "__TIMER_SRC": "8192"}
    out = convert.message_of(stored(properties=props), "orders", pb.NORMAL)
    assert dict(out.user_properties) == {"color": "blue"}
    convert.outgoing(pb.Message(topic=pb.Resource(name="orders"), body=b"x",
                                user_properties=out.user_properties))  # sent on as it is
