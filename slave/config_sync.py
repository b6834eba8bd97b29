"""A slave copies its master's tables (RocketMQ's SlaveSynchronize).

Every ``slaveConfigSyncIntervalMs`` (default 1000; 0: never) the thread "replog-config-sync"
asks the master, at the client address it announced in its HELLO_REPLY, for
GET_ALL_TOPIC_CONFIG, GET_ALL_CONSUMER_OFFSET, GET_ALL_DELAY_OFFSET and
GET_ALL_SUBSCRIPTIONGROUP_CONFIG, and hands each document to ``apply(code, raw, source)``
(``Broker.apply_master_document``): the slave's topics.json, consumerOffset.json,
delayOffset.json and subscriptionGroup.json become its master's. A promoted slave
therefore knows its group's topics, where each consumer group stands, and how far each delay
level was delivered, as of at most one interval before its master stopped. Consumers resume
there: at least once (what they committed in that last interval comes again), never from the
start of every queue.

A master that does not answer, or answers an error, changes nothing (the failure is counted and
logged when the state changes, not every round); a malformed document is refused whole by the
table (ValueError), logged, and the other documents still apply.

``stop`` returns at once even while a request waits on a dead master (the moment a slave is
promoted): the thread waits on the request's future *or* the stop event, and no document is
applied after ``stop`` has returned.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from common.client import Transport
from common.core.errors import BrokerError
from common.core.keys import ClientKeys
from common.core.logs import log_event
from common.format.protocol import RequestCode

log = logging.getLogger("replog.config_sync")

DOCUMENTS = (
    RequestCode.GET_ALL_TOPIC_CONFIG,
    RequestCode.GET_ALL_CONSUMER_OFFSET,
    RequestCode.GET_ALL_DELAY_OFFSET,
    RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG,
)
MAX_REQUEST_TIMEOUT_MS = 3000
JOIN_TIMEOUT_S = 5.0

Apply = Callable[[RequestCode, bytes, str], bool]


@dataclasses.dataclass
class SyncStats:
    rounds: int = 0  # rounds in which every document was taken
    failures: int = 0  # rounds that failed (no answer, an error, a malformed document)
    changes: int = 0  # documents that changed a table
    last_ok_ms: int = 0  # wall clock of the last complete round (0: never)
    last_error: str = ""


class ConfigSync:
    def __init__(self, interval_ms: int, master_address: Callable[[], str], apply: Apply,
                 transport_factory: Callable[[], Any] | None = None,
                 curve: ClientKeys | None = None):
        """``curve``: the broker's keys (security on): the tables are read as its account,
        which needs admin or replica (``common.format.acl``)."""
        self.interval_s = interval_ms / 1000.0
        self.timeout_ms = max(100, min(MAX_REQUEST_TIMEOUT_MS, interval_ms))
        self._master_address = master_address
        self._apply = apply
        self._transport_factory = transport_factory or (
            lambda: Transport(name="replog-config-sync-client", spin_us=0, curve=curve))
        self._stop = threading.Event()
        self._wake = threading.Event()  # a request finished, or stop
        self._apply_lock = threading.Lock()  # stop() waits out an apply under way
        self._thread: threading.Thread | None = None
        self._failing = False
        self.stats = SyncStats()

    def start(self) -> None:
        if self.interval_s <= 0:
            return
        self._thread = threading.Thread(target=self._run, name="replog-config-sync", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        with self._apply_lock:
            pass  # from here on the thread applies nothing
        if self._thread is not None:
            self._thread.join(JOIN_TIMEOUT_S)

    def status(self) -> dict[str, Any]:
        st = self.stats
        ago = int(time.time() * 1000) - st.last_ok_ms if st.last_ok_ms else None
        return {"rounds": st.rounds, "failures": st.failures, "changes": st.changes,
                "lastSyncAgoMs": ago, "lastError": st.last_error}

    # ---- the thread ------------------------------------------------------------------------
    def _run(self) -> None:
        transport = self._transport_factory()
        try:
            while not self._stop.is_set():
                self.sync_once(transport)
                self._stop.wait(self.interval_s)
        finally:
            transport.close()

    def sync_once(self, transport: Any) -> bool:
        """One round: every document fetched and applied; False (counted, logged) otherwise."""
        address = self._master_address()
        if not address:
            return False  # the master has not answered the HA handshake yet: not a failure
        for code in DOCUMENTS:
            try:
                raw = self._fetch(transport, address, code)
            except BrokerError as e:
                return self._failed(f"{code.name} from {address}: {e.code.name} {e.remark}")
            if raw is None:
                return False  # stopped
            with self._apply_lock:
                if self._stop.is_set():
                    return False
                try:
                    self.stats.changes += self._apply(code, raw, f"{code.name} from {address}")
                except ValueError as e:
                    return self._failed(str(e))
        self.stats.rounds += 1
        self.stats.last_ok_ms = int(time.time() * 1000)
        if self._failing:
            self._failing = False
            log_event(log, "config_sync_resumed", master=address)
        return True

    def _fetch(self, transport: Any, address: str, code: RequestCode) -> bytes | None:
        fut = transport.call(address, code, {}, timeout_ms=self.timeout_ms)
        fut.add_done_callback(lambda _f: self._wake.set())
        while not fut.done():
            self._wake.wait()
            self._wake.clear()
            if self._stop.is_set():
                return None
        resp = fut.result()  # a BrokerError (timeout, closed) raises here
        if not resp.ok:
            raise BrokerError(resp.code, resp.remark)
        if len(resp.bodies) != 1:
            raise BrokerError(resp.code, f"{len(resp.bodies)} body frames, expected 1")
        return bytes(resp.bodies[0])

    def _failed(self, why: str) -> bool:
        self.stats.failures += 1
        self.stats.last_error = why
        if not self._failing:
            self._failing = True
            log_event(log, "config_sync_failing", logging.WARNING, reason=why)
        return False
