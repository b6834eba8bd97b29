"""Recalling a timer message before it is delivered (RocketMQ 5's RecallMessage, code 370).

A SEND of a timer message is *stamped* where the broker receives it: a relative delay
(``TIMER_DELAY_SEC``/``TIMER_DELAY_MS``) becomes the absolute ``TIMER_DELIVER_MS`` it means
now, and a message without a unique key gets one (``UNIQ_KEY``; RocketMQ's clients always set
it, replog's set it only when asked). Its answer carries a *recall handle*, base64url of
``"v1 <topic> <brokerName> <deliverMs> <uniqKey>"`` as RocketMQ's ``RecallMessageHandle.HandleV1``
spells it. A recall puts a *delete marker*: a timer message for the same delivery time (so the
same tick) with ``TIMER_DEL_UNIQKEY = "<topic>+<uniqKey>"``; the dequeue drops the units of
that tick whose real topic and key it names.

A recall is refused once the delivery time has passed (the message is delivered, or about to
be); one that arrives within a tick of the time may still be too late, which the answer cannot
tell (RocketMQ has the same window): the marker then deletes nothing.
"""

from __future__ import annotations

import uuid

from common.core.message import PROPERTY_UNIQ_KEY, Message
from common.core.timer import (
    TIMER_DEL_UNIQKEY,
    TIMER_DELAY_MS,
    TIMER_DELAY_SEC,
    TIMER_DELIVER_MS,
    RecallHandle,
    requested,
)


def stamp(props: dict[str, str], now_ms: int) -> tuple[int, str] | None:
    """On a SEND with timer properties (and no delay level): make the delivery time absolute
    and the unique key present, in ``props``; returns (deliver ms, uniq key), or None when the
    properties are not a time (the put hook refuses them, naming why)."""
    if TIMER_DELIVER_MS in props:
        raw, scale, base = props[TIMER_DELIVER_MS], 1, 0
    elif TIMER_DELAY_SEC in props:
        raw, scale, base = props[TIMER_DELAY_SEC], 1000, now_ms
    elif TIMER_DELAY_MS in props:
        raw, scale, base = props[TIMER_DELAY_MS], 1, now_ms
    else:
        return None
    try:
        value = int(raw)
    except ValueError:
        return None
    if value < 0:
        return None
    deliver = base + value * scale
    props.pop(TIMER_DELAY_SEC, None)
    props.pop(TIMER_DELAY_MS, None)
    props[TIMER_DELIVER_MS] = str(deliver)
    key = props.get(PROPERTY_UNIQ_KEY) or uuid.uuid4().hex.upper()
    props[PROPERTY_UNIQ_KEY] = key
    return deliver, key


def is_timer_send(props: dict[str, str], delay_level: int) -> bool:
    return delay_level <= 0 and requested(props)


def delete_marker(handle: RecallHandle) -> Message:
    """What a recall puts: a timer message to the handle's topic, due at the handle's time,
    naming the message to drop (the put hook sends it to the timer topic like any other)."""
    return Message(handle.topic, b"", properties={
        TIMER_DELIVER_MS: str(handle.deliver_ms),
        TIMER_DEL_UNIQKEY: f"{handle.topic}+{handle.uniq_key}",
        PROPERTY_UNIQ_KEY: uuid.uuid4().hex.upper(),
    })
