"""The check-back of a master (RocketMQ's ``TransactionalMessageCheckService``): every
``transactionCheckInterval`` it reads the half queue from where the last round stopped (the
offset of group ``CID_RMQ_SYS_TRANS`` in the half topic, which slaves copy, so a new master
resumes there) and, for each half:

* decided (an op, or a commit whose op was cut short: the op is written then): passed;
* younger than ``transactionTimeOut``, by its store time (a born time is the client's to
  set): the round ends (later halves were stored later);
* younger than its own ``CHECK_IMMUNITY_TIME_IN_SECONDS`` (at most ``MAX_IMMUNITY_MS``), from
  its first half's store time: put back at the end of the half queue, as it is, and the round
  goes on (RocketMQ's ``putImmunityMsgBackToHalfQueue``): one client's long immunity never
  keeps the halves after it from their checks;
* checked ``transactionCheckMax`` times: kept in ``TRANS_CHECK_MAX_TIME_TOPIC`` and passed;
* else put back at the end of the half queue one check more (the progress moves on, the next
  round meets it again), and a live producer of its group is asked
  (CHECK_TRANSACTION_STATE, on the connection it heartbeats on): its answer's ``state``
  commits or rolls it back through the store's one decision (``common/store/transaction/
  service.py``: a final state is final), UNKNOWN or no answer leaves it for the next round.

The state of each half is looked up by its origin, not taken from an op map built in order,
so a backlog of ops never keeps a half from being checked, and nothing is decided before its
ops are known. A fenced master checks nothing (``gate``).
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from common.broker.producer_groups import ProducerChannel, ProducerGroups
from common.core.config import BrokerConfig
from common.core.errors import BrokerError, PutStatus
from common.core.message import PROPERTY_REAL_TOPIC, PROPERTY_UNIQ_KEY, MessageExt
from common.core.transaction import (
    CHECK_GROUP,
    CHECK_IMMUNITY_SECONDS,
    HALF_TOPIC,
    PRODUCER_GROUP,
    TRANSACTION_ID,
    TransactionState,
)
from common.format.protocol import RequestCode, Response
from common.store.schedule import born_host_of
from common.store.transaction import records

log = logging.getLogger("replog.transaction")

MAX_ROUND_S = 60.0  # RocketMQ's MAX_PROCESS_TIME_LIMIT: a round gives way after this
# a client's CHECK_IMMUNITY_TIME_IN_SECONDS is held to this (or transactionTimeOut if longer):
# a held half is written again each round until then
MAX_IMMUNITY_MS = 3_600_000
# refusals of a half's copy (checked, put back, discarded) that no later round undoes
UNMOVABLE = frozenset((PutStatus.PROPERTIES_SIZE_EXCEEDED, PutStatus.MESSAGE_ILLEGAL))
ASK_TIMEOUT_MS = 3000
BATCH = 256
FIGURES = ("rounds", "checks", "held", "answered_commit", "answered_rollback", "unknown",
           "unanswered", "no_producer", "discarded", "gated", "unmovable")


class Ask(Protocol):
    def __call__(self, identity: bytes, code: RequestCode, fields: Mapping[str, Any] | None = ...,
                 bodies: Sequence[bytes] = ..., timeout_ms: int = ...
                 ) -> concurrent.futures.Future[Response]: ...


class Offsets(Protocol):
    def fetch(self, group: str, topic: str, queue_id: int) -> int: ...

    def commit(self, group: str, topic: str, queue_id: int, queue_offset: int) -> None: ...


class TransactionCheck:
    def __init__(self, cfg: BrokerConfig, store: Any, producers: ProducerGroups, ask: Ask,
                 offsets: Offsets, gate: Callable[[], str] | None = None,
                 clock: Callable[[], float] = time.time,
                 publisher_refusal: Callable[[str, str], str | None] | None = None):
        self.store = store
        # (account, topic) -> why that producer may not be asked about a half of the topic
        # (the ACL: it must be allowed to publish it); None: the ACL is off, any producer will do
        self.publisher_refusal = publisher_refusal
        self.producers = producers
        self.ask = ask
        self.offsets = offsets
        self.gate = gate
        self.clock = clock
        self.timeout_ms = cfg.transactionTimeOut
        self.check_max = cfg.transactionCheckMax
        self.interval_s = cfg.transactionCheckInterval / 1000.0
        # every figure from the start (a metric's series exists before its first event)
        self.stats: collections.Counter[str] = collections.Counter(dict.fromkeys(FIGURES, 0))
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="replog-transaction-check",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.check_round()
            except Exception:
                log.exception("event=transaction_check_failed")

    # ---- one round ------------------------------------------------------------------------
    def check_round(self) -> int:
        """Check what is due; returns the halves looked at."""
        if self.gate is not None and self.gate():
            self.stats["gated"] += 1
            return 0
        cq = self.store.cq_store.get(HALF_TOPIC, 0)
        if cq is None:
            return 0
        progress = self.offsets.fetch(CHECK_GROUP, HALF_TOPIC, 0)
        offset = max(progress, cq.min_queue_offset)
        end = cq.max_queue_offset  # what this round meets: not the copies it puts back
        given_up = time.monotonic() + MAX_ROUND_S
        now_ms = int(self.clock() * 1000)
        seen = 0
        while offset < end and time.monotonic() < given_up and not self._stop.is_set():
            entries = cq.entries(offset, min(BATCH, end - offset))
            if not entries:
                break
            stopped = False
            for queue_offset, phy, _size, _code in entries:
                half = self.store.transactions.half_at(phy)
                if half is not None:
                    seen += 1
                    if not self._one(half, now_ms):
                        stopped = True
                        break
                offset = queue_offset + 1
            if stopped:
                break
        if offset != progress:
            self.offsets.commit(CHECK_GROUP, HALF_TOPIC, 0, offset)
        self.stats["rounds"] += 1
        return seen

    def _one(self, half: MessageExt, now_ms: int) -> bool:
        """Deal with one half; False to end the round here (too young, or a put failed)."""
        tx = self.store.transactions
        decided = tx.decided(half)
        if decided.state is not None:
            if not decided.op:  # a commit without its op: the end was cut short
                tx.end(half, decided.state, born_host_of(half))
            return True
        if records.check_times(half) > 0:  # a copy checked: the next check a timeout after
            if now_ms - half.store_timestamp < self.timeout_ms:
                return False
        else:
            immunity_ms = self._immunity_ms(half)
            if now_ms - self._first_stored(half) < (immunity_ms if immunity_ms is not None
                                                    else self.timeout_ms):
                return immunity_ms is not None and self._hold(half)
        if records.check_times(half) >= self.check_max:
            result = self.store.put_nowait(records.discarded(half), 0, born_host_of(half),
                                           half.born_timestamp)
            if not result.result.ok:
                return self._unmovable(half, result.result)
            self.stats["discarded"] += 1
            log.warning("event=transaction_check_max half=%d origin=%d group=%s checks=%d: "
                        "kept in TRANS_CHECK_MAX_TIME_TOPIC", half.commit_log_offset,
                        records.origin_of(half), half.properties.get(PRODUCER_GROUP),
                        records.check_times(half))
            return True
        copy = self.store.put_nowait(records.checked_again(half), 0, born_host_of(half),
                                     half.born_timestamp)
        if not copy.result.ok:
            return self._unmovable(half, copy.result)
        self.stats["checks"] += 1
        self._ask(half, copy.result.phy_offset, copy.result.queue_offset)
        return True

    def _hold(self, half: MessageExt) -> bool:
        """Put a half not due yet by its own immunity back at the end of the half queue."""
        result = self.store.put_nowait(records.put_back(half), 0, born_host_of(half),
                                       half.born_timestamp)
        if not result.result.ok:
            return self._unmovable(half, result.result)
        self.stats["held"] += 1
        return True

    def _unmovable(self, half: MessageExt, result: Any) -> bool:
        """A copy of ``half`` the store refused: False (the round ends here, and meets it
        again) unless no retry can succeed (its properties, at the limit, leave no room for
        the copy's marks): then it is passed for good, logged and counted, so that the halves
        after it are still checked. It stays open: an END by its producer still decides it."""
        if result.status not in UNMOVABLE:
            return False
        self.stats["unmovable"] += 1
        log.error("event=transaction_check_unmovable half=%d origin=%d group=%s status=%s (%s)",
                  half.commit_log_offset, records.origin_of(half),
                  half.properties.get(PRODUCER_GROUP), result.status.name, result.remark)
        return True

    def _immunity_ms(self, half: MessageExt) -> int | None:
        """The half's own CHECK_IMMUNITY_TIME_IN_SECONDS, capped; None if it sets none (or
        one that is no count of seconds)."""
        text = half.properties.get(CHECK_IMMUNITY_SECONDS, "")
        if not (text.isascii() and text.isdigit()):
            return None
        cap_ms = max(MAX_IMMUNITY_MS, self.timeout_ms)
        return cap_ms if len(text) > 10 else min(int(text) * 1000, cap_ms)

    def _first_stored(self, half: MessageExt) -> int:
        """When the transaction's first half was stored (a copy put back carries its origin);
        0 if retention deleted it (long past any immunity)."""
        origin = records.origin_of(half)
        if origin == half.commit_log_offset:
            return half.store_timestamp
        first = self.store.transactions.half_at(origin)
        return first.store_timestamp if first is not None else 0

    def _ask(self, half: MessageExt, copy_offset: int, copy_queue_offset: int) -> None:
        group = half.properties.get(PRODUCER_GROUP, "")
        topic = half.properties.get(PROPERTY_REAL_TOPIC, "")
        refusal = self.publisher_refusal
        # the half's body and its decision go only to an account that may publish its topic
        channel = self.producers.pick(group, None if refusal is None else
                                      lambda c: refusal(c.account, topic) is None)
        if channel is None:
            self.stats["no_producer"] += 1
            return  # the copy is met again next round
        body = self.store.entry_record(copy_offset) or b""
        tx_id = half.properties.get(TRANSACTION_ID) or half.properties.get(PROPERTY_UNIQ_KEY, "")
        fields = {"topic": half.properties[PROPERTY_REAL_TOPIC], "producerGroup": group,
                  "commitLogOffset": copy_offset, "tranStateTableOffset": copy_queue_offset,
                  "msgId": half.properties.get(PROPERTY_UNIQ_KEY, ""), "transactionId": tx_id}
        future = self.ask(channel.identity, RequestCode.CHECK_TRANSACTION_STATE, fields,
                          [bytes(body)], ASK_TIMEOUT_MS)
        future.add_done_callback(lambda f: self._answered(f, copy_offset, channel))

    def _answered(self, future: concurrent.futures.Future[Response], copy_offset: int,
                  channel: ProducerChannel) -> None:
        """The producer's answer (the request server's I/O thread, or the ask's timeout)."""
        try:
            resp = future.result()
        except BrokerError as e:
            self.producers.silent(channel)  # asked no more while another of its group answers
            self.stats["unanswered"] += 1
            log.info("event=transaction_check_unanswered half=%d reason=%r", copy_offset,
                     e.remark)
            return
        state = _answered_state(resp)
        if state is None or state is TransactionState.UNKNOWN:
            self.stats["unknown"] += 1
            return
        if self.gate is not None and self.gate():
            self.stats["gated"] += 1
            return
        half = self.store.transactions.half_at(copy_offset)
        if half is None:
            return
        result = self.store.transactions.end(half, state, born_host_of(half))
        if result.conflict is not None:
            log.warning("event=transaction_check_conflict half=%d answered=%s decided=%s",
                        copy_offset, state.value, result.conflict.value)
        self.stats["answered_" + state.value.lower()] += 1

    def status(self) -> dict[str, Any]:
        return dict(sorted(self.stats.items()))


def _answered_state(resp: Response) -> TransactionState | None:
    if not resp.ok:
        return None
    try:
        return TransactionState(str(resp.fields.get("state", "")))
    except ValueError:
        return None
