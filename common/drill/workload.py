"""The drill workload (docs/drills.md): producers, a consumer, bursts, the final drain, and the
deadline waits every drill step uses.

Every put is one history operation: producers run without client retries, so each outcome is
exactly what the broker (or the network) answered to that one attempt.
"""

from __future__ import annotations

import abc
import random
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from common.client import Consumer, Producer
from common.core.errors import BrokerError, PullStatus
from common.drill.history import (
    CLIENT_TIMEOUT_MS,
    QUEUES,
    TOPIC,
    History,
    classify,
    handler_of,
    make_body,
    parse_body,
)

T = TypeVar("T")


def wait_for(
    condition: Callable[[], T | None | bool], timeout_s: float, what: str, step_s: float = 0.02
) -> T:
    """Re-check ``condition`` until it is truthy; AssertionError naming ``what`` at the deadline.
    (The step is the polling period of the caller, not a timing assumption.)"""
    deadline = time.monotonic() + timeout_s
    event = threading.Event()
    last: Any = None
    while True:
        last = condition()
        if last:
            return last  # type: ignore[return-value]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what} ({last!r})")
        event.wait(step_s)


class Worker(threading.Thread, abc.ABC):
    """A load thread of a drill; its ``body`` (each kind's own) runs until ``stop``."""

    def __init__(self, name: str):
        super().__init__(name=name, daemon=True)
        self.stop_event = threading.Event()
        self.error: BaseException | None = None

    def stop(self) -> None:
        self.stop_event.set()

    def run(self) -> None:
        try:
            self.body()
        except BaseException as e:  # noqa: BLE001 - reported by the drill's finish
            self.error = e

    @abc.abstractmethod
    def body(self) -> None:
        """The load itself: runs until ``stop_event`` is set; an exception is kept in
        ``error``."""


class ProducerWorker(Worker):
    """Sends ``rate`` puts per second through the client (master discovery, no retries: every
    put is one history operation)."""

    def __init__(
        self,
        history: History,
        servers: list[str],
        producer_id: str,
        rate: float,
        size: int = 512,
        seed: int = 0,
        fixed_queue: int | None = None,
        topic: str = TOPIC,
        group: str | None = None,
        keyless: bool = False,
        groups_of: dict[str, str] | None = None,
    ):
        """``group``: every put goes to that broker group (queues in turn); ``keyless``: the
        client picks the queue over every group (no ``queue_id``); ``groups_of`` maps broker
        addresses to their group, so a failed keyless put names the group it went to."""
        super().__init__(producer_id)
        self.topic = topic
        self.history = history
        self.servers = servers
        self.producer_id = producer_id
        self.interval = 1.0 / rate
        self.size = size
        self.rng = random.Random(f"{seed}-{producer_id}")
        self.fixed_queue = fixed_queue
        self.group = group
        self.keyless = keyless
        self.groups_of = groups_of or {}
        self.sent = 0

    def body(self) -> None:
        with Producer(self.servers, timeout_ms=CLIENT_TIMEOUT_MS, retries=0) as producer:
            seq = 0
            next_at = time.monotonic()
            while not self.stop_event.is_set():
                seq += 1
                msg_id = f"{self.producer_id}-{seq}"
                queue = None if self.keyless else (
                    self.fixed_queue if self.fixed_queue is not None else seq % QUEUES)
                body = make_body(msg_id, self.size, self.rng)
                where = {"group": self.group} if self.group else {}
                self.history.add(self.producer_id, "put", "invoke", msg_id=msg_id, queue=queue,
                                 **where)
                try:
                    outcome: Any = producer.send(self.topic, body, keys=msg_id,
                                                 queue_id=queue, broker_name=self.group)
                except Exception as e:  # noqa: BLE001 - classified
                    outcome = e
                kind, status, extra = classify(outcome)
                extra.setdefault("queue", queue)
                if self.group:
                    extra.setdefault("group", self.group)
                elif isinstance(outcome, BaseException):
                    extra.setdefault("group", self._group_of_error(outcome))
                self.history.add(
                    self.producer_id, "put", kind, msg_id=msg_id, status=status, **extra
                )
                self.sent += 1
                next_at = max(next_at + self.interval, time.monotonic() - 1.0)
                self.stop_event.wait(max(0.0, next_at - time.monotonic()))

    def _group_of_error(self, e: BaseException) -> str:
        """The group a failed keyless put went to ("?" when the error does not say)."""
        if isinstance(e, BrokerError) and e.broker_name:  # a send names its group
            return e.broker_name
        address = getattr(e, "address", None)
        return self.groups_of.get(address, "?") if isinstance(address, str) else "?"


