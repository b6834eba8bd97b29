"""The cluster view of one broker group: which broker is the master, each topic's queue count
(the lifecycle and retry loop every client shares: ``common/client/base.py``)."""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any

from common.client.accumulator import DEGRADED_CODES
from common.client.results import NoMasterError
from common.client.transport import Transport
from common.core.config import split_addresses
from common.core.errors import BrokerError, ResponseCode
from common.format.protocol import (
    RequestCode,
    Response,
)

DISCOVERY_TIMEOUT_MS = 2_000
ROUTE_TTL_MS = 30_000  # a topic's queue count is asked again after this (RocketMQ's 30 s)
MAX_BACKOFF_S = 1.0
NO_MASTER_PAUSE_S = 0.05  # between discoveries that found no master (each waits for answers)
MASTER_GRACE_S = 0.1  # after a master answered: how long a newer one may still answer
STRAGGLER_S = 0.3  # after the last answer: how long a silent broker is waited for
NO_MASTER_CACHE_S = 0.25  # "no master" is believed this long before asking again
SLAVES_FRESH_S = 5.0  # slaves found by a discovery serve reads this long without another
MAX_SERVERS = 64  # brokers learned from answers, beyond those given
MASTER_ROLES = ("SYNC_MASTER", "ASYNC_MASTER")
READ_PREFERENCES = ("master", "slave")
# Answers after which the cached master is no longer trusted.
REDISCOVER_CODES = frozenset(
    {ResponseCode.SERVICE_NOT_AVAILABLE, ResponseCode.STALE_EPOCH, ResponseCode.SYSTEM_ERROR}
)


def parse_servers(servers: str | Iterable[str]) -> list[str]:
    try:
        return split_addresses(servers)
    except ValueError as e:
        raise BrokerError(ResponseCode.BAD_REQUEST, str(e), False) from None


