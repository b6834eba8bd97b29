"""Look-ups: by key, by msgId, by CommitLog offset. Found messages travel as their stored
record bytes (the client checks and decodes them)."""

from __future__ import annotations

from typing import Any

from common.broker.processors.context import Context
from common.broker.replies import reply
from common.core.errors import ResponseCode
from common.core.message import MessageExt, decode_msg_id
from common.format.acl import SUB
from common.format.boundary import record_refusal
from common.format.protocol import ProtocolError, Request, RequestCode, Response
from common.store.api import ReadStore


def query_by_key(ctx: Context, req: Request) -> Response:
    f = req.fields
    found = ctx.services.store.query_by_key(
        f["topic"], f["key"], max_nums=f["maxNums"], begin_ms=f["beginMs"], end_ms=f["endMs"]
    )
    return messages_reply(req, found, ctx.services.store)  # the server refused a system topic


def query_by_msg_id(ctx: Context, req: Request) -> Response:
    msg_id = req.fields["msgId"]
    try:
        ip, port, phy_offset = decode_msg_id(msg_id)
    except ValueError as e:
        raise ProtocolError("msgId", str(e)) from None
    found = ctx.services.store.message_by_msg_id(msg_id)
    if found is None:  # not here: the msgId may name another broker's record
        return reply(req, ResponseCode.QUERY_NOT_FOUND,
                     f"no message {msg_id} here: it names the broker at {ip}:{port} "
                     f"(CommitLog offset {phy_offset}), and no record stored by "
                     f"{ip}:{port} starts at that offset on this broker")
    return found_reply(ctx, req, [found])


def query_by_offset(ctx: Context, req: Request) -> Response:
    found = ctx.services.store.message_by_offset(req.fields["phyOffset"])
    return found_reply(ctx, req, [found] if found is not None else [])


def found_reply(ctx: Context, req: Request, found: list[Any]) -> Response:
    """A look-up by msgId or offset may name any record: one of a system topic is refused
    (``record_refusal``), and with security on the caller needs SUB on the topic found."""
    for msg in found:
        refusal = record_refusal(msg.topic)
        if refusal is not None:
            return reply(req, ResponseCode.NO_PERMISSION, refusal)
    caller = ctx.caller
    if caller is not None:
        for msg in found:
            denial = caller.account.may_topic(msg.topic, SUB)
            if denial is not None:
                return reply(req, ResponseCode.NO_PERMISSION, ctx.refused(denial),
                             {"account": denial.account})
    return messages_reply(req, found, ctx.services.store)


def messages_reply(req: Request, found: list[MessageExt], store: ReadStore) -> Response:
    records = [r for r in (store.record_at(m.commit_log_offset) for m in found) if r is not None]
    if not records:
        return reply(req, ResponseCode.QUERY_NOT_FOUND, "no message found")
    return reply(req, bodies=records)


HANDLERS = {
    RequestCode.QUERY_BY_KEY: query_by_key,
    RequestCode.QUERY_BY_MSG_ID: query_by_msg_id,
    RequestCode.QUERY_BY_OFFSET: query_by_offset,
}
