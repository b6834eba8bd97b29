"""Transactions in a drill (docs/drills.md "Transactions"): a producer running transactions
whose local outcome is drawn at random, and the checker of what the consumers saw.

History (``history.py``'s lines, ``proc`` the worker):

* ``{op: tx, type: invoke, msg_id}``: a half is about to be sent;
* ``{op: tx, type: ok|fail|info, msg_id, status, phase: half}``: how its send ended (a half
  that is not SEND_OK never runs its local transaction: its application decides ROLLBACK);
* ``{op: decide, type: info, msg_id, status: COMMIT|ROLLBACK}``: the application's decision,
  made once, before any end is sent (a sixth of the local transactions answer UNKNOWN first and
  leave the decision to the broker's check-back, which the checker answers with it);
* ``{op: tx, type: ok|conflict|info, msg_id, status, phase: end}``: how the END ended
  (``conflict``: refused as decided the other way, which must never happen here).

The consumer of the transactional topic records ``get`` lines as the plain one does, under
its own ``proc``. ``check_transactions`` reports: rolled back and consumed, committed and
lost (an acknowledged half decided COMMIT, not in the final drain once the check-back has had
its time), consumed before its commit was decided, and both (an end refused as decided the
other way, or a message consumed twice): each must be 0.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from typing import Any

from common.client import TransactionProducer, TransactionState
from common.core.errors import ResponseCode
from common.core.message import MessageExt
from common.drill.history import CLIENT_TIMEOUT_MS, QUEUES, History, classify, make_body, parse_body
from common.drill.workload import Worker

TX_CONSUMER = "tx-consumer"
PRODUCER_GROUP = "drill-tx"
TX_PROBLEM_KEYS = ("tx_rolled_back_consumed", "tx_committed_lost", "tx_consumed_before_commit",
                   "tx_both")
COMMIT, ROLLBACK, UNKNOWN = TransactionState.COMMIT, TransactionState.ROLLBACK, \
    TransactionState.UNKNOWN


def tx_topic(topic: str) -> str:
    """The transactional messages' topic beside a drill's plain ``topic``."""
    return f"{topic}-tx"


class TransactionWorker(Worker):
    """Runs ``rate`` transactions per second: a half (one queue after another), a local
    transaction deciding COMMIT (1/2), ROLLBACK (1/3) or UNKNOWN then one of them (1/6, for
    the check-back), and its END. Stopped, it sends no more but keeps answering check-backs
    until ``release``: the broker decides what was left open by asking it."""

    def __init__(self, history: History, servers: list[str], producer_id: str, rate: float,
                 topic: str, size: int = 512, seed: int = 0, group: str | None = None):
        super().__init__(producer_id)
        self.history = history
        self.servers = servers
        self.producer_id = producer_id
        self.interval = 1.0 / rate
        self.topic = topic
        self.size = size
        self.group = group
        self.rng = random.Random(f"{seed}-{producer_id}-tx")
        self._decisions: dict[str, TransactionState] = {}
        self._lock = threading.Lock()
        self._released = threading.Event()
        self.checks = 0

    def release(self) -> None:
        self._released.set()

    def decide(self, msg_id: str, state: TransactionState) -> TransactionState:
        """The application's decision for ``msg_id``: the first one made stands."""
        with self._lock:
            known = self._decisions.get(msg_id)
            if known is not None:
                return known
            self._decisions[msg_id] = state
        self.history.add(self.producer_id, "decide", "info", msg_id=msg_id, status=state.value)
        return state

    def _check(self, half: MessageExt) -> TransactionState:
        """The check-back: the decision made, or ROLLBACK for a half whose local transaction
        never ran (its send was not acknowledged)."""
        self.checks += 1
        msg_id, _ = parse_body(half.body)
        return self.decide(msg_id, ROLLBACK)

    def body(self) -> None:
        with TransactionProducer(self.servers, PRODUCER_GROUP, self._check,
                                 timeout_ms=CLIENT_TIMEOUT_MS, retries=0,
                                 heartbeat_ms=500) as producer:
            seq = 0
            next_at = time.monotonic()
            while not self.stop_event.is_set():
                seq += 1
                self._one(producer, f"{self.producer_id}-{seq}", seq % QUEUES)
                next_at = max(next_at + self.interval, time.monotonic() - 1.0)
                self.stop_event.wait(max(0.0, next_at - time.monotonic()))
            self._released.wait()

    def _one(self, producer: TransactionProducer, msg_id: str, queue: int) -> None:
        roll = self.rng.random()
        if roll < 5 / 6:  # decided at once: COMMIT 1/2, ROLLBACK 1/3
            final = first = COMMIT if roll < 1 / 2 else ROLLBACK
        else:  # left to the check-back, which is told either
            first, final = UNKNOWN, COMMIT if self.rng.random() < 0.5 else ROLLBACK
        body = make_body(msg_id, self.size, self.rng)
        self.history.add(self.producer_id, "tx", "invoke", msg_id=msg_id, queue=queue)

        def local(_half: Any) -> TransactionState:
            self.decide(msg_id, final)
            return first

        try:
            result = producer.send_in_transaction(self.topic, body, local, keys=msg_id,
                                                  queue_id=queue, broker_name=self.group)
        except Exception as e:  # noqa: BLE001 - classified: the half is not acknowledged
            kind, status, extra = classify(e)
            self.history.add(self.producer_id, "tx", kind, msg_id=msg_id, status=status,
                             phase="half", **extra)
            self.decide(msg_id, ROLLBACK)  # the local transaction never ran
            return
        self.history.add(self.producer_id, "tx", "ok", msg_id=msg_id, status="SEND_OK",
                         phase="half", phy=result.half.send.commit_log_offset)
        if first is UNKNOWN:
            return
        error = result.end_error
        if error is None:
            self.history.add(self.producer_id, "tx", "ok", msg_id=msg_id, status=final.value,
                             phase="end")
        else:
            conflict = error.code == ResponseCode.MESSAGE_ILLEGAL and "decided" in error.remark
            self.history.add(self.producer_id, "tx", "conflict" if conflict else "info",
                             msg_id=msg_id, status=error.code.name, phase="end",
                             remark=error.remark[:200])


