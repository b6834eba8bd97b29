"""Reading and consuming: PULL (with long polling), the group offsets, the queue offsets, the
topic's route, and consumer heartbeats."""

from __future__ import annotations

import time

from common.broker.long_polling import LongPoll
from common.broker.processors.context import Context, Services
from common.broker.replies import reply
from common.core.errors import CorruptMessageError, GetStatus, PullStatus, ResponseCode
from common.core.sql92 import SelectorError
from common.core.subscription import EVERYTHING, SQL92, TAG, Subscription, subscription
from common.format.protocol import ProtocolError, Request, RequestCode, Response
from common.format.tables import GroupConfig

PULL_MAX_BYTES = 4 * 1024 * 1024  # bytes of records in one pull answer

# store GetStatus -> (client PullStatus, response code), as RocketMQ's PullMessageProcessor maps them
PULL_STATUS: dict[GetStatus, tuple[PullStatus, ResponseCode]] = {
    GetStatus.FOUND: (PullStatus.FOUND, ResponseCode.SUCCESS),
    GetStatus.NO_MATCHED_MESSAGE: (PullStatus.NO_MATCHED_MSG, ResponseCode.PULL_RETRY_IMMEDIATELY),
    GetStatus.MESSAGE_WAS_REMOVING: (
        PullStatus.NO_MATCHED_MSG,
        ResponseCode.PULL_RETRY_IMMEDIATELY,
    ),
    GetStatus.NO_MATCHED_LOGIC_QUEUE: (PullStatus.NO_NEW_MSG, ResponseCode.PULL_NOT_FOUND),
    GetStatus.NO_MESSAGE_IN_QUEUE: (PullStatus.NO_NEW_MSG, ResponseCode.PULL_NOT_FOUND),
    GetStatus.OFFSET_FOUND_NULL: (PullStatus.NO_NEW_MSG, ResponseCode.PULL_NOT_FOUND),
    GetStatus.OFFSET_OVERFLOW_ONE: (PullStatus.NO_NEW_MSG, ResponseCode.PULL_NOT_FOUND),
    GetStatus.OFFSET_OVERFLOW_BADLY: (PullStatus.OFFSET_ILLEGAL, ResponseCode.PULL_OFFSET_MOVED),
    GetStatus.OFFSET_TOO_SMALL: (PullStatus.OFFSET_ILLEGAL, ResponseCode.PULL_OFFSET_MOVED),
}


def pull(ctx: Context, req: Request) -> Response | None:
    """A pull; at the end of its queue with ``suspendMs`` > 0 it is parked until a message
    arrives for the queue or the wait ends (``common/broker/long_polling.py``)."""
    services = ctx.services
    if req.fields.get("group"):
        config = consumer_group(services, req, req.fields["group"])
        if isinstance(config, Response):
            return config
    sub = pull_subscription(services, req)
    if isinstance(sub, Response):
        return sub
    resp = read_queue(services, req, sub)
    suspend_ms = min(req.fields["suspendMs"], services.cfg.longPollingMaxMs)
    if resp.code != ResponseCode.PULL_NOT_FOUND or suspend_ms <= 0 or ctx.draining:
        return resp
    f = req.fields
    topic, queue_id, offset = f["topic"], f["queueId"], f["queueOffset"]
    store = services.store
    ctx.park(LongPoll(
        key=(topic, queue_id), identity=ctx.identity, req=req,
        deadline=ctx.started + suspend_ms / 1000.0, started=ctx.started,
        ready=lambda max_offset: offset < max_offset,
        answer=lambda: read_queue(services, req, sub),
        current=lambda: int(store.max_queue_offset(topic, queue_id))))
    return None


def consumer_group(services: Services, req: Request, group: str,
                   consuming: bool = True) -> GroupConfig | Response:
    """The group's config (subscriptionGroup.json), or the answer refusing the request:
    SUBSCRIPTION_GROUP_NOT_EXIST for a group not there while autoCreateSubscriptionGroup is
    off, NO_PERMISSION for a PULL or POP (``consuming``) of a group whose consumeEnable is
    false (RocketMQ's answers)."""
    config = services.group_config(group)
    if config is None:
        return reply(req, ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
                     f"subscription group {group} does not exist (autoCreateSubscriptionGroup "
                     f"is off: make it with replog groups --create {group})", {"group": group})
    if consuming and not config.consume_enable:
        return reply(req, ResponseCode.NO_PERMISSION,
                     f"subscription group {group} may not consume: its consumeEnable is false "
                     f"(replog groups --create {group} turns it on)", {"group": group})
    return config


def pull_subscription(services: Services, req: Request) -> Subscription | Response:
    """The pull's subscription (``expressionType`` and ``subscription``, or ``tags``), or the
    answer refusing it: SUBSCRIPTION_PARSE_FAILED for an expression that cannot be read,
    SYSTEM_ERROR for SQL92 while ``enablePropertyFilter`` is off (RocketMQ's answers)."""
    f = req.fields
    kind = f.get("expressionType") or TAG
    expression = f.get("subscription") if f.get("subscription") is not None else f.get("tags")
    if kind.upper() == SQL92 and not services.cfg.enablePropertyFilter:
        return reply(req, ResponseCode.SYSTEM_ERROR,
                     "the broker does not filter messages by SQL92: enablePropertyFilter is "
                     "off (set it true in the broker's config)")
    try:
        return subscription(kind, expression)
    except SelectorError as e:
        return reply(req, ResponseCode.SUBSCRIPTION_PARSE_FAILED,
                     f"the SQL92 subscription cannot be used: {e}")
    except ValueError as e:
        raise ProtocolError("expressionType", str(e)) from None


