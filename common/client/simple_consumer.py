"""SimpleConsumer: RocketMQ 5's POP consumer (docs/contract.md §4, §9.12).

``receive`` hands this consumer up to ``max_nums`` messages of a topic, each hidden from the
group's other consumers for ``invisible_ms``; ``ack`` says one is done, by its receipt handle;
``change_invisible_duration`` hides it longer (and gives a new handle). A message not acked
in time is handed out again (to any consumer of the group), its ``reconsume_times`` one more;
after ``max_reconsume_times`` more it goes to the group's DLQ. Any number of consumers share
a topic's queues, with no rebalance; a slow one holds back nobody.

Over several broker groups a receive pops each group holding the topic in turn (the first
that has messages answers), starting one group further at each call; waiting, it waits on each
``POP_SLICE_MS`` at a time. Acks and changes go to the group the receipt handle names.

``fifo``: a message group's messages (``__SHARDINGKEY``, a producer's ``shard_key``) are handed
out one at a time, in the order stored: the next only once the one before was acked (or went
to the DLQ).
"""

from __future__ import annotations

import copy
import itertools
import logging
import threading
import time
from collections.abc import Iterable
from typing import Any, NamedTuple

from common.client.consumer import Consumer
from common.core.errors import BrokerError, ResponseCode
from common.core.message import MessageExt
from common.core.pop import ReceiptHandle
from common.format.protocol import (
    BODY_FIELD,
    ProtocolError,
    RequestCode,
    Response,
    decode_record,
)

log = logging.getLogger("replog.client")

DEFAULT_INVISIBLE_MS = 30_000
POP_SLICE_MS = 500  # over several broker groups, a receive waits on each this long in turn


class Received(NamedTuple):
    message: MessageExt  # reconsume_times: how many times it was handed out before
    receipt_handle: str


