"""Consumer send-back: a message a consumer failed to process comes back later, then to a DLQ.

RocketMQ's ``CONSUMER_SEND_MSG_BACK`` (request code 36, ``SendMessageProcessor``
``consumerSendMsgBack``). A consumer of group G that cannot process a message asks the master
to store a copy of it again, by the message's CommitLog offset:

* while the message's ``RECONSUMETIMES`` is below ``maxReconsumeTimes`` (16 by default), the copy
  goes to ``%RETRY%G`` (one queue, created on first use) with ``RECONSUMETIMES`` + 1 and a delay
  level: the one asked for, or ``3 + RECONSUMETIMES`` (10 s, 30 s, 1 min, ... up to the last
  level) when the consumer leaves it to the broker. The delay service delivers it to
  ``%RETRY%G`` when due; every member of G reads that topic besides its own topics;
* once it has been retried ``maxReconsumeTimes`` times, or when the consumer asks for delay
  level -1, the copy goes to ``%DLQ%G`` (one queue, no delay), which nobody reads unless asked.

The copy keeps the body (deflated if it was, with its COMPRESSED sysflag), flag, tags, keys and
user properties, its born time and host, and records ``RETRY_TOPIC`` (the topic it was first
sent to, so a consumer sees it under that name) and ``ORIGIN_MESSAGE_ID`` (the msgId of the
first copy). The consumer commits past the failed message only after the master stored the
copy, so nothing is lost between the two (at least once).

This module is the pure part (what to store); ``master/role.py`` looks the message up and puts
the copy like any SEND, with the same flush and replica waits.
"""

from __future__ import annotations

import dataclasses

from common.core.message import (
    DLQ_PREFIX,
    PROPERTY_DELAY,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_REAL_QID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_RETRY_TOPIC,
    SCHEDULE_SOURCE,
    Message,
    MessageExt,
    dlq_topic,
    retry_topic,
)
from common.core.timer import RESERVED as TIMER_RESERVED
from common.format.boundary import record_refusal, topic_refusal

FIRST_RETRY_LEVEL = 3  # RocketMQ: delay level 3 + reconsumeTimes when the consumer gives 0
MAX_RECONSUME_TIMES = 0x7FFFFFFF  # RECONSUMETIMES is a Java int

# properties that belong to one stored copy, not to the message
# a delivered timer message's marks (RESERVED) are its delivery's, not the copy's
_COPY_ONLY = (PROPERTY_DELAY, PROPERTY_REAL_TOPIC, PROPERTY_REAL_QID, SCHEDULE_SOURCE,
              *TIMER_RESERVED)


class SendBackRefused(ValueError):
    """The request cannot be honoured (the remark says why); nothing was stored."""


@dataclasses.dataclass(frozen=True)
class SendBack:
    """What to store for one send-back: ``message`` into its topic's queue 0."""

    message: Message
    dead: bool  # True: into the group's DLQ


def plan(stored: MessageExt, group: str, origin_topic: str, delay_level: int,
         max_reconsume_times: int, levels: int, origin_msg_id: str = "") -> SendBack:
    """The copy of ``stored`` (the record the consumer read) to store for ``group``.

    ``origin_topic`` is the topic the consumer knows the message by: the record's own topic, or,
    for a record of the group's retry topic, the topic it first went to. Anything else means the
    offset is not the consumer's message, and is refused rather than copying another's; so is
    a record of a system topic (``record_refusal``), which no consumer was handed.
    """
    refusal = record_refusal(stored.topic) or topic_refusal(origin_topic)
    if refusal is not None:
        raise SendBackRefused(refusal)
    first_topic = stored.properties.get(PROPERTY_RETRY_TOPIC)
    if not (stored.topic == origin_topic
            or (stored.topic == retry_topic(group) and first_topic == origin_topic)):
        known = stored.topic if first_topic is None else f"{stored.topic} (from {first_topic})"
        raise SendBackRefused(
            f"the record at commitLogOffset {stored.commit_log_offset} is a message of topic "
            f"{known}, not of {origin_topic}")
    if stored.topic.startswith(DLQ_PREFIX):
        raise SendBackRefused(f"a message of {stored.topic} cannot be sent back")
    props = {k: v for k, v in stored.properties.items() if k not in _COPY_ONLY}
    props.setdefault(PROPERTY_RETRY_TOPIC, stored.topic)
    props.setdefault(PROPERTY_ORIGIN_MESSAGE_ID, origin_msg_id or stored.msg_id)
    times = stored.reconsume_times
    dead = delay_level < 0 or times >= max_reconsume_times
    if dead:
        topic, level = dlq_topic(group), 0
    else:
        topic = retry_topic(group)
        level = min(delay_level or FIRST_RETRY_LEVEL + times, levels)
    message = Message(topic, stored.body, properties=props, flag=stored.flag, delay_level=level,
                      reconsume_times=min(times + 1, MAX_RECONSUME_TIMES),
                      sys_flag=stored.sys_flag)  # a compressed body stays so (RocketMQ copies it)
    return SendBack(message, dead)
