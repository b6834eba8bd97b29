"""A master's POP requests (POP_MESSAGE, ACK_MESSAGE, CHANGE_MESSAGE_INVISIBLETIME) and its
revive thread, over the store's POP state (``common/store/pop/``).

Each request writes its revive record under the state's lock and is answered once that record
is as durable as a SEND (SYNC_MASTER: the SyncStateSet holds it): what a consumer was handed,
and what it acked, survive a failover. A POP whose record could not be replicated in time still
hands its messages out (they are the consumer's until their deadline), saying so
(``durability``); an ACK so is answered as a SEND would be (FLUSH_SLAVE_TIMEOUT: acked here,
perhaps not on the next master).

The revive thread (``PopRevive``, the master's) moves a message whose deadline passed after it
was handed out ``maxReconsumeTimes`` + 1 times to the group's DLQ (``%DLQ%<group>``, as a
send-back would: ``master/send_back.py``), then resolves it (a ``dlq`` record).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from common.broker.replies import Reply, reply
from common.core.errors import PutStatus, ResponseCode
from common.core.logs import log_event
from common.core.pop import ReceiptHandle
from common.core.subscription import Subscription
from common.format.protocol import Request, Response
from common.format.record import decode_message
from common.store.pop import records
from master import send_back

if TYPE_CHECKING:
    from master.role import MasterRole

log = logging.getLogger("replog.pop")

REVIVE_INTERVAL_S = 0.2


def pop_message(role: MasterRole, req: Request, sub: Subscription, queues: list[int],
                start: Callable[[int], int], order: bool, max_reconsume_times: int) -> Reply:
    """Hand out up to ``maxNums`` messages of the queues in turn (the first that has some);
    ``start(queue_id)``: where the group begins a queue it never popped; ``order``: FIFO
    (a queue's next message only after the one before it is done); a message handed out
    ``max_reconsume_times`` + 1 times goes to the DLQ when its time runs out."""
    f = req.fields
    group, topic = f["group"], f["topic"]
    now = int(time.time() * 1000)
    invisible = f["invisibleTime"]
    pop_store = role.store.pop
    broker = role.cfg.brokerName
    for queue_id in queues:
        got = pop_store.pop((group, topic, queue_id), functools.partial(start, queue_id),
                            f["maxNums"], invisible, now, order, sub,
                            max_reconsume_times + 1, req.born_host)
        if got.pending is not None and not got.pending.result.ok:
            return role.refused_put(req, got.pending)
        if not got.records:
            continue
        handles = [ReceiptHandle(broker, topic, queue_id, off, got.handle, now,
                                 invisible).encode() for off in got.offsets]
        fields: dict[str, Any] = {"status": "FOUND", "queueId": queue_id,
                                  "handles": handles,
                                  "reconsumeTimes": [a - 1 for a in got.attempts],
                                  "popTime": now, "invisibleTime": invisible}
        bodies = got.records

        def answer(status: PutStatus, fields: dict[str, Any] = fields,
                   bodies: list[bytes] = bodies) -> Response:
            fields["durability"] = status.value
            return reply(req, fields=fields, bodies=bodies)

        assert got.pending is not None
        return role.when_durable(got.pending, answer)
    return reply(req, ResponseCode.PULL_NOT_FOUND, "no message to hand out",
                 {"status": "NO_NEW_MSG"})


def _handle(role: MasterRole, req: Request) -> ReceiptHandle | Response:
    """The request's receipt handle, if it names a record of this broker group and of the
    request's topic (never a system one: the server refused it); else the refusal."""
    try:
        handle = ReceiptHandle.decode(req.fields["receiptHandle"])
    except ValueError as e:
        return reply(req, ResponseCode.BAD_REQUEST, str(e), {"field": "receiptHandle"})
    if handle.topic != req.fields["topic"]:
        return reply(req, ResponseCode.BAD_REQUEST, f"the receipt handle is of topic "
                     f"{handle.topic}, not {req.fields['topic']}", {"field": "receiptHandle"})
    if handle.broker_name != role.cfg.brokerName:
        return reply(req, ResponseCode.MESSAGE_ILLEGAL, f"the receipt handle is of broker "
                     f"group {handle.broker_name}, not {role.cfg.brokerName}")
    return handle


def ack_message(role: MasterRole, req: Request) -> Reply:
    handle = _handle(role, req)
    if isinstance(handle, Response):
        return handle
    key = (req.fields["group"], handle.topic, handle.queue_id)
    done = role.store.pop.ack(key, handle.offset, handle.handle, int(time.time() * 1000),
                              req.born_host)
    if done.error:
        return reply(req, ResponseCode.MESSAGE_ILLEGAL, f"ack refused: {done.error}")
    if done.pending is None:
        return reply(req, fields={"acked": 1, "already": 1})
    if not done.pending.result.ok:
        return role.refused_put(req, done.pending)
    return role.when_durable(done.pending, lambda status: role.put_answer(
        req, status, {"acked": 1}))


def batch_ack(role: MasterRole, req: Request) -> Reply:
    """BATCH_ACK_MESSAGE: one record per queue named; answered once the last is durable.
    ``failed``: the handles that acked nothing, each with why (the others are acked)."""
    by_key: dict[tuple[str, str, int], list[tuple[int, int]]] = {}
    texts: dict[tuple[str, str, int], list[str]] = {}  # each entry's handle as sent
    failed: list[list[str]] = []
    group, topic = req.fields["group"], req.fields["topic"]
    for raw in req.bodies:
        text = bytes(raw).decode("utf-8", "replace")
        try:
            handle = ReceiptHandle.decode(text)
        except ValueError as e:
            failed.append([text[:200], str(e)])
            continue
        if handle.topic != topic or handle.broker_name != role.cfg.brokerName:
            failed.append([text[:200], (f"a handle of {handle.broker_name}/{handle.topic}, "
                                        f"not {role.cfg.brokerName}/{topic}")])
            continue
        by_key.setdefault((group, topic, handle.queue_id), []).append(
            (handle.offset, handle.handle))
        texts.setdefault((group, topic, handle.queue_id), []).append(text)
    last = None
    now = int(time.time() * 1000)
    for key, entries in by_key.items():
        errors, pending = role.store.pop.ack_many(key, entries, now, req.born_host)
        failed += [[texts[key][i][:200], why] for i, why in errors]
        if pending is not None:
            if not pending.result.ok:
                return role.refused_put(req, pending)
            last = pending
    acked = len(req.bodies) - len(failed)
    if last is None:
        return reply(req, fields={"acked": acked, "failed": failed})
    return role.when_durable(last, lambda status: role.put_answer(
        req, status, {"acked": acked, "failed": failed}))


def change_invisible(role: MasterRole, req: Request) -> Reply:
    handle = _handle(role, req)
    if isinstance(handle, Response):
        return handle
    invisible = req.fields["invisibleTime"]
    key = (req.fields["group"], handle.topic, handle.queue_id)
    now = int(time.time() * 1000)
    done = role.store.pop.change(key, handle.offset, handle.handle, invisible, now,
                                 req.born_host)
    if done.error:
        return reply(req, ResponseCode.MESSAGE_ILLEGAL, f"change refused: {done.error}")
    assert done.pending is not None
    if not done.pending.result.ok:
        return role.refused_put(req, done.pending)
    new = handle._replace(handle=done.handle, pop_time_ms=now, invisible_ms=invisible)
    return role.when_durable(done.pending, lambda status: role.put_answer(
        req, status, {"receiptHandle": new.encode(), "popTime": now,
                      "invisibleTime": invisible}))


# a DLQ copy's put refused so is refused again each round: the message is given up instead
UNMOVABLE = frozenset((PutStatus.PROPERTIES_SIZE_EXCEEDED, PutStatus.MESSAGE_ILLEGAL))


class PopRevive:
    """The master's thread that gives up messages handed out too often to the DLQ."""

    def __init__(self, role: MasterRole, gate: Callable[[], str] | None = None):
        self.role = role
        self.gate = gate
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.moved = 0
        self.given_up = 0  # due for the DLQ, but no copy could be made (logged each)

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="replog-pop-revive", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(REVIVE_INTERVAL_S):
            try:
                self.revive_once(int(time.time() * 1000))
            except Exception:
                log.exception("event=pop_revive_failed")

    def revive_once(self, now_ms: int) -> int:
        """Move what is due for the DLQ; how many were moved."""
        if self.gate is not None and self.gate():
            return 0  # a fenced master writes nothing
        store = self.role.store
        moved = 0
        for key, offset, out in store.pop.due_for_dlq(now_ms):
            group, topic, queue_id = key
            got = store.get_message(group, topic, queue_id, offset, 1)
            if got.records:
                stored = decode_message(got.records[0])
                stored.reconsume_times = out.attempts - 1  # as the consumer saw it last
                try:
                    back = send_back.plan(stored, group, topic, -1, 0, 0)
                except send_back.SendBackRefused as e:  # no copy can be made: given up here
                    self._give_up(key, offset, out, now_ms, str(e))
                    continue
                self.role.ensure_topic(back.message.topic)
                pending = store.put_nowait(back.message, 0, ("0.0.0.0", 0),
                                           stored.born_timestamp)
                status = pending.result.status
                if status in UNMOVABLE:  # the copy can never be stored: given up here
                    self._give_up(key, offset, out, now_ms,
                                  f"{status.name}: {pending.result.remark}")
                    continue
                if not pending.result.ok:
                    continue  # tried again next round
            done = store.pop.ack(key, offset, out.handle, now_ms, kind=records.DLQ)
            if not done.error:
                moved += 1
                log_event(log, "pop_dead_letter", group=group, topic=topic, queue=queue_id,
                          offset=offset, attempts=out.attempts)
        self.moved += moved
        return moved

    def _give_up(self, key: tuple[str, str, int], offset: int, out: Any, now_ms: int,
                 why: str) -> None:
        """A message due for the DLQ that cannot be copied there (one of a DLQ topic itself,
        one whose copy the store refuses for good): resolved without a copy, so that it no
        longer holds its slot (nor, FIFO, its queue), nor stops the round for the others."""
        done = self.role.store.pop.ack(key, offset, out.handle, now_ms, kind=records.DLQ)
        if done.error:
            return
        self.given_up += 1
        log.error("event=pop_dead_letter_given_up group=%s topic=%s queue=%d offset=%d "
                  "reason=%s", *key, offset, why)