class SimpleConsumer(Consumer):
    def __init__(self, servers: str | Iterable[str], group: str, **options: Any):
        """``group``: the consumer group (its consumers share the messages); ``options``: as
        ``Consumer``'s."""
        super().__init__(servers, group, **options)
        self._turn = itertools.count()  # which broker group a receive tries first

    def for_group(self, group: str) -> SimpleConsumer:
        """This consumer as ``group``'s, on this one's transport, discovery and routes: no
        thread, socket or context of its own, so a front end serving any number of groups
        holds one client. Close the consumer it came from, never the view (that would close
        the shared transport)."""
        view = copy.copy(self)
        view.group = group
        view._turn = itertools.count()
        view._unsent_commits = {}
        view._commits_lock = threading.Lock()
        return view

    def receive(self, topic: str, max_nums: int = 16, invisible_ms: int = DEFAULT_INVISIBLE_MS,
                wait_ms: int = 0, *, queue_id: int = -1, tags: str | None = None,
                sql: str | None = None, fifo: bool = False,
                max_reconsume_times: int | None = None,
                from_newest: bool = False, broker_name: str | None = None) -> list[Received]:
        """Up to ``max_nums`` (1..32) messages, waiting up to ``wait_ms`` for the first (the
        broker holds the request: long polling). ``tags``/``sql`` filter on the broker as a
        pull's do. A group that never read the topic starts at its oldest messages
        (``from_newest``: at the newest) unless it committed offsets by pulling. ``fifo``: a
        queue's messages in order (so too, whatever is asked, for a group made
        consumeMessageOrderly); ``max_reconsume_times``: hand-outs again before the DLQ (None:
        the group's ``retryMaxTimes``, 16 unless configured)."""
        resp = self.receive_answer(topic, max_nums, invisible_ms, wait_ms, queue_id=queue_id,
                                   tags=tags, sql=sql, fifo=fifo,
                                   max_reconsume_times=max_reconsume_times,
                                   from_newest=from_newest, broker_name=broker_name)
        return [] if resp is None else _received(resp)

    def receive_answer(self, topic: str, max_nums: int = 16,
                       invisible_ms: int = DEFAULT_INVISIBLE_MS, wait_ms: int = 0, *,
                       queue_id: int = -1, tags: str | None = None, sql: str | None = None,
                       fifo: bool = False, max_reconsume_times: int | None = None,
                       from_newest: bool = False,
                       broker_name: str | None = None) -> Response | None:
        """``receive``'s POP answer as the broker gave it (SUCCESS; its records, handles and
        counts not read yet), or None when nothing came: for a caller that reads the records
        itself (the gRPC front end makes its messages from their bytes, ``convert.received``).
        """
        fields = pop_fields(self.group, topic, max_nums, invisible_ms, queue_id=queue_id,
                            tags=tags, sql=sql, fifo=fifo,
                            max_reconsume_times=max_reconsume_times, from_newest=from_newest)
        clusters = self._pop_clusters(topic, broker_name, queue_id)
        deadline = time.monotonic() + wait_ms / 1000
        if len(clusters) == 1:
            return self._pop(clusters[0], fields, deadline, None)
        # several broker groups hold the topic: each in turn, starting one further each call;
        # first without waiting, then waiting on each a slice at a time
        turn = next(self._turn)
        order = [clusters[(turn + i) % len(clusters)] for i in range(len(clusters))]
        for cluster in order:
            got = self._pop(cluster, fields, time.monotonic(), None)
            if got is not None:
                return got
        while time.monotonic() < deadline:
            round_started = time.monotonic()
            for cluster in order:
                got = self._pop(cluster, fields, deadline, POP_SLICE_MS)
                if got is not None:
                    return got
            if time.monotonic() - round_started < 0.05:  # answered at once (a broker draining)
                self._closed.wait(0.05)
        return None

    def _pop_clusters(self, topic: str, broker_name: str | None, queue_id: int) -> list[Any]:
        """Where a receive pops: the group named, or every broker group holding the topic
        (RocketMQ 5's clients take a topic's queues over every broker in turn)."""
        if broker_name is None and queue_id < 0:
            table = self._routes.wait_table(self._closed, self.timeout_ms)
            held = sorted({mq.broker_name for mq in table.readable(topic)})
            if len(held) > 1:
                return [self._routes.cluster(name, table) for name in held]
        cluster, _, _ = self._target(topic, broker_name)
        return [cluster]

    def _pop(self, cluster: Any, fields: dict[str, Any], deadline: float,
             slice_ms: int | None) -> Response | None:
        """POP from one broker group, waiting until ``deadline`` (at most ``slice_ms``) for a
        message: its SUCCESS answer, None when none came."""
        while True:
            poll_ms = max(0, int((deadline - time.monotonic()) * 1000))
            if slice_ms is not None:
                poll_ms = min(poll_ms, slice_ms)
            asked = {**fields, "pollTime": poll_ms}

            def attempt(address: str, asked: dict[str, Any] = asked) -> Any:
                return cluster.request(address, RequestCode.POP_MESSAGE, asked,
                                       timeout_ms=self.timeout_ms + asked["pollTime"])

            resp = self._with_retries(attempt, cluster=cluster)
            if resp.code == ResponseCode.SUCCESS:
                return resp if resp.bodies else None
            if resp.code == ResponseCode.PULL_RETRY_IMMEDIATELY and time.monotonic() < deadline:
                continue  # a message arrived while the broker held the request: pop it
            if resp.code in (ResponseCode.PULL_NOT_FOUND, ResponseCode.PULL_RETRY_IMMEDIATELY):
                return None
            raise BrokerError(resp.code, resp.remark)

    def ack(self, received: Received | str) -> None:
        """The message is done; BrokerError MESSAGE_ILLEGAL when the handle is not its newest
        (it was handed out again since: ack that one)."""
        self._by_handle(received, RequestCode.ACK_MESSAGE, {})

    def ack_batch(self, received: Iterable[Received | str]) -> list[tuple[str, str]]:
        """Ack many at once (one request per topic); the (handle, why) of each that acked
        nothing (not its newest handle, ...), the others acked."""
        by_topic: dict[tuple[str, str], list[str]] = {}
        for r in received:
            text = r.receipt_handle if isinstance(r, Received) else r
            try:
                handle = ReceiptHandle.decode(text)
            except ValueError as e:
                raise BrokerError(ResponseCode.BAD_REQUEST, str(e), False) from None
            by_topic.setdefault((handle.broker_name, handle.topic), []).append(text)
        failed: list[tuple[str, str]] = []
        for (broker_name, topic), handles in by_topic.items():
            cluster, _, _ = self._target(topic, broker_name)
            fields = {"topic": topic, "group": self.group}
            bodies = [h.encode() for h in handles]

            def attempt(address: str, fields: dict[str, Any] = fields,
                        bodies: list[bytes] = bodies, cluster: Any = cluster) -> Any:
                resp = cluster.request(address, RequestCode.BATCH_ACK_MESSAGE, fields, bodies)
                if resp.code != ResponseCode.SUCCESS:
                    raise BrokerError(resp.code, resp.remark)
                return resp

            resp = self._with_retries(attempt, cluster=cluster)
            failed += [(str(h), str(why)) for h, why in resp.fields.get("failed") or []]
        return failed

    def change_invisible_duration(self, received: Received | str, invisible_ms: int) -> str:
        """Hide the message ``invisible_ms`` from now; its new receipt handle (the old one is
        spent)."""
        resp = self._by_handle(received, RequestCode.CHANGE_MESSAGE_INVISIBLETIME,
                               {"invisibleTime": invisible_ms})
        return str(resp.fields["receiptHandle"])

    def _by_handle(self, received: Received | str, code: RequestCode,
                   extra: dict[str, Any]) -> Any:
        text = received.receipt_handle if isinstance(received, Received) else received
        try:
            handle = ReceiptHandle.decode(text)
        except ValueError as e:
            raise BrokerError(ResponseCode.BAD_REQUEST, str(e), False) from None
        cluster, _, _ = self._target(handle.topic, handle.broker_name)
        fields = {"topic": handle.topic, "group": self.group, "receiptHandle": text, **extra}

        def attempt(address: str) -> Any:
            resp = cluster.request(address, code, fields)
            if resp.code != ResponseCode.SUCCESS:
                raise BrokerError(resp.code, resp.remark)
            return resp

        return self._with_retries(attempt, cluster=cluster)