class ConsumerWorker(Worker):
    """Reads every queue from the current master throughout (offsets kept per queue); with
    ``groups``, every queue of every broker group."""

    def __init__(self, history: History, servers: list[str], name: str = "consumer",
                 topic: str = TOPIC, groups: list[str] | None = None):
        super().__init__(name)
        self.topic = topic
        self.history = history
        self.servers = servers
        self.groups = groups
        self.corrupt = 0

    def body(self) -> None:
        groups: list[str | None] = list(self.groups) if self.groups else [None]
        queues = [(g, q) for g in groups for q in range(QUEUES)]
        offsets = dict.fromkeys(queues, 0)
        with Consumer(self.servers, group="drill", timeout_ms=CLIENT_TIMEOUT_MS, retries=0) as c:
            while not self.stop_event.is_set():
                found = False
                for g, q in queues:
                    where = {"group": g} if g else {}
                    try:
                        pr = c.pull(self.topic, q, offsets[(g, q)], max_nums=64, broker_name=g)
                    except Exception as e:  # noqa: BLE001 - recorded; reads go on
                        self.history.add(self.name, "get", "fail", queue=q, status=repr(e)[:120],
                                         **where)
                        continue
                    if pr.status == PullStatus.FOUND:
                        found = True
                        for m in pr.messages:
                            msg_id, ok = parse_body(m.body)
                            if not ok:
                                self.corrupt += 1
                            self.history.add(
                                self.name,
                                "get",
                                "ok",
                                msg_id=msg_id,
                                queue=q,
                                offset=m.queue_offset,
                                status="FOUND" if ok else "CORRUPT",
                                **where,
                            )
                    if pr.status in (PullStatus.FOUND, PullStatus.OFFSET_ILLEGAL):
                        offsets[(g, q)] = pr.next_begin_offset
                if not found:
                    self.stop_event.wait(0.05)  # polling period at the end of the queues


def burst(
    history: History,
    servers: list[str],
    proc: str,
    count: int,
    size: int,
    rng: random.Random,
    batch: int = 32,
) -> list[dict[str, Any]]:
    """``count`` puts as SEND_BATCH requests of ``batch`` (one queue each, queues in turn); every
    message is its own history operation. Returns the completion events."""
    done: list[dict[str, Any]] = []
    with Producer(servers, timeout_ms=CLIENT_TIMEOUT_MS, retries=0) as producer:
        seq = 0
        while seq < count:
            queue = (seq // batch) % QUEUES
            ids = [f"{proc}-{seq + i + 1}" for i in range(min(batch, count - seq))]
            seq += len(ids)
            for m in ids:
                history.add(proc, "put", "invoke", msg_id=m, queue=queue)
            try:
                outcomes: list[Any] = producer.send_batch(
                    TOPIC, [make_body(m, size, rng) for m in ids], queue_id=queue
                )
            except Exception as e:  # noqa: BLE001 - classified
                outcomes = [e] * len(ids)
            for m, outcome in zip(ids, outcomes, strict=True):
                kind, status, extra = classify(outcome)
                if not isinstance(outcome, BaseException):
                    extra["handler"] = handler_of(outcome.msg_id)
                extra.setdefault("queue", queue)
                done.append(history.add(proc, "put", kind, msg_id=m, status=status, **extra))
    return done


def drain(address: str, servers: Iterable[str],
          topic: str = TOPIC) -> dict[Any, list[tuple[int, str, bool]]]:
    """Every message of every queue read from ``address``: queue -> [(offset, msg_id, crc ok)]."""
    out: dict[Any, list[tuple[int, str, bool]]] = {}
    with Consumer(list(servers), group="drain", timeout_ms=10_000, read_from=address) as c:
        for q in range(QUEUES):
            rows: list[tuple[int, str, bool]] = []
            offset = 0
            while True:
                pr = c.pull(topic, q, offset, max_nums=256)
                if pr.status != PullStatus.FOUND:
                    break
                for m in pr.messages:
                    msg_id, ok = parse_body(m.body)
                    rows.append((m.queue_offset, msg_id, ok))
                offset = pr.next_begin_offset
            out[q] = rows
    return out


def ok_puts(history: History) -> int:
    """How many puts have had SEND_OK so far."""
    return sum(1 for e in history.events if e["op"] == "put" and e["type"] == "ok")


def wait_more_puts(history: History, n: int, timeout_s: float = 20.0) -> None:
    """Until ``n`` more puts have SEND_OK (the workload is really running)."""
    start = ok_puts(history)
    wait_for(lambda: ok_puts(history) >= start + n, timeout_s, f"{n} more SEND_OK puts",
             step_s=0.05)
