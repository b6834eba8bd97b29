"""The routes a client keeps over a cluster of broker groups, and one master discovery per group.

A client asks any broker it knows for CLUSTER_INFO (request code 106): in controller mode every
broker answers for the whole cluster from ZooKeeper (as any Kafka broker answers metadata), and
without a controller for its own group. The answer becomes a ``RouteTable``
(``common/client/routing.py``): each group's master and slaves, and each topic's queues per
group with their ``perm``. The table is kept ``route_ttl_ms`` (30 s, RocketMQ's route poll),
asked again at once after a routing error (``invalidate``: a topic a group does not hold, a
group the table does not name), and within ``DEGRADED_TTL_S`` while a group has no master, so
a group that gets one back is used again within a second.

A table of one group is a single-group deployment: the client works as it always has, through
the ``Cluster`` made from the servers it was given (``seed``), hints and all. With several
groups each group gets a ``Cluster`` of its own, seeded with the addresses the table names for
it, so master discovery, read preferences, and kept commits stay per group: a group that fails
over moves only its own queues' traffic.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Sequence

from common.client.cluster import DISCOVERY_TIMEOUT_MS, Cluster
from common.client.results import NoMasterError
from common.client.routing import ISOLATION_MS, MessageQueue, QueueSelector, RouteError, RouteTable
from common.client.transport import Transport
from common.core.errors import BrokerError, ResponseCode
from common.format.protocol import RequestCode, Response

ROUTE_RETRY_S = 0.5  # a forced refresh (a routing error, a failed ask) waits this long after one
DEGRADED_TTL_S = 1.0  # the table's lifetime while a group in it has no master
MAX_ROUTE_ASKS = 8  # brokers asked for CLUSTER_INFO at once
NO_TABLE_PAUSE_S = 0.05  # between asks while no broker gives a table (each waits for answers)


def parse_cluster_info(resp: Response) -> dict[str, object]:
    """CLUSTER_INFO's answer: one JSON document in the body frame (BrokerError if not)."""
    import json

    try:
        doc = json.loads(bytes(resp.bodies[0]).decode("utf-8"))
    except (IndexError, UnicodeDecodeError, ValueError) as e:
        raise BrokerError(ResponseCode.SYSTEM_ERROR, f"malformed cluster info: {e}",
                          False) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("groups"), list):
        raise BrokerError(ResponseCode.SYSTEM_ERROR, "malformed cluster info: no groups", False)
    return doc


