"""PushConsumer: a listener called for each message, on a thread pool, over POP (RocketMQ 5's
PushConsumer; ``simple_consumer.py`` does the receiving).

One thread receives (long polling) while fewer than ``threads`` x 2 messages are in hand and
hands each to the pool; the listener's True acks the message, False or an exception leaves it
to come back after ``invisible_ms`` (counted), and after ``max_reconsume_times`` more it goes to
the group's DLQ. Every receive names its invisible time (the official Python client's
PushConsumer did not: rocketmq-clients#1198). ``fifo``: the broker hands out one message of a
message group at a time, so a group's messages reach the listener in order, one after another.
``shutdown`` stops receiving, lets the listener finish what it holds, and acks what succeeded.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any, Self

from common.client.simple_consumer import DEFAULT_INVISIBLE_MS, Received, SimpleConsumer
from common.core.errors import BrokerError
from common.core.message import MessageExt

log = logging.getLogger("replog.client")

Listener = Callable[[MessageExt], bool]
RECEIVE_WAIT_MS = 5_000


class PushConsumer:
    def __init__(self, servers: str | Iterable[str], group: str, topic: str,
                 listener: Listener, *, threads: int = 4,
                 invisible_ms: int = DEFAULT_INVISIBLE_MS, tags: str | None = None,
                 sql: str | None = None, fifo: bool = False,
                 max_reconsume_times: int | None = None,
                 **options: Any):
        if threads < 1:
            raise ValueError("threads >= 1")
        self.consumer = SimpleConsumer(servers, group, **options)
        self.topic = topic
        self.listener = listener
        self.invisible_ms = invisible_ms
        self.receive_options: dict[str, Any] = {"tags": tags, "sql": sql, "fifo": fifo,
                                                "max_reconsume_times": max_reconsume_times}
        self._pool = concurrent.futures.ThreadPoolExecutor(threads, f"replog-push-{group}")
        self._room = threading.Semaphore(threads * 2)  # messages in hand at most
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"replog-push-recv-{group}",
                                        daemon=True)
        self.consumed = self.failed = 0
        self._counts_lock = threading.Lock()
        self._thread.start()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self._room.acquire(timeout=0.2):  # the pool holds enough already
                continue
            free = 1
            while free < 32 and self._room.acquire(blocking=False):
                free += 1
            try:
                got = self.consumer.receive(self.topic, free, self.invisible_ms,
                                            wait_ms=RECEIVE_WAIT_MS, **self.receive_options)
            except BrokerError as e:
                log.warning("event=push_receive_failed error=%s", e)
                got = []
                self._stop.wait(1.0)
            for _ in range(free - len(got)):
                self._room.release()
            for r in got:
                self._pool.submit(self._consume, r)

    def _consume(self, r: Received) -> None:
        try:
            try:
                ok = bool(self.listener(r.message))
            except Exception:
                log.exception("event=push_listener_failed topic=%s", self.topic)
                ok = False
            if ok:
                try:
                    self.consumer.ack(r)
                except BrokerError as e:  # it comes back, and is consumed again
                    log.warning("event=push_ack_failed error=%s", e)
                    ok = False
            with self._counts_lock:
                if ok:
                    self.consumed += 1
                else:
                    self.failed += 1
        finally:
            self._room.release()

    def shutdown(self, timeout_s: float = 30.0) -> None:
        self._stop.set()
        self._thread.join(timeout_s)
        self._pool.shutdown(wait=True)
        self.consumer.close()
