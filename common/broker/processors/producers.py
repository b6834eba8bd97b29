"""Producers: the live producers of a group (``common/broker/producer_groups.py``), and the
figures the broker asks each of them for on its own connection (GET_CLIENT_RUNNING_INFO,
served by the client: ``common/client/transport.py``'s ``serve``)."""

from __future__ import annotations

import concurrent.futures
import threading
from typing import Any

from common.broker.processors.context import Context
from common.broker.replies import Reply, reply
from common.core.errors import BrokerError
from common.format.protocol import Request, RequestCode, Response

RUNNING_INFO_TIMEOUT_MS = 3000


def heartbeat(ctx: Context, req: Request) -> Response:
    """PRODUCER_HEARTBEAT: this connection is how the group's producer ``clientId`` is
    reached (or, with ``leave``, it is gone), as the account it authenticated as (a
    check-back goes only to an account that may publish the half's topic); answers the
    group's live producers."""
    f = req.fields
    ip, port = req.born_host
    account = ctx.caller.user if ctx.caller is not None else ""
    live = ctx.services.producer_groups.heartbeat(
        f["group"], f["clientId"], ctx.identity, f"{ip}:{port}", leave=bool(f["leave"]),
        account=account)
    return reply(req, fields={"producers": live})


def connections(ctx: Context, req: Request) -> Reply:
    """GET_PRODUCER_CONNECTION_LIST: who produces for the group; with ``runningInfo``, each
    one's own figures too (asked all at once; one that does not answer says why)."""
    group = req.fields["group"]
    registry = ctx.services.producer_groups
    live = registry.live(group)
    now = registry.now()
    listed = [channel.to_json(now) for channel in live]
    if not req.fields["runningInfo"] or not live:
        return reply(req, fields={"group": group, "producers": listed})
    asks = [ctx.ask(channel.identity, RequestCode.GET_CLIENT_RUNNING_INFO,
                    timeout_ms=RUNNING_INFO_TIMEOUT_MS) for channel in live]
    return _gather(req, group, listed, asks)


def _gather(req: Request, group: str, listed: list[dict[str, Any]],
            asks: list[concurrent.futures.Future[Response]]
            ) -> concurrent.futures.Future[Response]:
    """One answer once every producer answered or timed out (the asks' own deadlines)."""
    out: concurrent.futures.Future[Response] = concurrent.futures.Future()
    lock = threading.Lock()
    left = [len(asks)]

    def one_done(_f: concurrent.futures.Future[Response]) -> None:
        with lock:
            left[0] -= 1
            if left[0]:
                return
        for doc, ask in zip(listed, asks, strict=True):
            try:
                resp = ask.result()
            except BrokerError as e:
                doc["runningInfo"] = {"error": e.remark}
                continue
            doc["runningInfo"] = resp.fields if resp.ok else {"error": resp.remark}
        out.set_result(reply(req, fields={"group": group, "producers": listed}))

    for ask in asks:
        ask.add_done_callback(one_done)
    return out


HANDLERS = {
    RequestCode.PRODUCER_HEARTBEAT: heartbeat,
    RequestCode.GET_PRODUCER_CONNECTION_LIST: connections,
}
