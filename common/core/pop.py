"""POP consumption's names: what clients, the broker and the store all speak (RocketMQ 5's
``PopMessageProcessor``, ``AckMessageProcessor``, ``ChangeInvisibleTimeProcessor``; RIP-19).

A consumer group POPs messages of a topic: the broker hands each out to one consumer and
hides it for an *invisible time*; unless the consumer ACKs it by its *receipt handle* before
then, the next POP hands it out again, its reconsume count one more, and once it was handed out
``maxReconsumeTimes`` + 1 times it goes to the group's DLQ. CHANGE_INVISIBLE_TIME moves the
deadline (and gives a new handle). What the broker handed out, acked or changed is written as
records of the revive topic (``rmq_sys_REVIVE_LOG_<cluster>``) and replicated like any other,
so a failover keeps both the acks and the redelivery counts (``common/store/pop/``).
"""

from __future__ import annotations

from typing import NamedTuple

REVIVE_TOPIC_PREFIX = "rmq_sys_REVIVE_LOG_"
POP_RECORD = "__POP"  # on a revive record: its kind (ck, ack, chg, dlq)
HANDLE_VERSION = "rp1"
MIN_INVISIBLE_MS = 1_000  # RocketMQ's proxy floor for an invisible duration
MAX_INVISIBLE_MS = 12 * 3_600_000  # and its ceiling (12 h)


def revive_topic(cluster: str) -> str:
    return REVIVE_TOPIC_PREFIX + cluster


class ReceiptHandle(NamedTuple):
    """What an ACK or a change names: the message (broker group, topic, queue, queue offset)
    and the record that handed it out last (``handle``: its CommitLog offset), with when and
    for how long (RocketMQ's handle carries the same: ``ExtraInfoUtil``)."""

    broker_name: str
    topic: str
    queue_id: int
    offset: int
    handle: int
    pop_time_ms: int
    invisible_ms: int

    def encode(self) -> str:
        return " ".join((HANDLE_VERSION, self.broker_name, self.topic, str(self.queue_id),
                         str(self.offset), str(self.handle), str(self.pop_time_ms),
                         str(self.invisible_ms)))

    @classmethod
    def decode(cls, text: str) -> ReceiptHandle:
        """ValueError naming what is wrong with a handle that is not one of ours."""
        parts = text.split(" ")
        if len(parts) != 8 or parts[0] != HANDLE_VERSION:
            raise ValueError(f"not a receipt handle of this broker: {text[:80]!r}")
        _, broker, topic, *numbers = parts
        if not all(n.isdigit() for n in numbers):
            raise ValueError(f"a receipt handle's numbers are not numbers: {text[:80]!r}")
        queue_id, offset, handle, pop_time, invisible = (int(n) for n in numbers)
        return cls(broker, topic, queue_id, offset, handle, pop_time, invisible)