def read_queue(services: Services, req: Request, sub: Subscription = EVERYTHING) -> Response:
    f = req.fields
    result = services.store.get_message(
        f.get("group") or "",
        f["topic"],
        f["queueId"],
        f["queueOffset"],
        f["maxNums"],
        sub.codes,
        max_bytes=PULL_MAX_BYTES,
        tags=sub.tags,
        selector=sub.selector,
    )
    if result.status is GetStatus.CORRUPT_RECORD and result.corrupt is not None:
        q_off, phy, why = result.corrupt
        err = CorruptMessageError(q_off, phy, why)
        return reply(req, err.code, err.remark,
                     {"corruptQueueOffset": q_off, "corruptCommitLogOffset": phy,
                      "minOffset": result.min_offset, "maxOffset": result.max_offset})
    status, code = PULL_STATUS[result.status]
    fields = {
        "status": status.value,
        "nextBeginOffset": result.next_begin_offset,
        "minOffset": result.min_offset,
        "maxOffset": result.max_offset,
    }
    return reply(
        req,
        code,
        "" if code == ResponseCode.SUCCESS else result.status.value,
        fields,
        [bytes(r) for r in result.records],
    )


def topic_route(ctx: Context, req: Request) -> Response:
    topic = req.fields["topic"]
    nums, auto = ctx.services.topic_queue_nums(topic)
    if nums > 0:
        return reply(req, fields={"queueNums": nums})
    if auto:
        return reply(
            req,
            ResponseCode.TOPIC_NOT_EXIST,
            f"topic {topic} will be auto-created",
            {"queueNums": ctx.services.cfg.defaultTopicQueueNums},
        )
    return reply(req, ResponseCode.TOPIC_NOT_EXIST, f"no topic {topic}", {"queueNums": 0})


def commit_offset(ctx: Context, req: Request) -> Response:
    f = req.fields
    services = ctx.services
    client = f.get("clientId")
    if client:  # a group member: only the queue's owner in the group's view commits
        layout = services.topic_layout(f["topic"])
        if not services.consumer_groups.owns(
                f["group"], client, f["topic"], f["queueId"], layout,
                services.cfg.brokerName):
            return reply(req, ResponseCode.CONSUMER_NOT_ONLINE,
                         f"{client} does not own {f['topic']}/{f['queueId']} in group "
                         f"{f['group']} now (its session ran out or the queue moved): "
                         "offset not committed")
    services.commit_offset(f["group"], f["topic"], f["queueId"], f["queueOffset"])
    return reply(req)


def fetch_offset(ctx: Context, req: Request) -> Response:
    f = req.fields
    offset = ctx.services.fetch_offset(f["group"], f["topic"], f["queueId"])
    return reply(req, fields={"queueOffset": offset})


def search_offset(ctx: Context, req: Request) -> Response:
    f = req.fields
    offset = ctx.services.store.offset_by_time(f["topic"], f["queueId"], f["timestamp"])
    return reply(req, fields={"offset": offset})


def max_offset(ctx: Context, req: Request) -> Response:
    f = req.fields
    return reply(req, fields={"offset": ctx.services.store.max_queue_offset(f["topic"],
                                                                             f["queueId"])})


def min_offset(ctx: Context, req: Request) -> Response:
    f = req.fields
    return reply(req, fields={"offset": ctx.services.store.min_queue_offset(f["topic"],
                                                                             f["queueId"])})


def consumer_heartbeat(ctx: Context, req: Request) -> Response:
    f = req.fields
    if not f["leave"] and ctx.services.store.pop.active(f["group"], int(time.time() * 1000)):
        return reply(req, ResponseCode.BAD_REQUEST, f"group {f['group']} consumes by POP "
                     "here (it popped within the last minute, or holds messages out): one "
                     "group reads one way, POP or offsets; give this consumer a group of its "
                     "own")
    members = ctx.services.consumer_groups.heartbeat(
        f["group"], f["clientId"], f["sessionTimeoutMs"], leave=bool(f["leave"]))
    if not f["leave"]:
        ctx.services.ensure_retry_topic(f["group"])
    return reply(req, fields={"members": members})


def consumer_connections(ctx: Context, req: Request) -> Response:
    """GET_CONSUMER_CONNECTION_LIST: the group's members whose heartbeats are live here
    (RocketMQ's consumerConnection, by client id)."""
    group = req.fields["group"]
    return reply(req, fields={"group": group,
                              "members": ctx.services.consumer_groups.members(group)})


HANDLERS = {
    RequestCode.GET_CONSUMER_CONNECTION_LIST: consumer_connections,
    RequestCode.PULL: pull,
    RequestCode.TOPIC_ROUTE: topic_route,
    RequestCode.COMMIT_OFFSET: commit_offset,
    RequestCode.FETCH_OFFSET: fetch_offset,
    RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: search_offset,
    RequestCode.GET_MAX_OFFSET: max_offset,
    RequestCode.GET_MIN_OFFSET: min_offset,
    RequestCode.CONSUMER_HEARTBEAT: consumer_heartbeat,
}
