"""The cluster view (which broker is the master, each topic's queue count) and the lifecycle
and retry loop every client shares."""

from __future__ import annotations

import concurrent.futures
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from common.client.results import ClientTimeoutError, NoMasterError
from common.client.transport import DEFAULT_TIMEOUT_MS, DEGRADED_CODES, Transport
from common.core.config import split_addresses
from common.core.errors import BrokerError, ResponseCode
from common.core.keys import ClientKeys, KeyFileError, client_keys
from common.format.protocol import (
    RequestCode,
    Response,
)

DISCOVERY_TIMEOUT_MS = 2_000
ROUTE_TTL_MS = 30_000  # a topic's queue count is asked again after this (RocketMQ's 30 s)
MAX_BACKOFF_S = 1.0
NO_MASTER_PAUSE_S = 0.05  # between discoveries that found no master (each waits for answers)
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
                 route_ttl_ms: int = ROUTE_TTL_MS):
        self.transport = transport
        self.servers = servers
        self.timeout_ms = timeout_ms
        self.route_ttl_s = route_ttl_ms / 1000.0
        self._lock = threading.Lock()
        self._discovering = threading.Lock()
        self._generation = 0  # bumped by every forget: a discovery begun before is not cached
        self._master: str | None = None
        self._routes: dict[str, tuple[int, float]] = {}  # topic -> (queue count, asked at)
        self._rechecked: dict[str, float] = {}
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
                generation = self._generation
            found = self._discover()
            with self._lock:
                if self._generation == generation:
                    self._master = found
            return found

    def forget(self, address: str | None = None) -> None:
        with self._lock:
            self._generation += 1  # also drops what a discovery under way finds
            if address is None or self._master == address:
                self._master = None
                self._routes.clear()

    def _discover(self) -> str:
        timeout = min(self.timeout_ms, DISCOVERY_TIMEOUT_MS)
        futures = {
            s: self.transport.call(s, RequestCode.STATUS, None, (), timeout) for s in self.servers
        }
        best: tuple[int, str] | None = None
        refused: BrokerError | None = None  # e.g. this client's key refused (NO_PERMISSION)
        for address, fut in futures.items():
            try:
                resp = fut.result(timeout / 1000.0 + 5.0)
            except BrokerError as e:
                refused = refused or (None if e.retriable else e)
                continue
            except concurrent.futures.TimeoutError:
                continue
            if resp.code == ResponseCode.NO_PERMISSION:
                refused = refused or BrokerError(resp.code, resp.remark)
                continue
            status = resp.fields
            if status.get("role") in ("SYNC_MASTER", "ASYNC_MASTER"):
                candidate = (int(status.get("epoch", 0)), address)
                best = candidate if best is None or candidate > best else best
        if best is None:
            if refused is not None:  # waiting for a master would not help: say why now
                raise refused
            raise NoMasterError(self.servers)
        return best[1]

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


class ClientBase:
    """Shared lifecycle: one Transport and one cluster view per client object.

    CURVE (``docs/security.md``): ``key`` is this client's ``.key_secret`` file and
    ``server_key`` the brokers' public ``.key`` (or a mapping ``host:port`` -> ``.key`` when each
    broker has its own key pair); ``curve`` gives the same already loaded. A bad key file raises
    BrokerError BAD_REQUEST naming it, before anything connects."""

    def __init__(
        self,
        servers: str | Iterable[str],
        timeout_ms: int = DEFAULT_TIMEOUT_MS,
        retries: int = 2,
        route_ttl_ms: int = ROUTE_TTL_MS,
        key: str | os.PathLike[str] | None = None,
        server_key: str | os.PathLike[str] | Mapping[str, Any] | None = None,
        curve: ClientKeys | None = None,
        **transport_args: Any,
    ):
        self.servers = parse_servers(servers)
        self.timeout_ms = timeout_ms
        self.retries = retries
        if curve is None:
            try:
                curve = client_keys(key, server_key)
            except KeyFileError as e:
                raise BrokerError(ResponseCode.BAD_REQUEST, str(e), False) from None
        elif key is not None or server_key is not None:
            raise ValueError("give key and server_key, or curve, not both")
        self._transport = Transport(name=type(self).__name__, curve=curve, **transport_args)
        self._cluster = Cluster(self._transport, self.servers, timeout_ms, route_ttl_ms)
        self._closed = threading.Event()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._closed.set()
        self._transport.close()

    def queue_nums(self, topic: str, fresh: bool = False) -> int:
        """How many queues ``topic`` has: cached for ``route_ttl_ms`` (30 s: RocketMQ clients
        re-read routes every 30 s, Kafka's metadata every 5 min), asked now with ``fresh``."""
        return self._cluster.queue_nums(topic, fresh)

    def _with_retries(self, attempt: Callable[[str], Any], fixed: str | None = None) -> Any:
        """Run ``attempt(master_address)``; retry retriable errors, re-discovering the master.

        With ``fixed`` (a consumer reading from a chosen broker) no master is needed at all.
        """
        give_up = time.monotonic() + self.timeout_ms / 1000.0  # for finding a master
        n = 0
        while True:
            address = None
            try:
                address = fixed or self._cluster.master()
                return attempt(address)
            except NoMasterError:
                # each discovery waits up to DISCOVERY_TIMEOUT_MS for an answer: no spin here
                if self._closed.wait(NO_MASTER_PAUSE_S) or time.monotonic() >= give_up:
                    raise
            except BrokerError as e:
                if isinstance(e, ClientTimeoutError) or e.code in REDISCOVER_CODES:
                    self._cluster.forget(address)
                if not e.retriable or n == self.retries or self._closed.is_set():
                    raise
                self._closed.wait(min(MAX_BACKOFF_S, 0.05 * 2**n))
                n += 1
