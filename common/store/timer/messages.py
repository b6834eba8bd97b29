"""Timer messages as the put path sees them: their properties and the put hook that sends
them to the timer topic (RocketMQ 5's ``HookUtils.transformTimerMessage``).

A producer sets one of ``TIMER_DELIVER_MS`` (an epoch time in ms), ``TIMER_DELAY_SEC`` or
``TIMER_DELAY_MS`` (from now). The hook, on a single put:

* a delay level given as well wins (RocketMQ's rule): the timer properties are dropped and the
  delay-level hook, which ran first, has sent it to the schedule topic;
* a time not in the future: delivered at once, as a plain message;
* more than ``timerMaxDelaySec`` away: refused (``WHEEL_TIMER_MSG_ILLEGAL``) with the limit
  named; Python's integers do not overflow, so no delay wraps to the past;
* the tick is taken as RocketMQ does (floored to ``timerPrecisionMs``, one tick off on an exact
  boundary); the dequeue delivers each message of a tick once its exact time has passed;
* a tick holding ``timerCongestNumEachSlot`` messages: refused (``WHEEL_TIMER_FLOW_CONTROL``),
  never dropped;
* otherwise stored in ``rmq_sys_wheel_timer`` queue 0 with ``REAL_TOPIC``, ``REAL_QID``,
  ``TIMER_OUT_MS`` (the tick, RocketMQ's) and ``TIMER_DELIVER_MS`` (the exact time, a relative
  delay made absolute), where the timer's enqueue thread finds it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from common.core.errors import PutStatus
from common.core.message import (
    PROPERTY_REAL_QID,
    PROPERTY_REAL_TOPIC,
    SCHEDULE_TOPIC,
    Message,
)
from common.core.timer import (
    REQUESTED,
    TIMER_DELAY_MS,
    TIMER_DELAY_SEC,
    TIMER_DELIVER_MS,
    TIMER_OUT_MS,
    TIMER_TOPIC,
    requested,
)
from common.store.commit_log import PutResult, refused


def tick_of(deliver_ms: int, precision_ms: int) -> int:
    """The tick a delivery time is put on (RocketMQ's rule: delivered once it has passed)."""
    if deliver_ms % precision_ms == 0:
        return deliver_ms - precision_ms
    return deliver_ms // precision_ms * precision_ms


def deliver_time(msg: Message, now_ms: int) -> int | str:
    """The delivery time the message asks for, or why it is not one."""
    props = msg.properties
    for name, scale, absolute in ((TIMER_DELIVER_MS, 1, True), (TIMER_DELAY_SEC, 1000, False),
                                  (TIMER_DELAY_MS, 1, False)):
        raw = props.get(name)
        if raw is None:
            continue
        try:
            value = int(raw)
        except ValueError:
            return f"{name} {raw!r} is not an integer"
        if value < 0:
            return f"{name} {value} is negative"
        return value if absolute else now_ms + value * scale
    return "no timer property"


class TimerHook:
    """The put hook (``common/store/extensions.py``); registered after delay levels'."""

    name = "timer"
    triggers = frozenset(REQUESTED)

    def __init__(self, enabled: bool, precision_ms: int, max_delay_s: int,
                 congested: Callable[[int], bool], clock: Callable[[], float] = time.time):
        self.enabled = enabled
        self.precision_ms = precision_ms
        self.max_delay_ms = max_delay_s * 1000
        self._congested = congested
        self._clock = clock
        self.refused = 0

    def before_put(self, msg: Message, queue_id: int) -> tuple[Message, int] | PutResult | None:
        if msg.topic == TIMER_TOPIC or not requested(msg.properties):
            return None
        if msg.topic == SCHEDULE_TOPIC:  # a delay level wins: the timer asks nothing more
            return _without(msg, REQUESTED), queue_id
        if not self.enabled:
            self.refused += 1
            return refused(PutStatus.WHEEL_TIMER_NOT_ENABLE,
                           "timer messages are off on this broker (timerWheelEnable)")
        now_ms = int(self._clock() * 1000)
        deliver = deliver_time(msg, now_ms)
        if isinstance(deliver, str):
            self.refused += 1
            return refused(PutStatus.WHEEL_TIMER_MSG_ILLEGAL, deliver)
        if deliver <= now_ms:
            return None  # due already: a plain message, delivered at once
        if deliver - now_ms > self.max_delay_ms:
            self.refused += 1
            return refused(PutStatus.WHEEL_TIMER_MSG_ILLEGAL,
                           f"delivery at {deliver} is {deliver - now_ms} ms away, more than "
                           f"timerMaxDelaySec ({self.max_delay_ms // 1000} s)")
        tick = tick_of(deliver, self.precision_ms)
        if self._congested(tick):
            self.refused += 1
            return refused(PutStatus.WHEEL_TIMER_FLOW_CONTROL,
                           f"the timer's tick {tick} holds timerCongestNumEachSlot messages "
                           "already: send it later, or spread the delivery times")
        props = {k: v for k, v in msg.properties.items()
                 if k not in (TIMER_DELAY_SEC, TIMER_DELAY_MS)}
        props[PROPERTY_REAL_TOPIC] = msg.topic
        props[PROPERTY_REAL_QID] = str(queue_id)
        props[TIMER_OUT_MS] = str(tick)
        props[TIMER_DELIVER_MS] = str(deliver)  # the exact time: delivered once it has passed
        return Message(TIMER_TOPIC, msg.body, tags=msg.tags, keys=msg.keys, properties=props,
                       flag=msg.flag, reconsume_times=msg.reconsume_times,
                       sys_flag=msg.sys_flag), 0


def _without(msg: Message, names: tuple[str, ...]) -> Message:
    props = {k: v for k, v in msg.properties.items() if k not in names}
    return Message(msg.topic, msg.body, tags=msg.tags, keys=msg.keys, properties=props,
                   flag=msg.flag, delay_level=msg.delay_level,
                   reconsume_times=msg.reconsume_times, sys_flag=msg.sys_flag)
