"""The broker process: one store, one request server and the current role.

The role objects come from the composition root (``common/cli/main.py``) through a ``RoleFactory``;
nothing here imports ``master/`` or ``slave/``. A role decides what happens to writes (a master
appends, a slave refuses); reads, status and consumer offsets are served the same way by every
role (``common/broker/server.py``).

State under ``<storePathRootDir>/config/``: topics and consumer offsets (``common/broker/tables.py``).
Prometheus collectors: ``common/broker/metrics.py``.

Shutdown is two-stage (uvicorn): the first SIGTERM/SIGINT drains in-flight requests, stops the
role, persists the offsets and shuts the store down (flush, checkpoint, remove the abort file);
a second signal exits at once.

Failures are never silent. A loop participant (the master's HA service) or the slave's HA
client that raises is logged at ERROR and restarted; ``status.health`` shows each one's state,
failures, restarts and last error (the ``replog_component_*`` metrics too). The request
server's I/O thread cannot be restarted in place (it owns the client socket and every request
in flight): when it dies the broker logs ``event=broker_fatal`` at ERROR, shuts down cleanly
(flush, checkpoint) and ``serve_forever`` returns ``EXIT_INTERNAL_ERROR`` (70, EX_SOFTWARE), the
process's exit status, for its supervisor to restart it.

Security (``common/broker/security.py``): ``self.security`` is built from the config before
anything starts (a bad key or ACL file refuses the start) and handed to the request server and,
through the composition root, to the roles; SIGHUP reloads the ACL file.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import prometheus_client

from common.broker.consumer_groups import ConsumerGroups
from common.broker.metrics import (
    ConsumerLagCollector,
    SecurityCollector,
    StatusCollector,
    dead_letters,
    lag_by_group,
)
from common.broker.processors.context import Writer
from common.broker.producer_groups import ProducerGroups
from common.broker.replies import Reply, reply
from common.broker.role_manager import MASTER_ROLES, Role, RoleManager, RoleState
from common.broker.security import Security
from common.broker.server import RequestServer
from common.broker.subscription_groups import SubscriptionGroupTable
from common.broker.tables import ConsumerOffsetTable, TopicTable, TopicTableFull
from common.core.config import BrokerConfig, split_addresses
from common.core.errors import BrokerError, ConfigError, ResponseCode
from common.core.logs import log_event
from common.core.message import retry_topic
from common.format import record_writer, tables
from common.format.protocol import LOG_CHECKSUM_MAX_BYTES, Request, RequestCode, Response
from common.format.record import MAX_TOPIC_BYTES
from common.format.tables import GroupConfig
from common.ha import epochs, promotion, term
from common.ha.controller_core import GroupState, MemberRecord, topics_room
from common.store.api import Store

if TYPE_CHECKING:
    from common.broker.controller import Controller

log = logging.getLogger("replog.broker")

EXIT_INTERNAL_ERROR = 70  # sysexits' EX_SOFTWARE: the I/O thread died (serve_forever)
DRAIN_TIMEOUT_S = 10.0
OFFSET_PERSIST_INTERVAL_S = 1.0
GROUP_PROBE_MS = 1500  # start-up: how long each of groupServers gets to answer status
ORPHAN_AFTER_S = 2.0  # a slave not replicating this long looks for a newly promoted master


RoleFactory = Callable[[RoleState, "Broker"], Role]  # the composition root's make_role


# ---- status ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class BrokerStatus:
    """A frozen snapshot of the broker; feeds ``replog status``, metrics and tests alike."""

    brokerName: str
    brokerId: int
    role: str
    epoch: int
    minPhyOffset: int
    maxPhyOffset: int
    flushedPhyOffset: int
    masterAddress: str  # the master's client address (a slave: as its master told it, "" before)
    slaves: list[dict[str, Any]]
    brokerClusterName: str
    address: str
    pid: int
    uptimeS: float
    dispatchedPhyOffset: int
    confirmPhyOffset: int  # consumers are served up to here (controller mode: the SyncStateSet's)
    flushLagBytes: int
    reputLagBytes: int
    topics: int
    diskUsedRatio: float | None  # % of the store's filesystem in use (None: not known)
    epochHistory: list[list[int]]  # [epoch, start offset] of the last 32 terms, oldest first
    consumerLag: dict[str, dict[str, int]]  # group -> {lag, committed} (offset table here)
    commitLogBytes: int  # the CommitLog's bytes kept (max - min physical offset)
    server: dict[str, Any]
    store: dict[str, Any]
    replication: dict[str, Any]  # a slave's view of its master: state, lagBytes, resyncs...
    refusedWrites: int
    haAddress: str  # where its slaves (or a rejoining old master) replicate from
    haMasterAddress: str  # a slave: the master HA address it replicates from ("" on a master)
    configSync: dict[str, Any]  # a slave: copying its master's tables (slave/config_sync.py)
    consumerGroups: dict[str, int]  # group -> live GroupConsumer members (heartbeats)
    producerGroups: dict[str, int]  # group -> live producers (PRODUCER_HEARTBEAT)
    deadLetters: dict[str, int]  # group -> messages held in its %DLQ% topic (master/send_back.py)
    controller: dict[str, Any]  # controller mode: ZooKeeper session, lease, SyncStateSet, epoch
    fencedWrites: int  # controller mode: writes refused for a stale lease or a lost election
    security: dict[str, Any]  # aclEnable, aclVersion, aclReloadFailing (common/broker/security.py)
    timer: dict[str, Any]  # timer messages: pending, read time, lateness (common/store/timer/)
    # transactions: ends decided, refused, repaired; "check": a master's check-back figures
    transactions: dict[str, Any]
    # POP consumption: handed out, redelivered, acked, stale acks, changes, DLQ moves; queues
    # read by POP, messages in flight and due again (common/store/pop/)
    pop: dict[str, Any]
    # component (haService, haClient) -> {state, failures, restarts, lastError}
    health: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out.update(self.server)  # put/get rates and latency percentiles at the top level too
        return out


def _plain(value: Any) -> dict[str, Any]:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {k: _jsonable(v) for k, v in dataclasses.asdict(value).items()}
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return {}


def _jsonable(value: Any) -> Any:
    if isinstance(value, int | float | str | bool) or value is None:
        return value
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return str(value)


# ---- the broker ------------------------------------------------------------------------------


class Broker:
    """Store + request server + current role; ``serve_forever`` runs until a signal."""

    def __init__(self, cfg: BrokerConfig, store: Store, role_factory: RoleFactory):
        self.cfg = cfg  # as loaded, frozen: the running role is self.roles.state
        self.store = store
        self.role_factory = role_factory
        config_dir = cfg.store_root / "config"
        self.topics = TopicTable(config_dir)
        self.offsets = ConsumerOffsetTable(config_dir)
        self.groups = SubscriptionGroupTable(config_dir, cfg.autoCreateSubscriptionGroup)
        self.consumer_groups = ConsumerGroups()
        self.producer_groups = ProducerGroups()  # live producers, by connection
        # every role change, in one sequence (common/broker/role_manager.py)
        self.roles = RoleManager(cfg, store, lambda state: self.role_factory(state, self),
                                 self._route_stored_topics)
        self.security = Security.from_config(cfg)  # ConfigError before anything started
        self.server = RequestServer(cfg, self, security=self.security)
        self.server.put_path_of = self._put_path
        store.delivery_gate = self.write_refusal  # no delayed delivery from a fenced master
        self._started = time.monotonic()
        self._admin = concurrent.futures.ThreadPoolExecutor(1, "replog-admin")
        # LOG_CHECKSUM reads and hashes here (its thread starts with the first request); not
        # on the admin thread, where a switchover may wait for seconds
        self._checksums = concurrent.futures.ThreadPoolExecutor(1, "replog-checksum")
        self._stop = threading.Event()
        self._exit_code = 0
        self.server.on_fatal = self._on_fatal
        self._signals = 0
        self._housekeeper: threading.Thread | None = None
        self._metrics_server: Any = None
        self._grpc: Any = None  # common.proxy.server.GrpcProxy with grpcServerPort
        self._epoch_cache: tuple[float, epochs.EpochHistory] = (-1.0, ())
        # the YAML's role (promotion.json compares it with the one a promotion was made under)
        self._configured = (cfg.brokerRole, cfg.haMasterAddress or "")
        self._orphan_since: float | None = None  # a slave not replicating since (no controller)
        self._standby_reason = "waiting for the controller" if cfg.enableControllerMode else ""
        self.controller: Controller | None = None
        if cfg.enableControllerMode:
            from common.broker.controller import Controller

            self.controller = Controller(cfg, self)
            self.server.reply_gate = self._reply_gate
            # held no longer than ZooKeeper keeps a silent session: after that the lease can
            # only come back through an election this master did not win
            self.server.reply_hold_s = cfg.controllerSessionTimeoutMs / 1000.0
            self.topics.on_change = self.controller.topics_changed
            self.topics.admit = topics_room  # routes are published in one znode

    # -- lifecycle ---------------------------------------------------------------------------
    def _follow_newer_master(self, state: RoleState) -> RoleState:
        """A master restarting into a group whose master has a newer epoch (a slave was
        promoted while it was away) joins that master as a slave instead: its HA client then
        truncates what only this broker holds, past the point where the epoch histories
        diverge, and catches up. Brokers that do not answer within GROUP_PROBE_MS are passed
        over; with none answering, this broker starts as configured. A master of this
        broker's own newest epoch counts too: that is the master it rejoined before."""
        from common.client import Admin

        own = self.epoch()
        me = {self.cfg.client_address, f"127.0.0.1:{self.cfg.listenPort}",
              f"localhost:{self.cfg.listenPort}"}
        peers = [a for a in split_addresses(self.cfg.groupServers) if a not in me]
        best: tuple[int, str, str] | None = None
        taken: set[Any] = set()  # brokerIds in use: a slave needs one of its own (1..255)
        if not peers:
            return state

        def probe(address: str) -> dict[str, Any] | None:
            try:
                return admin.status(address)
            except BrokerError:
                return None

        with Admin(peers, timeout_ms=GROUP_PROBE_MS, retries=0,
                   curve=self.security.peer_keys()) as admin, \
                concurrent.futures.ThreadPoolExecutor(len(peers), "replog-probe") as pool:
            answers = list(pool.map(probe, peers))  # all at once: at most one timeout in all
        for address, doc in zip(peers, answers, strict=True):
            if doc is not None:
                taken.add(doc.get("brokerId"))
                taken.update(s.get("brokerId") for s in doc.get("slaves") or ()
                             if isinstance(s, dict))
                epoch = doc.get("epoch")
                # >=: a term has one master, so a master of this broker's newest term is
                # another broker's (this one rejoined it before, and restarts now)
                if (doc.get("role") in MASTER_ROLES and isinstance(epoch, int) and epoch >= own
                        and (best is None or epoch > best[0]) and doc.get("haAddress")):
                    best = (epoch, address, str(doc["haAddress"]))
        if best is None:
            return state
        epoch, address, ha_address = best
        free = [i for i in range(1, 256) if i not in taken]
        if not free:
            raise ConfigError(f"cannot rejoin the group as a slave of {address} (epoch "
                              f"{epoch}): no brokerId in 1..255 is free")
        log_event(log, "broker_rejoins_as_slave", master=address, master_epoch=epoch,
                  own_epoch=own, configured_role=self.cfg.brokerRole, brokerId=free[0])
        try:
            promotion.forget(self.cfg.store_root)  # a promotion this broker had is over
        except OSError as e:
            log_event(log, "promotion_record_not_removed", logging.WARNING, error=str(e))
        return RoleState("SLAVE", free[0], ha_address)  # a master's id 0 is no slave id

    def start(self) -> None:
        self.store.start()
        try:
            self.security.start()
            self._start_serving()
        except BaseException:
            # a clean refusal: stop what started, flush, remove abort, release the lock
            self.roles.stop()
            self.server.stop(timeout_s=2.0)
            self.store.shutdown()
            self.security.stop()
            raise

    def _resume_promotion(self, state: RoleState) -> RoleState:
        """A slave promoted before this restart starts as the master it became
        (``common/ha/promotion.py``: while its YAML and its newest epoch are unchanged, and
        with ``groupServers`` to probe: ``_follow_newer_master`` runs next)."""
        root = self.cfg.store_root
        try:
            record = promotion.load(root)
        except (promotion.PromotionRecordError, OSError) as e:
            log_event(log, "promotion_record_unreadable", logging.ERROR,
                      path=str(promotion.path_of(root)), error=str(e),
                      role=self.cfg.brokerRole)
            return state
        if record is None:
            return state
        newest = self.epoch()
        can_probe = bool(self.cfg.groupServers)
        role = promotion.resumed_role(record, *self._configured, newest, can_probe)
        if role is None:
            log_event(log, "promotion_not_resumed", logging.WARNING, epoch=record.epoch,
                      newest_epoch=newest, configured_role=self.cfg.brokerRole,
                      reason="a newer epoch or an edited brokerRole/haMasterAddress"
                      if can_probe else "no groupServers to ask whether a newer master exists")
            return state
        log_event(log, "broker_resumes_promotion", role=role, epoch=record.epoch,
                  configured_role=self.cfg.brokerRole)
        return dataclasses.replace(state, name=role)

    def _start_serving(self) -> None:
        self.topics.merge_seen(self.store.topic_queues())
        cfg = self.cfg
        if self.controller is not None:
            # a standby slave with nothing to follow until the controller names the master
            state = RoleState("SLAVE", cfg.brokerId, "")
        else:
            state = self._resume_promotion(RoleState(cfg.brokerRole, cfg.brokerId,
                                                     cfg.haMasterAddress))
            if state.is_master and cfg.groupServers:
                state = self._follow_newer_master(state)
        role = self.roles.start(state)  # a master: delay delivery on, queue offsets continued
        self.store.add_arrival_listener(self.server.on_arrival)
        self.server.start()
        if self.controller is not None:
            self.controller.start()
        self._housekeeper = threading.Thread(
            target=self._housekeep, name="replog-housekeeping", daemon=True
        )
        self._housekeeper.start()
        self._start_metrics()
        self._start_grpc()
        log_event(
            log,
            "broker_started",
            name=self.cfg.brokerName,
            id=self.roles.state.broker_id,
            role=role.name,
            address=self.cfg.client_address,
            pid=os.getpid(),
            record_writer="c" if record_writer.NATIVE else "python",
        )

    def _start_grpc(self) -> None:
        """``grpcServerPort``: RocketMQ 5's gRPC protocol over this broker's cluster (RocketMQ's
        proxy in Local mode; ``common/proxy/``): plain sends to this broker in-process
        (``common/proxy/local.py``), the rest through this broker's own client port (and the
        group's other brokers, to find the master while this one is a slave)."""
        cfg = self.cfg
        if not cfg.grpcServerPort:
            return
        # grpc is imported only when it is on
        from common.proxy.auth import GrpcAuth
        from common.proxy.local import LocalBroker, write_queues
        from common.proxy.server import GrpcProxy, front_end_keys, load_tls

        local = f"127.0.0.1:{cfg.listenPort}"
        servers = [local, *(s.strip() for s in cfg.groupServers.split(",") if s.strip())]
        tls = load_tls(cfg.tlsCertPath, cfg.tlsKeyPath) if cfg.tlsCertPath else None
        auth = curve = None
        security = self.security
        if security.enabled:  # the calls are authorized by the front end, against this ACL
            assert security.acl is not None and security.own is not None
            peer = security.peer_keys()
            assert peer is not None
            acl = security.acl
            curve = front_end_keys(cfg.grpcClientKeyFile, acl.current, peer.server_key,
                                   {local: security.own.public})
            auth = GrpcAuth(lambda: acl.current, security.audit.refused)
        calls = self.server.local  # Local mode: plain sends reach this broker in-process
        calls.born_host = ("127.0.0.1", cfg.grpcServerPort)
        roles = self.roles
        in_process = LocalBroker(calls, tuple(dict.fromkeys((local, cfg.client_address))),
                                 cfg.brokerName,
                                 write_queues(self.topics.queue_nums, self.topics.perm),
                                 lambda: roles.state.is_master)
        self._grpc = GrpcProxy(servers, cfg.grpcBindAddress or "0.0.0.0", cfg.grpcServerPort,
                               cfg.maxMessageSize, tls=tls, auth=auth, curve=curve,
                               local=in_process)
        self._grpc.start()

    def shutdown(self) -> None:
        """Drain, stop the role, persist offsets, shut the store down (removes the abort file).

        In controller mode the broker leaves the group first: its member znode goes, so the
        others elect a master at once, and its writes are refused while it drains."""
        if self._grpc is not None:  # its calls are this broker's clients: they end first
            self._grpc.stop()
            self._grpc = None
        if self.controller is not None:
            self.controller.stop()
        log_event(log, "broker_draining", inflight=self.server.stats.inflight)
        drained = self.server.drain(DRAIN_TIMEOUT_S)
        self._stop.set()
        if self._housekeeper is not None:
            self._housekeeper.join(5.0)
        self._admin.shutdown(wait=True, cancel_futures=True)
        self._checksums.shutdown(wait=True, cancel_futures=True)
        self.roles.stop()
        self.offsets.persist()
        self.store.shutdown()
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
            self._metrics_server.server_close()
        self.security.stop()
        log_event(log, "broker_stopped", drained=drained)

    @property
    def role(self) -> Role | None:
        """The running role (None while starting)."""
        return self.roles.role

    def serve_forever(self) -> int:
        """Start, wait for SIGTERM/SIGINT, shut down cleanly; a second signal exits at once.
        Returns the process's exit status: 0, or EXIT_INTERNAL_ERROR when the I/O thread died."""
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        signal.signal(signal.SIGHUP, self._on_sighup)
        self.start()
        return self.wait_and_shutdown()

    def wait_and_shutdown(self) -> int:
        """Wait for a stop (a signal, or the I/O thread's death), then shut down; returns the
        exit status (see ``serve_forever``)."""
        while not self._stop.wait(0.5):
            pass
        self.shutdown()
        return self._exit_code

    def _on_fatal(self, reason: str) -> None:
        """The I/O thread died (its own thread): stop cleanly with a non-zero status."""
        self._exit_code = EXIT_INTERNAL_ERROR
        log_event(log, "broker_fatal", logging.ERROR, reason=reason,
                  action="shutting down", exitStatus=EXIT_INTERNAL_ERROR)
        self._stop.set()

    def _on_signal(self, signum: int, _frame: object) -> None:
        self._signals += 1
        if self._signals > 1:
            log_event(log, "broker_forced_exit", signal=signal.Signals(signum).name)
            os._exit(1)
        log_event(log, "broker_signal", signal=signal.Signals(signum).name)
        self._stop.set()

    def _on_sighup(self, _signum: int, _frame: object) -> None:
        """Reload the ACL file now (its poller would within aclReloadIntervalMs)."""
        if self.security.enabled:
            self.security.request_reload()
        else:
            log_event(log, "sighup_ignored", reason="aclEnable is off: no ACL file to reload")

    def _housekeep(self) -> None:
        while not self._stop.wait(OFFSET_PERSIST_INTERVAL_S):
            try:
                self.offsets.persist()
            except OSError as e:
                log_event(log, "offsets_persist_failed", logging.ERROR, error=str(e))
            try:
                self._follow_promoted_master()
            except Exception as e:  # noqa: BLE001 - a failed probe is retried next round
                log_event(log, "follow_probe_failed", logging.WARNING, error=repr(e))

    def _follow_promoted_master(self) -> None:
        """Without a controller: a slave that has not replicated for ``ORPHAN_AFTER_S`` asks
        ``groupServers`` whether a master of a newer epoch exists (another slave was promoted
        after its master died) and follows it at run time; no restart, no edited YAML."""
        role = self.role
        if (self.controller is not None or not self.cfg.groupServers or role is None
                or role.name != "SLAVE"):
            self._orphan_since = None
            return
        now = time.monotonic()
        if role.replicating():
            self._orphan_since = None
            return
        if self._orphan_since is None:
            self._orphan_since = now
        if now - self._orphan_since < ORPHAN_AFTER_S:
            return
        found = self._newer_group_master()
        if found is None:
            return
        epoch, address, ha_address = found
        with self.roles.lock:
            if self.role is not role:
                return  # promoted (or re-pointed) meanwhile
            log_event(log, "broker_follows_promoted_master", master=address, ha=ha_address,
                      master_epoch=epoch, own_epoch=self.epoch(),
                      previous=self.roles.state.master_ha_address)
            self.roles.follow(ha_address)
            self._orphan_since = None

    def _newer_group_master(self) -> tuple[int, str, str] | None:
        """(epoch, client address, HA address) of the master of the newest epoch among
        ``groupServers``, if it is newer than this store's and not the one followed now."""
        from common.client import Admin

        own = self.epoch()
        me = {self.cfg.client_address, f"127.0.0.1:{self.cfg.listenPort}"}
        peers = [a for a in split_addresses(self.cfg.groupServers) if a not in me]
        best: tuple[int, str, str] | None = None
        if not peers:
            return None

        def probe(address: str) -> dict[str, Any] | None:
            try:
                return admin.status(address)
            except BrokerError:
                return None

        with Admin(peers, timeout_ms=GROUP_PROBE_MS, retries=0,
                   curve=self.security.peer_keys()) as admin, \
                concurrent.futures.ThreadPoolExecutor(len(peers), "replog-probe") as pool:
            answers = list(pool.map(probe, peers))  # all at once: at most one timeout in all
        for address, doc in zip(peers, answers, strict=True):
            if doc is not None:
                epoch = doc.get("epoch")
                if (doc.get("role") in MASTER_ROLES and isinstance(epoch, int) and epoch > own
                        and doc.get("haAddress") and (best is None or epoch > best[0])):
                    best = (epoch, address, str(doc["haAddress"]))
        if best is None or best[2] == self.roles.state.master_ha_address:
            return None
        return best

    def _start_metrics(self) -> None:
        if not self.cfg.metricsPort:
            return
        registry = prometheus_client.CollectorRegistry()
        registry.register(StatusCollector(self.snapshot))
        registry.register(ConsumerLagCollector(self.offsets, self.store,
                                               self.consumer_groups.groups))
        if self.controller is not None:
            from common.broker.controller_metrics import ControllerCollector

            registry.register(ControllerCollector(self.controller.status, self.cfg.brokerName))
        if self.security.enabled:
            registry.register(SecurityCollector(self.security))
        server, _thread = prometheus_client.start_http_server(
            self.cfg.metricsPort, addr=self.cfg.metrics_bind_host, registry=registry
        )
        self._metrics_server = server
        log_event(log, "metrics_listening", port=self.cfg.metricsPort,
                  bind=self.cfg.metrics_bind_host)

    # -- what the server asks ------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        return self.snapshot().to_json()

    def snapshot(self) -> BrokerStatus:
        store = self.store
        role = self.role
        role_fields = role.status_fields() if role is not None else {}
        max_phy = int(store.max_phy_offset)
        flushed = int(store.flushed_phy_offset)
        dispatched = int(store.dispatched_phy_offset)
        broker_id = self.roles.state.broker_id
        if self.controller is not None and role is not None and role.name != "SLAVE" \
                and self.controller.is_master():
            broker_id = 0  # RocketMQ's MASTER_ID: whoever the controller elected
        controller: dict[str, Any] = {"enabled": False}
        if self.controller is not None:
            controller = self.controller.status()
            controller["standbyReason"] = self._standby_reason
            if "syncStateSet" in role_fields:
                controller["haSyncStateSet"] = role_fields["syncStateSet"]
        return BrokerStatus(
            brokerName=self.cfg.brokerName,
            brokerId=broker_id,
            role=role.name if role is not None else "STARTING",
            epoch=self.epoch(),
            minPhyOffset=int(store.min_phy_offset),
            maxPhyOffset=max_phy,
            flushedPhyOffset=flushed,
            masterAddress=str(role_fields.get("masterAddress", "")),
            slaves=list(role_fields.get("slaves", [])),
            brokerClusterName=self.cfg.brokerClusterName,
            address=self.cfg.client_address,
            pid=os.getpid(),
            uptimeS=round(time.monotonic() - self._started, 3),
            dispatchedPhyOffset=dispatched,
            confirmPhyOffset=int(store.reput_end()),
            flushLagBytes=max(0, max_phy - flushed),
            reputLagBytes=max(0, max_phy - dispatched),
            topics=len(self.topics.topics()),
            diskUsedRatio=_disk_used_percent(self.cfg.store_root),
            # the terms this broker's log holds: [epoch, first offset], the last 32
            epochHistory=[[e.epoch, e.start_phy_offset]
                          for e in (self.epoch_history() or ())[-32:]],
            commitLogBytes=max(0, max_phy - int(store.min_phy_offset)),
            server={**self.server.stats.figures(), **self.server.port_figures(),
                    "clientRequests": self.server.client_requests.figures()},
            store=_plain(store.snapshot()),
            replication=dict(role_fields.get("replication", {})),
            refusedWrites=int(role_fields.get("refusedWrites", 0)),
            haAddress=f"{self.cfg.brokerIP1}:{self.cfg.ha_port}",
            haMasterAddress=str(role_fields.get("haMasterAddress", "")),
            configSync=dict(role_fields.get("configSync", {})),
            consumerGroups=self.consumer_groups.groups(),
            producerGroups=self.producer_groups.groups(),
            deadLetters=dead_letters(store),
            consumerLag=lag_by_group(self.offsets, store),
            controller=controller,
            fencedWrites=int(role_fields.get("fencedWrites", 0)),
            security=self.security.status(),
            timer=store.timer_status(),
            transactions={**store.transactions.status(),
                          "check": dict(role_fields.get("transactionCheck", {}))},
            pop=store.pop.figures(int(time.time() * 1000)),
            health={**self.server.participant_health(), **role_fields.get("health", {})},
        )

    def epoch(self) -> int:
        """The newest epoch in ``epochFileCheckpoint`` (0 before the first term is recorded;
        -1 when the file cannot be read)."""
        history = self.epoch_history()
        return -1 if history is None else epochs.last_epoch(history)

    def epoch_history(self) -> epochs.EpochHistory | None:
        """Every term of ``epochFileCheckpoint``, oldest first (read again when the file
        changed); None when it cannot be read."""
        path = epochs.epoch_file_path(self.cfg.store_root)
        try:
            mtime = path.stat().st_mtime
        except FileNotFoundError:
            return ()
        if mtime != self._epoch_cache[0]:
            try:
                self._epoch_cache = (mtime, epochs.load(self.cfg.store_root))
            except epochs.EpochFileError as e:
                log_event(log, "epoch_file_unreadable", logging.ERROR, error=str(e))
                return None
        return self._epoch_cache[1]

    def topic_queue_nums(self, topic: str) -> tuple[int, bool]:
        return self.topics.queue_nums(topic), self.cfg.autoCreateTopicEnable

    def ensure_retry_topic(self, group: str) -> None:
        """A master creates a group's retry topic when its members first heartbeat (RocketMQ's
        heartbeat does), one queue, so they read it before any send-back and a new master
        has it even when the old one died before a slave copied its topics."""
        role = self.role
        topic = retry_topic(group)
        if (role is None or role.name == "SLAVE" or self.topics.queue_nums(topic)
                or len(topic.encode()) > min(self.cfg.maxTopicLength, MAX_TOPIC_BYTES)):
            return
        try:
            self.topics.create(topic, 1)
        except TopicTableFull as e:
            log_event(log, "retry_topic_not_created", logging.WARNING, group=group,
                      reason=str(e))

    def commit_offset(self, group: str, topic: str, queue_id: int, queue_offset: int) -> None:
        self.offsets.commit(group, topic, queue_id, queue_offset)

    def fetch_offset(self, group: str, topic: str, queue_id: int) -> int:
        return self.offsets.fetch(group, topic, queue_id)

    def group_config(self, group: str) -> GroupConfig | None:
        """subscriptionGroup.json's entry for ``group``; with autoCreateSubscriptionGroup on, a
        new group's is made (a master writes it; a slave answers the defaults, its table being
        its master's copy)."""
        return self.groups.find(group, persist=self.roles.state.is_master)

    def delete_group(self, group: str, clean_offset: bool) -> tuple[bool, int]:
        had = self.groups.delete(group) is not None
        removed = self.offsets.remove_group(group) if clean_offset else 0
        if removed:
            self.offsets.persist()
        return had, removed

    def config_document(self, code: RequestCode) -> bytes:
        """GET_ALL_TOPIC_CONFIG / GET_ALL_CONSUMER_OFFSET / GET_ALL_DELAY_OFFSET /
        GET_ALL_SUBSCRIPTIONGROUP_CONFIG: the table as
        its file holds it (what a slave copies, ``slave/config_sync.py``)."""
        if code == RequestCode.GET_ALL_TOPIC_CONFIG:
            return self.topics.to_bytes()
        if code == RequestCode.GET_ALL_CONSUMER_OFFSET:
            return self.offsets.to_bytes()
        if code == RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG:
            return self.groups.to_bytes()
        return tables.delay_offsets_bytes(dict(self.store.schedule.offsets))

    def apply_master_document(self, code: RequestCode, raw: bytes, source: str) -> bool:
        """A slave takes its master's table (ValueError, nothing changed, if malformed);
        True if anything changed."""
        if code == RequestCode.GET_ALL_TOPIC_CONFIG:
            # what this store holds messages of stays
            return self.topics.replace(raw, source, seen=self.store.topic_queues())
        if code == RequestCode.GET_ALL_CONSUMER_OFFSET:
            return self.offsets.replace(raw, source)
        if code == RequestCode.GET_ALL_DELAY_OFFSET:
            return tables.replace_delay_offsets(self.store.schedule.path, raw, source)
        if code == RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG:
            return self.groups.replace(raw, source)
        raise ValueError(f"{code!r} carries no table")

    def _put_path(self) -> Any:
        """The running master's native put path (``master/put_path.py``), or None."""
        return getattr(self.roles.role, "put_path", None)

    def writer(self, req: Request) -> Writer | Response:
        """The master role that takes the write ``req`` (its processor calls it), or the
        refusal: a broker still starting, a slave, a fenced master."""
        role = self.roles.role
        if role is None:
            return reply(req, ResponseCode.SERVICE_NOT_AVAILABLE, "broker is starting")
        refusal = role.refusal(req)
        if refusal is not None:
            return refusal
        return role  # type: ignore[return-value]  # only a master takes writes

    def acl_info(self) -> dict[str, Any]:
        return self.security.acl_info()

    def log_checksum(self, req: Request) -> Reply:
        """LOG_CHECKSUM: sha256 of a CommitLog range (checked by the server), hashed off the
        I/O thread."""
        return self._checksums.submit(self._log_checksum, req)

    def _log_checksum(self, req: Request) -> Response:
        f = req.fields
        try:
            digest = self.store.log_checksum(f["fromOffset"], f["toOffset"],
                                             LOG_CHECKSUM_MAX_BYTES)
        except LookupError as e:
            return reply(req, ResponseCode.OFFSET_OUT_OF_RANGE, str(e),
                         {"minPhyOffset": int(self.store.min_phy_offset),
                          "maxPhyOffset": int(self.store.max_phy_offset)})
        return reply(req, fields={"fromOffset": f["fromOffset"], "toOffset": f["toOffset"],
                                  "sha256": digest})

    def promote(self, req: Request) -> Reply:
        """PROMOTE: turn this slave into its group's master (off the I/O thread)."""
        target = req.fields.get("role", "SYNC_MASTER")
        return self._admin.submit(self._promote, req, target)

    def _promote(self, req: Request, target: str) -> Response:
        if self.controller is not None:
            return self._switchover(req)
        with self.roles.lock:
            return self._promote_locked(req, target)

    def _promote_locked(self, req: Request, target: str) -> Response:
        current = self.role
        if current is not None and current.name != "SLAVE":
            return reply(req, fields=self.status(), remark=f"already {current.name}")
        root = self.cfg.store_root
        opened: list[int] = []
        starts: list[int] = []

        def open_term(history: epochs.EpochHistory, max_phy: int) -> epochs.EpochHistory:
            # numbered after every epoch this store has seen, also one learned from a master's
            # HELLO_REPLY before any of its bytes arrived (term.py's learned marker)
            newest = max(epochs.last_epoch(history), term.learned_epoch(root) or 0)
            opened.append(epochs.next_epoch(newest, self.roles.state.broker_id))
            starts.append(max_phy)
            return epochs.append_epoch(history, opened[-1], max_phy)

        def record_term(history: epochs.EpochHistory) -> None:
            # a restart from the unchanged YAML (brokerRole: SLAVE) comes back as this master
            promotion.record(root, target, epochs.last_epoch(history), *self._configured)

        try:
            self.roles.become_master(target, open_term, record_term)
        except Exception as e:  # noqa: BLE001 - any failure: back to a replicating slave
            log_event(log, "broker_promotion_failed", logging.ERROR, role=target, error=repr(e))
            return reply(
                req,
                ResponseCode.SYSTEM_ERROR,
                f"promotion to {target} failed, still a SLAVE replicating from "
                f"{self.roles.state.master_ha_address}: {e}",
                self.status(),
            )
        log_event(log, "broker_promoted", role=target, epoch=opened[-1],
                  epochStartOffset=starts[-1])
        # the term's first offset, as its epoch records it: the status's maxPhyOffset, read
        # after, may already hold writes the new master took meanwhile
        return reply(req, fields={**self.status(), "epochStartOffset": starts[-1]})

    # -- controller mode (common/broker/controller.py calls these on its thread) ----------------
    def write_refusal(self) -> str:
        """"" while writes may be taken; else why not (the master role asks for every write)."""
        controller = self.controller
        return "" if controller is None else controller.write_refusal()

    def _reply_gate(self, resp: Response, final: bool) -> Response | None:
        """The last look before a SEND_OK leaves (the request server calls it): a master whose
        lease ran out meanwhile must not promise the message yet. While it is still master
        (its session not known lost) the answer is held (None; ``final`` False): the lease is
        confirmed again only by a write in the session it was elected in, and while that
        session lives its member znode does too, so no election can have happened and the
        SEND_OK is true once it is fresh. That is a ZooKeeper connection moving to another
        server (the ensemble's leader lost): the answers in flight wait a second or two
        instead of turning indeterminate. ``final`` (the hold's end, a session timeout, or the
        loop ending) or a master no more (paused past its session, replaced): the record is
        stored, whether the next master has it is unknown: FLUSH_SLAVE_TIMEOUT."""
        controller = self.controller
        if controller is None or controller.acknowledge_ok():
            return resp
        if not final and controller.is_master():
            return None
        controller.stats.fenced_writes += 1
        return resp._replace(
            code=ResponseCode.FLUSH_SLAVE_TIMEOUT,
            remark="stored, but this master's controller lease ran out before the answer: "
                   "the next master may not have it")

    def local_record(self, incarnation: str) -> MemberRecord:
        role = self.role
        name = "STARTING" if role is None else ("SLAVE" if role.name == "SLAVE" else "MASTER")
        max_phy = int(self.store.max_phy_offset)
        return MemberRecord(
            member_id=self.roles.state.broker_id, address=self.cfg.client_address,
            ha_address=f"{self.cfg.brokerIP1}:{self.cfg.ha_port}", role=name,
            last_epoch=max(0, self.epoch()), max_offset=max_phy,
            confirm_offset=min(max_phy, int(self.store.reput_end())),
            priority=self.cfg.brokerElectionPriority, incarnation=incarnation,
            store_id=self.store.store_id)

    def topic_table(self) -> dict[str, int]:
        return self.topics.topics()

    def topic_perms(self) -> dict[str, int]:
        return self.topics.perms()

    def cluster_info(self) -> dict[str, Any]:
        """CLUSTER_INFO (RocketMQ's GET_BROKER_CLUSTER_INFO, with each group's topics, queue
        counts and permissions: its TopicRouteData): in controller mode every group of
        ``brokerClusterName`` as ZooKeeper holds it (this broker's own topic table for its
        group while it is that group's master: the same, a moment sooner); without a
        controller, this broker's own group as it knows it."""
        if self.controller is not None:
            groups = []
            own_master = self.controller.is_master()
            for view in self.controller.cluster_view().values():
                doc = view.to_json()
                if own_master and view.name == self.cfg.brokerName:
                    doc["topics"], doc["perms"] = self.topics.topics(), self.topics.perms()
                groups.append(doc)
            return {"cluster": self.cfg.brokerClusterName, "controller": True,
                    "groups": groups}
        status = self.status()
        role = status["role"]
        master = status["address"] if role in MASTER_ROLES else status["masterAddress"]
        slaves = [s["address"] for s in status["slaves"]] if role in MASTER_ROLES \
            else [status["address"]]
        return {"cluster": self.cfg.brokerClusterName, "controller": False, "groups": [{
            "brokerName": self.cfg.brokerName, "master": master,
            "masterEpoch": status["epoch"], "slaves": slaves,
            "topics": self.topics.topics(), "perms": self.topics.perms()}]}

    def topic_layout(self, topic: str) -> dict[str, int]:
        """Group -> queue count of ``topic`` over the cluster (what a consumer group's
        allocation is computed over; ``ConsumerGroups.owns``): this group's count from its own
        table, the others' from the controller's view of ZooKeeper; without a controller, this
        group alone."""
        layout = {}
        if self.controller is not None:
            layout = {name: view.topics[topic] for name, view in
                      self.controller.cluster_view().items() if topic in view.topics}
        layout.pop(self.cfg.brokerName, None)
        nums = self.topics.queue_nums(topic)
        if nums:
            layout[self.cfg.brokerName] = nums
        return layout

    def slave_acks(self) -> dict[int, int]:
        role = self.role
        return role.slave_acks() if role is not None else {}

    def act_as_master(self, state: GroupState) -> None:
        """The controller elected this broker (or handed it the group): open the term's epoch
        (the number ZooKeeper recorded) at this log's end and serve as the master. A master
        role already running (re-elected after losing its session) is replaced. Raises when
        it cannot serve (the role manager has made it a slave again)."""
        with self.roles.lock:
            role = self.roles.become_master(
                self.cfg.brokerRole,
                lambda history, end: epochs.append_epoch(history, state.master_epoch, end))
            self._standby_reason = ""
            log_event(log, "broker_elected_master", role=role.name, epoch=state.master_epoch,
                      maxPhyOffset=self.store.max_phy_offset)

    def act_as_slave(self, state: GroupState) -> None:
        """Follow the master the controller names: re-point replication at run time (a demoted
        master stops its HA service first; the handshake truncates what only it held)."""
        with self.roles.lock:
            current = self.role
            ha_address = state.master_ha_address
            if (current is not None and current.name == "SLAVE"
                    and self.roles.state.master_ha_address == ha_address):
                current.require_epoch(state.master_epoch)
                return
            was_master = self.roles.state.is_master
            self.roles.follow(ha_address, epoch=state.master_epoch)
            self._standby_reason = ""
            log_event(log, "broker_follows", master=state.master_address, ha=ha_address,
                      epoch=state.master_epoch, demoted=was_master)

    def _route_stored_topics(self) -> None:
        """Once the store is a master's (the role manager calls it): every queue it holds is
        a topic this master routes. A topic created within the last config-sync interval
        before the old master died exists only in the replicated log, and must be neither
        missing nor shorter here."""
        self.topics.merge_seen(self.store.topic_queues())

    def stand_by(self, reason: str) -> None:
        """No master can be elected now: writes are refused (a master role stays, fenced, so
        its reads go on), and the reason shows in status."""
        self._standby_reason = reason

    def clear_election_fault(self) -> str:
        """CLEAR_ELECTION_FAULT: this broker failed to take over as master (its store could
        not become one) and stood in no election since; an operator who mended the store
        lets it stand again. Returns the fault it had ("" if none)."""
        if self.controller is None:
            raise ValueError("no controller: a broker without one stands in no election")
        return str(self.controller.clear_fault())

    def _switchover(self, req: Request) -> Response:
        """PROMOTE in controller mode: a planned handover to this broker, carried out by the
        master (writes pause until this broker holds everything, then a new epoch)."""
        controller = self.controller
        assert controller is not None  # _promote sends only a controller's PROMOTE here
        role = self.role
        if role is not None and role.name != "SLAVE":
            return reply(req, fields=self.status(), remark=f"already {role.name}")
        timeout_s = self.cfg.switchoverTimeoutMs / 1000.0 + 5.0
        state = controller.request_switchover(self.cfg.brokerId, timeout_s)
        if state is None:
            return reply(req, ResponseCode.SYSTEM_ERROR,
                         f"switchover to member {self.cfg.brokerId} did not happen within "
                         f"{timeout_s:.0f} s (it must be live and in the SyncStateSet, and "
                         "catch up within switchoverTimeoutMs); the master kept the group",
                         self.status())
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            role = self.role
            if role is not None and role.name != "SLAVE" and controller.is_master():
                return reply(req, fields=self.status())
            time.sleep(0.02)
        return reply(req, ResponseCode.SYSTEM_ERROR,
                     "the controller named this broker master but it is not serving yet",
                     self.status())


def _disk_used_percent(path: Any) -> float | None:
    """The used share (%) of the filesystem holding the store (statvfs: microseconds)."""
    try:
        usage = shutil.disk_usage(path)
    except OSError:
        return None
    return round(100.0 * usage.used / usage.total, 1) if usage.total else None
