"""The broker's own state and operations: STATUS, CLUSTER_INFO, PROMOTE, CLEAR_ELECTION_FAULT,
LOG_CHECKSUM, the tables a slave copies (GET_ALL_*), the consumer groups' configs
(UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, DELETE_SUBSCRIPTIONGROUP), the ACL in force, the
transactions the check-back gave up."""

from __future__ import annotations

import json
import logging

from common.broker.processors.consume import PULL_MAX_BYTES
from common.broker.processors.context import Context
from common.broker.replies import Reply, reply
from common.core.errors import GetStatus, ResponseCode
from common.core.logs import log_event
from common.core.transaction import CHECK_MAX_TOPIC
from common.format.protocol import (
    LOG_CHECKSUM_MAX_BYTES,
    ProtocolError,
    Request,
    RequestCode,
    Response,
)
from common.format.tables import GroupConfig

log = logging.getLogger("replog.admin")


def status(ctx: Context, req: Request) -> Response:
    return reply(req, fields=ctx.services.status())


def cluster_info(ctx: Context, req: Request) -> Response:
    # a JSON body frame: groups -> members -> records nest deeper than a header may
    doc = json.dumps(ctx.services.cluster_info(), separators=(",", ":")).encode()
    return reply(req, fields={"format": "json"}, bodies=[doc])


def promote(ctx: Context, req: Request) -> Reply:
    return ctx.services.promote(req)


def clear_election_fault(ctx: Context, req: Request) -> Response:
    try:
        had = ctx.services.clear_election_fault()
    except ValueError as e:
        return reply(req, ResponseCode.BAD_REQUEST, str(e))
    return reply(req, fields={"cleared": had})


def log_checksum(ctx: Context, req: Request) -> Reply:
    f = req.fields
    if f["toOffset"] < f["fromOffset"]:
        raise ProtocolError("toOffset", f"{f['toOffset']} is below fromOffset "
                            f"{f['fromOffset']}")
    if f["toOffset"] - f["fromOffset"] > LOG_CHECKSUM_MAX_BYTES:
        raise ProtocolError("toOffset", f"at most {LOG_CHECKSUM_MAX_BYTES} bytes per "
                            "request (ask longer ranges in pieces)")
    return ctx.services.log_checksum(req)


def config_document(ctx: Context, req: Request) -> Response:
    return reply(req, bodies=[ctx.services.config_document(req.code)])


def update_group(ctx: Context, req: Request) -> Response:
    """UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: the master writes the group's config (its slaves
    copy it); ``created`` 1 if the group had none."""
    w = ctx.services.writer(req)
    if isinstance(w, Response):
        return w
    f = req.fields
    config = GroupConfig(f["groupName"], bool(f["consumeEnable"]),
                         bool(f["consumeMessageOrderly"]), f["retryMaxTimes"])
    before = ctx.services.groups.update(config)
    if before != config:
        log_event(log, "group_created" if before is None else "group_changed",
                  **config.to_json())
    return reply(req, fields={"created": int(before is None)})


def delete_group(ctx: Context, req: Request) -> Response:
    """DELETE_SUBSCRIPTIONGROUP: the master forgets the group's config, and with
    ``cleanOffset`` its committed offsets (a PULL or POP of it later starts afresh)."""
    w = ctx.services.writer(req)
    if isinstance(w, Response):
        return w
    group = req.fields["groupName"]
    had, removed = ctx.services.delete_group(group, bool(req.fields["cleanOffset"]))
    if had or removed:
        log_event(log, "group_deleted", group=group, offsetsRemoved=removed)
    return reply(req, fields={"deleted": int(had), "offsetsRemoved": removed})


def acl_info(ctx: Context, req: Request) -> Response:
    return reply(req, fields=ctx.services.acl_info())


def given_up_transactions(ctx: Context, req: Request) -> Response:
    """QUERY_GIVEN_UP_TRANSACTIONS: the halves kept in ``TRANS_CHECK_MAX_TIME_TOPIC`` from
    queue offset ``fromOffset`` (records; an END_TRANSACTION naming one's CommitLog offset
    still decides its transaction)."""
    f = req.fields
    result = ctx.services.store.get_message("", CHECK_MAX_TOPIC, 0, f["fromOffset"],
                                            f["maxNums"], max_bytes=PULL_MAX_BYTES)
    fields = {"nextOffset": result.next_begin_offset, "minOffset": result.min_offset,
              "maxOffset": result.max_offset}
    if result.status is not GetStatus.FOUND:
        fields["nextOffset"] = max(result.min_offset, min(f["fromOffset"], result.max_offset))
        return reply(req, fields=fields)
    return reply(req, fields=fields, bodies=[bytes(r) for r in result.records])


HANDLERS = {
    RequestCode.STATUS: status,
    RequestCode.CLUSTER_INFO: cluster_info,
    RequestCode.PROMOTE: promote,
    RequestCode.CLEAR_ELECTION_FAULT: clear_election_fault,
    RequestCode.LOG_CHECKSUM: log_checksum,
    RequestCode.GET_ALL_TOPIC_CONFIG: config_document,
    RequestCode.GET_ALL_CONSUMER_OFFSET: config_document,
    RequestCode.GET_ALL_DELAY_OFFSET: config_document,
    RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG: config_document,
    RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: update_group,
    RequestCode.DELETE_SUBSCRIPTIONGROUP: delete_group,
    RequestCode.GET_BROKER_CLUSTER_ACL_INFO: acl_info,
    RequestCode.QUERY_GIVEN_UP_TRANSACTIONS: given_up_transactions,
}