class Routes:
    """The route table of one client, refreshed on a TTL and on routing errors, and the
    ``Cluster`` (master discovery) of each broker group. Thread-safe: ``_lock`` guards the
    fields and is never held while waiting; refreshes take turns on ``_refreshing``."""

    def __init__(self, transport: Transport, seed: Cluster, timeout_ms: int, route_ttl_ms: int,
                 isolation_ms: int = ISOLATION_MS):
        self.transport = transport
        self.seed = seed
        self.timeout_ms = timeout_ms
        self.ttl_s = route_ttl_ms / 1000.0
        self.selector = QueueSelector(isolation_ms)
        self._lock = threading.Lock()
        self._refreshing = threading.Lock()
        self._table: RouteTable | None = None
        self._expires = float("-inf")  # monotonic
        self._last_ask = float("-inf")
        self._stale = False
        self._clusters: dict[str, Cluster] = {}
        self._misses: dict[str, float] = {}  # name -> when a recheck for it last asked
        self.refreshes = 0  # tables taken (tests, bench)

    # ---- the table ------------------------------------------------------------------------
    def table(self) -> RouteTable:
        """The route table, asked again once it expired or was invalidated (a failed ask keeps
        the table known before; with none known it raises NoMasterError, retriable)."""
        table = self._table
        if table is not None and not self._stale and time.monotonic() < self._expires:
            return table
        return self._refresh(table)

    def wait_table(self, closed: threading.Event, timeout_ms: int) -> RouteTable:
        """The table, waiting up to ``timeout_ms`` while no broker can give one (the cluster
        is starting: a broker names its groups once its controller has read ZooKeeper), as a
        call waits for a master."""
        give_up = time.monotonic() + timeout_ms / 1000.0
        while True:
            try:
                return self.table()
            except NoMasterError:
                if closed.wait(NO_TABLE_PAUSE_S) or time.monotonic() >= give_up:
                    raise

    def refresh(self) -> RouteTable:
        """Ask now (a routing error was met, or a test wants the newest table)."""
        with self._lock:
            self._stale = True
            self._last_ask = float("-inf")
        return self._refresh(self._table, wait=True)

    def recheck(self, missed: str) -> RouteTable:
        """After a miss (a topic or group the table does not name, ``missed``): ask again now,
        unless the same name missed within ``ROUTE_RETRY_S`` (then the table stands: a name
        that does not exist costs one ask per ``ROUTE_RETRY_S``, not one per call)."""
        now = time.monotonic()
        with self._lock:
            if now - self._misses.get(missed, float("-inf")) < ROUTE_RETRY_S:
                table = self._table
                if table is not None:
                    return table
            if len(self._misses) > 1024:
                self._misses.clear()
            self._misses[missed] = now
            self._stale = True
            self._last_ask = float("-inf")
        return self._refresh(self._table, wait=True)

    def invalidate(self) -> None:
        """A routing error: ask for the table again at the next use (at most every
        ``ROUTE_RETRY_S``)."""
        self._stale = True

    def multi(self, table: RouteTable) -> bool:
        return len(table.groups) > 1

    def _refresh(self, known: RouteTable | None, wait: bool = False) -> RouteTable:
        if known is not None and not wait and not self._refreshing.acquire(blocking=False):
            return known  # another thread is asking: go on with the table known until then
        if known is None or wait:
            self._refreshing.acquire()
        try:
            now = time.monotonic()
            table = self._table
            if table is not None and table is not known and not self._stale \
                    and now < self._expires:
                return table  # another thread asked meanwhile
            if table is not None and now - self._last_ask < ROUTE_RETRY_S:
                return table  # asked a moment ago: do not hammer the brokers
            self._last_ask = now
            try:
                fresh = self._ask(table)
            except BrokerError:
                if table is None:
                    raise
                self._stale = False
                self._expires = now + min(self.ttl_s, DEGRADED_TTL_S)
                return table
            self._take(fresh, now)
            return fresh
        finally:
            self._refreshing.release()

    def _take(self, table: RouteTable, now: float) -> None:
        degraded = any(not g.master for g in table.groups.values())
        with self._lock:
            self._table = table
            self._stale = False
            self._expires = now + (min(self.ttl_s, DEGRADED_TTL_S) if degraded else self.ttl_s)
            self.refreshes += 1
            if len(table.groups) > 1:
                for name, group in table.groups.items():
                    cluster = self._clusters.get(name)
                    if cluster is not None and group.addresses:
                        cluster.servers = self._servers_of(group.addresses)

    def _ask(self, known: RouteTable | None) -> RouteTable:
        """CLUSTER_INFO from the brokers this client knows, all at once; the first answer
        naming at least one group wins (a broker whose controller has not read ZooKeeper yet
        names none)."""
        if self.transport.failure:
            raise self.transport.dead_error()
        addresses = self._addresses(known)
        timeout = min(self.timeout_ms, DISCOVERY_TIMEOUT_MS)
        pending = {self.transport.call(a, RequestCode.CLUSTER_INFO, None, (), timeout): a
                   for a in addresses}
        deadline = time.monotonic() + timeout / 1000.0
        problem = ""
        refused: BrokerError | None = None  # e.g. this client's key refused (NO_PERMISSION)
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            done, _ = concurrent.futures.wait(list(pending), timeout=left,
                                              return_when=concurrent.futures.FIRST_COMPLETED)
            for fut in done:
                address = pending.pop(fut)
                try:
                    resp = fut.result()
                    if not resp.ok:
                        raise BrokerError(resp.code, resp.remark)
                    table = RouteTable.from_cluster_info(parse_cluster_info(resp))
                except BrokerError as e:
                    problem = f"{address}: {e}"
                    if not e.retriable or e.code == ResponseCode.NO_PERMISSION:
                        refused = refused or e
                    continue
                except RouteError as e:
                    problem = f"{address}: {e}"
                    continue
                if table.groups:
                    return table
                problem = f"{address} knows no broker group yet"
        if refused is not None:  # waiting would not help: say why now
            raise refused
        # nothing to route by yet: waited for like a master (NoMasterError, retriable)
        raise NoMasterError(addresses, detail=f"no route table; {problem or 'no answer'}")

    def _addresses(self, known: RouteTable | None) -> list[str]:
        out = list(self.seed.known_servers())
        if known is not None:
            for group in known.groups.values():
                out += group.addresses
        seen: list[str] = []
        for a in out:
            if a not in seen:
                seen.append(a)
        return seen[:MAX_ROUTE_ASKS]

    # ---- groups ---------------------------------------------------------------------------
    def cluster(self, group: str, table: RouteTable) -> Cluster:
        """The master discovery of ``group`` (the seed's in a single-group deployment)."""
        if len(table.groups) <= 1:
            return self.seed
        cluster = self._clusters.get(group)
        if cluster is not None:
            return cluster
        route = table.groups.get(group)
        if route is None:
            raise unknown_group(group, table)
        with self._lock:
            cluster = self._clusters.get(group)
            if cluster is None:
                cluster = Cluster(self.transport, self._servers_of(route.addresses),
                                  self.timeout_ms, int(self.ttl_s * 1000), group=group)
                self._clusters[group] = cluster
            # every Cluster claims the transport's degraded-answer callback: one for all
            self.transport.on_degraded = self._recheck
        return cluster

    def _servers_of(self, route_addresses: Sequence[str]) -> list[str]:
        """What a group's discovery asks: the addresses its route names, then the servers this
        client was given (a route names the addresses brokers advertise, which may not be
        reachable from here: in the compose cluster they are container names, and the host
        reaches the brokers through the published ports it was given). The discovery keeps
        only answers from the group's own brokers."""
        out = list(route_addresses)
        out += [a for a in self.seed.servers if a not in out]
        return out

    def known_cluster(self, group: str) -> Cluster:
        """``group``'s discovery if one was made, else the seed's; never asks the network (the
        client's I/O thread calls it)."""
        return self._clusters.get(group) or self.seed

    def multi_known(self) -> bool:
        """The last table known names several groups (no network)."""
        table = self._table
        return table is not None and len(table.groups) > 1

    def group_of_address(self, address: str) -> str:
        """The group whose route names ``address`` ("" when none does)."""
        table = self._table
        if table is None:
            return ""
        for name, group in table.groups.items():
            if address in group.addresses:
                return name
        for name, cluster in list(self._clusters.items()):
            if cluster.cached_master() == address:
                return name
        return ""

    def _recheck(self, address: str) -> None:
        """A degraded answer (stored, not confirmed by the slaves) to a ``send_async`` batch
        (the client's I/O thread): doubt that master, and let keyless sends pass over its group
        for a while."""
        self.seed.recheck(address)
        table = self._table
        for name, cluster in list(self._clusters.items()):
            was_master = cluster.cached_master() == address
            cluster.recheck(address)
            route = table.groups.get(name) if table is not None else None
            if was_master or (route is not None and address in route.addresses):
                self.selector.failed(name)


def unknown_group(group: str, table: RouteTable) -> BrokerError:
    return BrokerError(ResponseCode.BAD_REQUEST,
                       f"no broker group {group!r} in cluster {table.cluster or '?'} "
                       f"(groups: {', '.join(table.group_names) or 'none'})", False)


def one_group_of(topic: str, table: RouteTable, what: str) -> str:
    """The group holding ``topic`` when only one does; a clear BAD_REQUEST when several do
    (a queue id needs its group then) or TOPIC_NOT_EXIST when none does."""
    held = sorted(table.topics.get(topic, {}))
    if len(held) == 1:
        return held[0]
    if not held:
        raise BrokerError(ResponseCode.TOPIC_NOT_EXIST,
                          f"no broker group of cluster {table.cluster or '?'} holds topic "
                          f"{topic} (groups: {', '.join(table.group_names)})", False)
    raise BrokerError(ResponseCode.BAD_REQUEST,
                      f"topic {topic} has queues in groups {', '.join(held)}: {what} needs "
                      "its group (broker_name=)", False)


def queues_in(queues: Sequence[MessageQueue], group: str) -> list[MessageQueue]:
    return [mq for mq in queues if mq.broker_name == group]
