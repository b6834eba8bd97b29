"""Writes: SEND, SEND_BATCH, CONSUMER_SEND_MSG_BACK, CREATE_TOPIC, RECALL_MESSAGE,
END_TRANSACTION. Each goes to the master role
(``master/role.py``) once the broker says it may write (``Services.writer``: a slave, a broker
still starting, a fenced master refuse it there, before anything reaches the store)."""

from __future__ import annotations

from common.broker.processors.consume import consumer_group
from common.broker.processors.context import Context
from common.broker.replies import Reply
from common.format.protocol import Request, RequestCode, Response


def send(ctx: Context, req: Request) -> Reply:
    w = ctx.services.writer(req)
    return w if isinstance(w, Response) else w.send(req)


def send_batch(ctx: Context, req: Request) -> Reply:
    w = ctx.services.writer(req)
    return w if isinstance(w, Response) else w.send_batch(req)


def send_back(ctx: Context, req: Request) -> Reply:
    """CONSUMER_SEND_MSG_BACK: retried ``maxReconsumeTimes`` times (-1: the group's
    ``retryMaxTimes``) before the DLQ; a group not in subscriptionGroup.json while
    autoCreateSubscriptionGroup is off is refused, as RocketMQ refuses it."""
    w = ctx.services.writer(req)
    if isinstance(w, Response):
        return w
    config = consumer_group(ctx.services, req, req.fields["group"], consuming=False)
    if isinstance(config, Response):
        return config
    max_times = req.fields["maxReconsumeTimes"]
    return w.send_back(req, config.retry_max_times if max_times < 0 else max_times)


def create_topic(ctx: Context, req: Request) -> Reply:
    w = ctx.services.writer(req)
    return w if isinstance(w, Response) else w.create_topic(req)


def recall(ctx: Context, req: Request) -> Reply:
    w = ctx.services.writer(req)
    return w if isinstance(w, Response) else w.recall(req)


def end_transaction(ctx: Context, req: Request) -> Reply:
    w = ctx.services.writer(req)
    return w if isinstance(w, Response) else w.end_transaction(req)


HANDLERS = {
    RequestCode.SEND: send,
    RequestCode.SEND_BATCH: send_batch,
    RequestCode.CONSUMER_SEND_MSG_BACK: send_back,
    RequestCode.CREATE_TOPIC: create_topic,
    RequestCode.RECALL_MESSAGE: recall,
    RequestCode.END_TRANSACTION: end_transaction,
}
