"""The lifecycle and retry loop every client shares: one Transport, one group's master
discovery (``common/client/cluster.py``) and the routes over every group
(``common/client/routes.py``, which builds on the discovery)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from common.client.cluster import (
    MAX_BACKOFF_S,
    NO_MASTER_PAUSE_S,
    REDISCOVER_CODES,
    ROUTE_TTL_MS,
    Cluster,
    parse_servers,
)
from common.client.results import ClientTimeoutError, NoMasterError
from common.client.routes import Routes
from common.client.transport import DEFAULT_TIMEOUT_MS, Transport
from common.core.errors import BrokerError, ResponseCode
from common.core.keys import ClientKeys, KeyFileError, client_keys


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
        self._routes = Routes(self._transport, self._cluster, timeout_ms, route_ttl_ms)

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

    def _with_retries(self, attempt: Callable[[str], Any], fixed: str | None = None,
                      read_from: str | None = None, read: bool = False,
                      wait_for_master: bool = True, cluster: Cluster | None = None) -> Any:
        """Run ``attempt(master_address)``; retry retriable errors, re-discovering the master.

        With ``fixed`` (a consumer reading from a chosen broker) no master is needed at all;
        with ``read`` the broker is the one ``read_from`` prefers (``Cluster.reader``: the
        master, or a slave while none answers). ``wait_for_master`` False: NoMasterError at
        once when no master answers, instead of waiting for one up to ``timeout_ms``.
        ``cluster``: the broker group's master discovery (one group of several); default, the
        one made from ``servers``.
        """
        group = cluster or self._cluster
        give_up = time.monotonic() + self.timeout_ms / 1000.0  # for finding a master
        n = 0
        while True:
            address = None
            try:
                if fixed:
                    address = fixed
                elif read:
                    address = group.reader(read_from)
                else:
                    address = group.master()
                return attempt(address)
            except NoMasterError:
                # each discovery waits up to DISCOVERY_TIMEOUT_MS for an answer: no spin here
                if (not wait_for_master or self._closed.wait(NO_MASTER_PAUSE_S)
                        or time.monotonic() >= give_up):
                    raise
            except BrokerError as e:
                if isinstance(e, ClientTimeoutError) or e.code in REDISCOVER_CODES:
                    group.forget(address)
                if not e.retriable or n == self.retries or self._closed.is_set():
                    raise
                self._closed.wait(min(MAX_BACKOFF_S, 0.05 * 2**n))
                n += 1
