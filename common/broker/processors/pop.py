"""POP consumption: POP_MESSAGE (long polling), ACK_MESSAGE, BATCH_ACK_MESSAGE,
CHANGE_MESSAGE_INVISIBLETIME
(``common/core/pop.py``; the master's part is ``master/pop.py``, the state
``common/store/pop/``).

A POP that finds nothing and asks to wait (``pollTime``) is parked on its queue (or, for
``queueId`` -1, on the whole topic) and answered when a message arrives, or when a message the
group holds out comes due, with ``PULL_RETRY_IMMEDIATELY`` and ``status`` NEW_MESSAGE_ARRIVED:
the client pops again at once (a POP hands messages out by writing a record, which is not done
on the I/O thread's wake-up). At the end of its wait: ``PULL_NOT_FOUND``, NO_NEW_MSG.
"""

from __future__ import annotations

import itertools
import time

from common.broker.long_polling import LongPoll
from common.broker.processors.consume import consumer_group, pull_subscription
from common.broker.processors.context import Context
from common.broker.replies import Reply, reply
from common.core.errors import ResponseCode
from common.core.pop import MAX_INVISIBLE_MS, MIN_INVISIBLE_MS
from common.format.protocol import Request, RequestCode, Response

_turn = itertools.count()  # where a POP of every queue starts: each in turn


def _invisible(req: Request) -> Response | None:
    invisible = req.fields["invisibleTime"]
    if not MIN_INVISIBLE_MS <= invisible <= MAX_INVISIBLE_MS:
        return reply(req, ResponseCode.BAD_REQUEST, f"invisibleTime {invisible} ms: give "
                     f"{MIN_INVISIBLE_MS}..{MAX_INVISIBLE_MS}", {"field": "invisibleTime"})
    return None


def pop_message(ctx: Context, req: Request) -> Reply | None:
    services = ctx.services
    w = services.writer(req)
    if isinstance(w, Response):
        return w
    bad = _invisible(req)
    if bad is not None:
        return bad
    config = consumer_group(services, req, req.fields["group"])
    if isinstance(config, Response):
        return config
    sub = pull_subscription(services, req)
    if isinstance(sub, Response):
        return sub
    f = req.fields
    topic, group, asked = f["topic"], f["group"], f["queueId"]
    members = services.consumer_groups.members(group)
    if members:
        return reply(req, ResponseCode.BAD_REQUEST, f"group {group} consumes by offset here "
                     f"({len(members)} live member(s) of a GroupConsumer): one group reads "
                     "one way, POP or offsets; give the POP consumers a group of their own")
    nums, _ = services.topic_queue_nums(topic)
    if nums == 0:
        return reply(req, ResponseCode.TOPIC_NOT_EXIST, f"no topic {topic}")
    if asked >= nums:
        return reply(req, ResponseCode.BAD_REQUEST, f"topic {topic} has {nums} queues: no "
                     f"queue {asked}", {"field": "queueId"})
    first = next(_turn) % nums
    queues = [asked] if asked >= 0 else [(first + i) % nums for i in range(nums)]
    store = services.store

    def start(queue_id: int) -> int:
        committed = services.fetch_offset(group, topic, queue_id)
        if committed >= 0:
            return committed
        if f["initMode"] == 1:
            return store.max_queue_offset(topic, queue_id)
        return store.min_queue_offset(topic, queue_id)

    # FIFO when the consumer asks, or when the group is consumeMessageOrderly (RocketMQ 5's
    # proxy asks for what the group says); redeliveries as asked, else as the group says
    order = bool(f["order"]) or config.consume_message_orderly
    max_times = f["maxReconsumeTimes"]
    answer = w.pop_message(req, sub, queues, start, order,
                           config.retry_max_times if max_times < 0 else max_times)
    suspend_ms = min(f["pollTime"], services.cfg.longPollingMaxMs)
    if not isinstance(answer, Response) or answer.code != ResponseCode.PULL_NOT_FOUND \
            or suspend_ms <= 0 or ctx.draining:
        return answer

    def total() -> int:
        return sum(store.max_queue_offset(topic, q) for q in queues)

    parked = total()
    deadline = ctx.started + suspend_ms / 1000.0
    due_ms = store.pop.next_deadline([(group, topic, q) for q in queues])
    if due_ms is not None:  # a message out comes due before the wait ends: answer then
        deadline = min(deadline, ctx.started + max(0.0, due_ms / 1000 - time.time()) + 0.001)

    def woken() -> Response:
        due = due_ms is not None and time.time() * 1000 >= due_ms
        if total() > parked or due:
            return reply(req, ResponseCode.PULL_RETRY_IMMEDIATELY, "a message arrived or "
                         "came due: pop again", {"status": "NEW_MESSAGE_ARRIVED"})
        return answer

    ctx.park(LongPoll(key=(topic, asked), identity=ctx.identity, req=req, deadline=deadline,
                      started=ctx.started, ready=lambda _max: total() > parked,
                      answer=woken, current=total))
    return None


def ack_message(ctx: Context, req: Request) -> Reply:
    w = ctx.services.writer(req)
    return w if isinstance(w, Response) else w.ack_message(req)


def batch_ack(ctx: Context, req: Request) -> Reply:
    w = ctx.services.writer(req)
    return w if isinstance(w, Response) else w.batch_ack(req)


def change_invisible(ctx: Context, req: Request) -> Reply:
    w = ctx.services.writer(req)
    if isinstance(w, Response):
        return w
    bad = _invisible(req)
    return bad if bad is not None else w.change_invisible(req)


HANDLERS = {
    RequestCode.POP_MESSAGE: pop_message,
    RequestCode.ACK_MESSAGE: ack_message,
    RequestCode.BATCH_ACK_MESSAGE: batch_ack,
    RequestCode.CHANGE_MESSAGE_INVISIBLETIME: change_invisible,
}