def committed_ids(events: list[dict[str, Any]]) -> set[str]:
    """The transactions that must be consumed: half acknowledged, decided COMMIT."""
    acked = {e["msg_id"] for e in events
             if e["op"] == "tx" and e.get("phase") == "half" and e["type"] == "ok"}
    return {e["msg_id"] for e in events if e["op"] == "decide" and e["status"] == COMMIT.value
            and e["msg_id"] in acked}


def check_transactions(events: list[dict[str, Any]],
                       final: dict[Any, list[tuple[int, str, bool]]]) -> dict[str, Any]:
    """The transaction figures of a drill: ``final`` is the drain of the transactional topic
    from the master after the check-back had its time."""
    decided: dict[str, tuple[str, float]] = {}
    invoked: set[str] = set()
    first_read: dict[str, float] = {}
    both: set[str] = set()
    acked_halves = 0
    for e in events:
        if e["op"] == "decide":
            decided.setdefault(e["msg_id"], (e["status"], e["t"]))
        elif e["op"] == "tx":
            if e["type"] == "invoke":
                invoked.add(e["msg_id"])
            elif e.get("phase") == "half" and e["type"] == "ok":
                acked_halves += 1
            elif e.get("phase") == "end" and e["type"] == "conflict":
                both.add(e["msg_id"])
        elif e["op"] == "get" and e["proc"] == TX_CONSUMER and e["type"] == "ok":
            first_read.setdefault(e["msg_id"], e["t"])
    in_final: Counter[str] = Counter(m for rows in final.values() for _, m, _ in rows)
    consumed = set(first_read) | set(in_final)
    both |= {m for m, n in in_final.items() if n > 1}
    rolled_back_consumed = sorted(m for m in consumed
                                  if decided.get(m, (ROLLBACK.value, 0.0))[0] == ROLLBACK.value)
    must = committed_ids(events)
    committed_lost = sorted(must - set(in_final))
    early = sorted(m for m, t in first_read.items() if m in decided and t < decided[m][1])
    return {
        "tx_attempted": len(invoked),
        "tx_acked_halves": acked_halves,
        "tx_committed": len(must),
        "tx_rolled_back": sum(1 for s, _ in decided.values() if s == ROLLBACK.value),
        "tx_consumed": len(consumed),
        "tx_rolled_back_consumed": len(rolled_back_consumed),
        "tx_committed_lost": len(committed_lost),
        "tx_consumed_before_commit": len(early),
        "tx_both": len(both),
        "tx_problem_ids": (rolled_back_consumed + committed_lost + early + sorted(both))[:20],
    }


def tx_problems(figures: dict[str, Any]) -> list[str]:
    return [f"{key}={figures[key]}" for key in TX_PROBLEM_KEYS if figures.get(key)]
