"""A consumer group's dead letters: list them, and send them to the group again (``replog dlq``).

A message lands in ``%DLQ%<group>`` once the group gave up on it (``master/send_back.py``). Once
the cause is fixed, an operator re-drives it: each dead letter is sent as a new message to the
group's retry topic ``%RETRY%<group>``, which only that group reads, due at once, with its
reconsume count starting over; members see it under its first topic (``RETRY_TOPIC``) with its
first msgId (``ORIGIN_MESSAGE_ID``). Other groups of the topic are not disturbed, as they
would be by a send to the topic itself.

The group's position in its DLQ is its committed offset there (the DLQ has one queue, read by
no member); a re-drive commits past each letter once it is resent, so running it again resends
nothing twice, and a letter whose resend failed stays for the next run. A resend whose answer
was lost may be stored twice (at least once).
"""

from __future__ import annotations

import dataclasses

from common.client import Consumer, Producer, SendResult
from common.core.errors import BrokerError, PullStatus, ResponseCode, SendStatus
from common.core.message import (
    PROPERTY_KEYS,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_RETRY_TOPIC,
    PROPERTY_TAGS,
    MessageExt,
    dlq_topic,
    retry_topic,
)
from common.format.boundary import BROKER_ONLY_PROPERTIES

DLQ_QUEUE = 0  # RocketMQ's DLQ_NUMS_PER_GROUP is 1

# properties of one stored copy, not of the message (a resend is a new copy); the ones only
# the broker sets (a committed transaction's __TRAN_HALF, kept by a send-back) would get the
# resend refused
_NOT_CARRIED = {PROPERTY_TAGS, PROPERTY_KEYS, "DELAY", "REAL_TOPIC", "REAL_QID",
                "UNIQ_CLIENT_MESSAGE_ID_KEYIDX", *BROKER_ONLY_PROPERTIES}


@dataclasses.dataclass
class Letters:
    """Dead letters of ``group`` from ``start`` (its committed DLQ offset, or the DLQ's start),
    in one broker group's DLQ (``broker_name``; None with one broker group)."""

    group: str
    start: int
    end: int  # the DLQ's max offset when read
    messages: list[MessageExt]
    broker_name: str | None = None


def read(consumer: Consumer, max_nums: int, broker_name: str | None = None) -> Letters:
    """Up to ``max_nums`` dead letters of the consumer's group, from its position in its DLQ
    (over several broker groups: the DLQ of ``broker_name``; ``read_all`` reads each)."""
    topic = dlq_topic(consumer.group)
    try:
        consumer.queue_nums(topic, broker_name=broker_name)
    except BrokerError as e:
        if e.code != ResponseCode.TOPIC_NOT_EXIST:
            raise
        return Letters(consumer.group, 0, 0, [], broker_name)  # it never gave up on one
    start = max(consumer.fetch_offset(topic, DLQ_QUEUE, broker_name=broker_name),
                consumer.min_offset(topic, DLQ_QUEUE, broker_name=broker_name))
    end = consumer.max_offset(topic, DLQ_QUEUE, broker_name=broker_name)
    found: list[MessageExt] = []
    offset = start
    while offset < end and len(found) < max_nums:
        pr = consumer.pull(topic, DLQ_QUEUE, offset, min(32, max_nums - len(found)),
                           broker_name=broker_name)
        if pr.status != PullStatus.FOUND or not pr.messages:
            break
        found += pr.messages
        offset = pr.next_begin_offset
    return Letters(consumer.group, start, end, found, broker_name)


def read_all(consumer: Consumer, max_nums: int) -> list[Letters]:
    """``read`` of every broker group's DLQ of the consumer's group (a message goes back to
    the group it was read from, so each broker group keeps its own dead letters); one entry
    with one broker group. At most ``max_nums`` letters in all."""
    table = consumer.route_table()
    if len(table.groups) <= 1:
        return [read(consumer, max_nums)]
    out: list[Letters] = []
    for name in sorted(table.topics.get(dlq_topic(consumer.group), {})):
        letters = read(consumer, max_nums - sum(len(x.messages) for x in out), name)
        out.append(letters)
        if sum(len(x.messages) for x in out) >= max_nums:
            break
    return out


def redrive(producer: Producer, consumer: Consumer, letters: Letters) -> list[SendResult]:
    """Send each letter to the group's retry topic, committing the DLQ offset past it once it
    is stored (SEND_OK); stops at the first failure (raised), what was resent before stays
    committed."""
    topic = retry_topic(letters.group)
    results: list[SendResult] = []
    for msg in letters.messages:
        props = {k: v for k, v in msg.properties.items() if k not in _NOT_CARRIED}
        props.setdefault(PROPERTY_RETRY_TOPIC, msg.topic)
        props.setdefault(PROPERTY_ORIGIN_MESSAGE_ID, msg.msg_id)
        result = producer.send(topic, msg.body, tags=msg.tags, keys=msg.keys, properties=props,
                               flag=msg.flag, broker_name=letters.broker_name)
        if result.status != SendStatus.SEND_OK:  # stored, not as safe as a send must be
            raise BrokerError(ResponseCode[result.status.name],
                              f"resend of DLQ offset {msg.queue_offset} answered "
                              f"{result.status}: left in the DLQ for the next run "
                              f"({len(results)} resent)")
        results.append(result)
        consumer.commit_offset(dlq_topic(letters.group), DLQ_QUEUE, msg.queue_offset + 1,
                               broker_name=letters.broker_name)
    return results
