"""Timer messages' property names and recall handles: what producers, the broker and the
store all speak (RocketMQ 5's names; the store's timer is ``common/store/timer/``).

A producer sets one of ``TIMER_DELIVER_MS`` (an epoch time in ms), ``TIMER_DELAY_SEC`` or
``TIMER_DELAY_MS`` (from when the broker receives it). The others are the broker's: a SEND
that carries one of ``RESERVED`` is refused.

A recall handle is base64url of ``"v1 <topic> <brokerName> <deliverMs> <uniqKey>"``, as
RocketMQ's ``RecallMessageHandle.HandleV1`` spells it.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import NamedTuple

TIMER_TOPIC = "rmq_sys_wheel_timer"
TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
TIMER_DELAY_SEC = "TIMER_DELAY_SEC"
TIMER_DELAY_MS = "TIMER_DELAY_MS"
TIMER_OUT_MS = "TIMER_OUT_MS"  # the tick it is delivered at
TIMER_ENQUEUE_MS = "TIMER_ENQUEUE_MS"  # when the timer put it on the wheel
TIMER_DEQUEUE_MS = "TIMER_DEQUEUE_MS"  # when the timer delivered it
TIMER_ROLL_TIMES = "TIMER_ROLL_TIMES"  # re-puts of a message due past the roll window
TIMER_DEL_UNIQKEY = "TIMER_DEL_UNIQKEY"  # a recall: "<real topic>+<uniq key>" not to deliver
TIMER_SOURCE = "__TIMER_SRC"  # on a delivery: the timer record's CommitLog offset (indexed)
TIMER_TICK = "__TIMER_TICK"  # on a delivery or a roll: the tick it was done for
REQUESTED = (TIMER_DELIVER_MS, TIMER_DELAY_SEC, TIMER_DELAY_MS)
# set by the broker only: a client's SEND carrying one is refused (a forged __TIMER_TICK would
# tell slaves that ticks were delivered; a forged TIMER_DEL_UNIQKEY would recall a message)
RESERVED = (TIMER_OUT_MS, TIMER_ENQUEUE_MS, TIMER_DEQUEUE_MS, TIMER_ROLL_TIMES, TIMER_DEL_UNIQKEY,
            TIMER_SOURCE, TIMER_TICK)


def requested(props: Mapping[str, str]) -> bool:
    return TIMER_DELIVER_MS in props or TIMER_DELAY_SEC in props or TIMER_DELAY_MS in props

HANDLE_VERSION = "v1"
MAX_HANDLE_CHARS = 1024


class RecallHandle(NamedTuple):
    topic: str
    broker_name: str
    deliver_ms: int
    uniq_key: str

    def encode(self) -> str:
        text = f"{HANDLE_VERSION} {self.topic} {self.broker_name} {self.deliver_ms} {self.uniq_key}"
        return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")

    @classmethod
    def decode(cls, handle: str) -> RecallHandle:
        """The handle's parts; ValueError naming what is wrong with it."""
        if not handle or len(handle) > MAX_HANDLE_CHARS:
            raise ValueError(f"a recall handle is 1 to {MAX_HANDLE_CHARS} characters")
        try:
            padded = handle + "=" * (-len(handle) % 4)
            text = base64.b64decode(padded, altchars=b"-_", validate=True).decode()
        except (binascii.Error, UnicodeDecodeError, ValueError):
            raise ValueError("the recall handle is not base64url text") from None
        parts = text.split(" ")
        if len(parts) != 5 or parts[0] != HANDLE_VERSION:
            raise ValueError(f"the recall handle is not a {HANDLE_VERSION} handle "
                             "(version, topic, broker name, time, message key)")
        _, topic, broker_name, when, key = parts
        if not when.isdigit() or not topic or not broker_name or not key:
            raise ValueError("the recall handle's fields are malformed")
        return cls(topic, broker_name, int(when), key)