class Cluster:
    """Which broker of the group is the master, and the queue count of each topic.

    ``_lock`` guards the fields and is never held while waiting for anything: ``forget`` and
    ``recheck`` run on the I/O thread too (a failed batch, a degraded answer), and a discovery
    that held it while waiting for that thread to answer its STATUS calls would deadlock it.
    Discoveries take turns on ``_discovering``, which the I/O thread never takes."""

    def __init__(self, transport: Transport, servers: list[str], timeout_ms: int,
                 route_ttl_ms: int = ROUTE_TTL_MS, group: str | None = None):
        """``group``: the broker group (``brokerName``) this discovery is for; an answer from
        a broker of another group is ignored (a client's seeds may span groups, and are asked
        too: the addresses a route names may not be reachable from here, e.g. container
        names, while the seed the user gave is)."""
        self.transport = transport
        self.servers = servers
        self.group = group
        self.timeout_ms = timeout_ms
        self.route_ttl_s = route_ttl_ms / 1000.0
        self._lock = threading.Lock()
        self._discovering = threading.Lock()
        self._generation = 0  # bumped by every forget: a discovery begun before is not cached
        self._master: str | None = None
        self._routes: dict[str, tuple[int, float]] = {}  # topic -> (queue count, asked at)
        self._rechecked: dict[str, float] = {}
        self._learned: list[str] = []  # brokers an answer named (a slave's master, members)
        self._slaves: list[str] = []  # what the last discovery found answering as slaves
        self._slaves_at = float("-inf")
        self._no_master_at = float("-inf")
        self._next_slave = 0
        transport.on_degraded = self.recheck

    def status(self, address: str, timeout_ms: int | None = None) -> dict[str, Any]:
        resp = self.request(address, RequestCode.STATUS, timeout_ms=timeout_ms)
        return dict(resp.fields)

    def request(
        self,
        address: str,
        code: RequestCode,
        fields: dict[str, Any] | None = None,
        bodies: Sequence[bytes] = (),
        timeout_ms: int | None = None,
    ) -> Response:
        timeout = timeout_ms or self.timeout_ms
        resp = self.transport.call_sync(address, code, fields, bodies, timeout)
        if resp.code in DEGRADED_CODES:
            self.recheck(address)
        return resp

    def recheck(self, address: str) -> None:
        """The master answered as if cut off from its slaves: it may have been replaced by a
        newer term (a resumed zombie master answers exactly so). Re-discover on the next call,
        at most once a second per address (a SYNC master whose slave is down answers this to
        every put)."""
        now = time.monotonic()
        with self._lock:
            if self._master != address or now - self._rechecked.get(address, 0.0) < 1.0:
                return
            self._rechecked[address] = now
            self._master = None
            self._generation += 1

    def master(self) -> str:
        master = self._master  # the common case needs no lock: a str is read whole
        if master is not None:
            return master
        with self._discovering:
            with self._lock:
                if self._master is not None:
                    return self._master
                believed = time.monotonic() - self._no_master_at < NO_MASTER_CACHE_S
                generation = self._generation
            if believed:
                raise NoMasterError(self.known_servers())
            found = self._discover()
            with self._lock:
                if self._generation == generation:
                    self._master = found
            return found

    def reader(self, preference: str | None) -> str:
        """Where a read goes. ``None``/"master": the master, or while no master answers a
        slave of the group (RocketMQ 4.x consumers read from a slave then, and return to the
        master once one answers). "slave": a slave (in turn), the master when none answers.
        Anything else is an address: that broker."""
        if preference not in (None, *READ_PREFERENCES):
            return str(preference)
        if preference == "slave":
            slave = self._a_slave()
            if slave is None:
                try:
                    self.master()  # a discovery: it also finds the slaves
                except NoMasterError:
                    pass
                slave = self._a_slave()
            return slave if slave is not None else self.master()
        try:
            return self.master()
        except NoMasterError:
            slave = self._a_slave()
            if slave is None:
                raise
            return slave

    def slaves(self) -> list[str]:
        """The brokers the last discovery found answering as slaves (fresh ones only)."""
        with self._lock:
            if time.monotonic() - self._slaves_at > SLAVES_FRESH_S:
                return []
            return list(self._slaves)

    def cached_master(self) -> str | None:
        """The master found last, if still believed (never asks the network)."""
        return self._master

    def known_servers(self) -> list[str]:
        """The servers given, then those learned from answers."""
        with self._lock:
            return self.servers + [s for s in self._learned if s not in self.servers]

    def _a_slave(self) -> str | None:
        slaves = self.slaves()
        if not slaves:
            return None
        self._next_slave = (self._next_slave + 1) % len(slaves)
        return slaves[self._next_slave]

    def forget(self, address: str | None = None) -> None:
        with self._lock:
            self._generation += 1  # also drops what a discovery under way finds
            if address is None or self._master == address:
                self._master = None
                self._routes.clear()

    def _discover(self) -> str:
        """Ask every known broker for its status, at once, and pick the master of the newest
        epoch. Answers teach more brokers: a slave names its master (``masterAddress``, and in
        controller mode the controller's master and members), so a client given one broker of
        the group finds the rest. It returns without waiting out a silent broker: a master
        answering with the epoch a controller names is taken at once, another master after
        ``MASTER_GRACE_S``, and brokers still silent ``STRAGGLER_S`` after the last answer are
        taken for down (a SIGKILLed broker's requests would wait for the whole timeout)."""
        if self.transport.failure:  # nothing would answer: say why, now
            raise self.transport.dead_error()
        timeout = min(self.timeout_ms, DISCOVERY_TIMEOUT_MS)
        start = time.monotonic()
        deadline = start + timeout / 1000.0
        pending: dict[concurrent.futures.Future[Response], str] = {}
        asked: set[str] = set()

        def ask(address: str) -> None:
            if address not in asked and len(asked) < len(self.servers) + MAX_SERVERS:
                asked.add(address)
                pending[self.transport.call(address, RequestCode.STATUS, None, (),
                                            timeout)] = address

        for s in self.known_servers():
            ask(s)
        best: tuple[int, str] | None = None
        named_epoch = 0  # the epoch a controller names (slaves in controller mode say it)
        first_master = last_answer = None
        slaves: list[str] = []
        refused: BrokerError | None = None  # e.g. this client's key refused (NO_PERMISSION)
        while pending:
            now = time.monotonic()
            limit = deadline
            if first_master is not None:
                limit = min(limit, first_master + MASTER_GRACE_S)
            if last_answer is not None:
                limit = min(limit, last_answer + STRAGGLER_S)
            if now >= limit:
                break
            done, _ = concurrent.futures.wait(list(pending), timeout=limit - now,
                                              return_when=concurrent.futures.FIRST_COMPLETED)
            for fut in done:
                address = pending.pop(fut)
                try:
                    resp = fut.result()
                except BrokerError as e:
                    refused = refused or (None if e.retriable else e)
                    continue
                if resp.code == ResponseCode.NO_PERMISSION:
                    refused = refused or BrokerError(resp.code, resp.remark)
                    continue
                status = resp.fields
                if self.group is not None and status.get("brokerName", self.group) != self.group:
                    continue  # a broker of another group (a seed given for the whole cluster)
                last_answer = time.monotonic()
                role = status.get("role")
                epoch = _int(status.get("epoch"))
                if role in MASTER_ROLES and not _fenced(status):
                    candidate = (epoch, address)
                    best = candidate if best is None or candidate > best else best
                    first_master = first_master or last_answer
                elif role == "SLAVE":
                    slaves.append(address)
                for hint, hint_epoch in _hints(status):
                    named_epoch = max(named_epoch, hint_epoch)
                    self._learn(hint)
                    ask(hint)
            if best is not None and named_epoch and best[0] >= named_epoch:
                break  # the master the controller names has answered
        with self._lock:
            self._slaves, self._slaves_at = slaves, time.monotonic()
            if best is None:
                self._no_master_at = time.monotonic()
        if best is None:
            if refused is not None:  # waiting for a master would not help: say why now
                raise refused
            raise NoMasterError(self.known_servers())
        return best[1]

    def _learn(self, address: str) -> None:
        with self._lock:
            if (address not in self.servers and address not in self._learned
                    and len(self._learned) < MAX_SERVERS):
                self._learned.append(address)

    def queue_nums(self, topic: str, fresh: bool = False) -> int:
        """The topic's queue count, asked of the master again once ``route_ttl_s`` old (a topic
        that gains queues is used in full), or now with ``fresh``. A failed re-ask keeps the
        count known before (the master is being found again, or is busy), unless ``fresh``."""
        now = time.monotonic()
        with self._lock:
            known = self._routes.get(topic)
        if known is not None and not fresh and now - known[1] < self.route_ttl_s:
            return known[0]
        try:
            resp = self.request(self.master(), RequestCode.TOPIC_ROUTE, {"topic": topic})
            if resp.code not in (ResponseCode.SUCCESS, ResponseCode.TOPIC_NOT_EXIST):
                raise BrokerError(resp.code, resp.remark)
        except BrokerError:
            if known is None or fresh:
                raise
            return known[0]
        nums = int(resp.fields.get("queueNums", 0))
        if nums <= 0:
            raise BrokerError(ResponseCode.TOPIC_NOT_EXIST, resp.remark or f"no topic {topic}")
        with self._lock:
            self._routes[topic] = (nums, now)
        return nums


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _fenced(status: dict[str, Any]) -> bool:
    """A master the controller no longer backs (it lost its lease or its election)."""
    controller = status.get("controller")
    return isinstance(controller, dict) and bool(controller.get("enabled")) \
        and not (controller.get("isMaster") and controller.get("leaseFresh"))


def _hints(status: dict[str, Any]) -> list[tuple[str, int]]:
    """Brokers a status answer names, with the epoch it vouches for (0: none)."""
    out: list[tuple[str, int]] = []
    master = status.get("masterAddress")
    if isinstance(master, str) and master and status.get("role") == "SLAVE":
        out.append((master, 0))
    controller = status.get("controller")
    if isinstance(controller, dict) and controller.get("enabled"):
        named = controller.get("masterAddress")
        if isinstance(named, str) and named:
            out.append((named, _int(controller.get("masterEpoch"))))
        members = controller.get("members")
        if isinstance(members, dict):
            for record in members.values():
                address = record.get("address") if isinstance(record, dict) else None
                if isinstance(address, str) and address:
                    out.append((address, 0))
    return [(a, e) for a, e in out if _is_address(a)]


def _is_address(text: str) -> bool:
    host, sep, port = text.rpartition(":")
    return bool(sep and host and port.isdigit() and 0 < int(port) < 65536)