def pop_fields(group: str, topic: str, max_nums: int, invisible_ms: int, *, queue_id: int = -1,
               tags: str | None = None, sql: str | None = None, fifo: bool = False,
               max_reconsume_times: int | None = None,
               from_newest: bool = False) -> dict[str, Any]:
    """A POP_MESSAGE's fields but its ``pollTime`` (``receive``'s arguments; the gRPC front
    end's POPs to its own broker are the same requests)."""
    if tags and sql is not None:
        raise ValueError("subscribe by tags or by sql, not both")
    fields: dict[str, Any] = {"topic": topic, "group": group, "queueId": queue_id,
                              "maxNums": max_nums, "invisibleTime": invisible_ms,
                              "order": int(fifo), "initMode": int(from_newest)}
    if max_reconsume_times is not None:
        fields["maxReconsumeTimes"] = max_reconsume_times
    if tags:
        fields["subscription"] = tags
    if sql is not None:
        fields["expressionType"] = "SQL92"
        fields["subscription"] = sql
    return fields


def _received(resp: Response) -> list[Received]:
    handles = resp.fields.get("handles") or []
    times = resp.fields.get("reconsumeTimes") or []
    if not len(handles) == len(times) == len(resp.bodies):
        raise BrokerError(ResponseCode.SYSTEM_ERROR, "a POP answer whose handles, counts and "
                          "messages do not line up")
    out = []
    for raw, handle, n in zip(resp.bodies, handles, times, strict=True):
        try:
            msg = decode_record(raw)
        except ProtocolError as e:
            if e.field == BODY_FIELD:  # one producer's body: the others are still handed on
                log.warning("event=pop_body_unreadable handle=%s reason=%s", handle, e.reason)
                continue  # not acked: it comes back, then goes to the DLQ
            raise BrokerError(ResponseCode.SYSTEM_ERROR, f"corrupt record in answer: {e}") \
                from None
        msg.reconsume_times = int(n)
        out.append(Received(msg, str(handle)))
    return out
