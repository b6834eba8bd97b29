"""The controller driver: ZooKeeper through kazoo, around the pure decisions of
``common/ha/controller_core.py``.

One thread, "replog-controller", owns every decision and every ZooKeeper call; kazoo's own
threads only post events to its queue (a watch fired, the connection changed). No ZooKeeper
call is ever made in a kazoo callback, and every call goes through ``*_async().get(timeout)``:
kazoo queues calls made while disconnected, and a bare call could wait for ever.

What the thread does, each pass (an event, or at least every ``TICK_S``):

* keeps this broker's ephemeral member znode (``brokers/<id>``) with its offsets, about once a
  second. That write is also the **lease** renewal: a master's lease runs from the start of its
  last confirmed write (``controller_core.Lease``); SUSPENDED or LOST expires it at once, in the
  listener, which only sets a flag. A master renews every third of its lease without waiting
  for the answer (``_renew_lease``: the write is sent, its answer confirms the lease on kazoo's
  callback thread), and before every ZooKeeper call the thread makes: a pass that spends a
  while in reads (a loaded process, a cluster of many groups, another group's failover) does
  not let the lease run out while ZooKeeper answers;
* reads ``state`` (on a watch, and every ``controllerPollIntervalMs`` in case a watch was lost)
  and the live members, then reconciles: follow the master ``state`` names, stand by when there
  is none, resign a stale claim of its own (this process never won it), or run the election
  (``decide_election``) and, on winning the compare-and-set, serve as the master;
* carries out what the master's HA service proposes for the SyncStateSet (a compare-and-set on
  ``state``; the result goes back to the I/O thread), and a planned switchover.
* has its other half, the cluster-wide route view (``common/broker/cluster_routes.py``), read
  every group's ``state``, members and topics (and a master publish its own topic table), with
  this thread's calls; that half decides nothing about this group.

The broker does the role changes (``ControlledBroker``), on this thread: a promotion or a demotion
blocks the controller while it runs, never the request server.

A ConnectionLoss on a compare-and-set leaves its outcome unknown: ``state`` is read again and
compared with what was written before anything else is decided.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import secrets
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from common.broker.cluster_routes import ClusterRoutes
from common.core.config import BrokerConfig, parse_controller_addr
from common.core.files import write_atomically
from common.core.logs import log_event
from common.ha import controller_core as cc
from common.ha.controller_core import GroupState, GroupView, MemberRecord, Switchover

log = logging.getLogger("replog.controller")

TICK_S = 0.1  # the longest the thread sleeps without looking at its timers
MEMBER_REFRESH_S = 1.0  # member record (offsets)
RENEWALS_PER_LEASE = 3  # a master's member write (its lease renewal) every third of the lease
ELECTION_SETTLE_S = 0.05  # after publishing fresh offsets, before ranking the candidates
CALL_TIMEOUT_FRACTION = 3  # a ZooKeeper call waits at most a third of the session
STOP_JOIN_S = 10.0
FAULT_FILE = "electionFault"  # under <store>/config: why this member may not lead


class ControlledBroker(Protocol):
    """What the driver needs of the broker (``common/broker/broker.py`` implements it)."""

    def local_record(self, incarnation: str) -> MemberRecord: ...

    def topic_table(self) -> dict[str, int]: ...  # topic -> queue count (a master publishes)

    def topic_perms(self) -> dict[str, int]: ...  # topic -> RocketMQ perm (6: read|write)

    def act_as_master(self, state: GroupState) -> None: ...  # raises if it cannot

    def act_as_slave(self, state: GroupState) -> None: ...  # follow state's master

    def stand_by(self, reason: str) -> None: ...  # no master: refuse writes, keep serving reads

    def slave_acks(self) -> dict[int, int]: ...  # a master: slave id -> acked offset ({} else)


@dataclasses.dataclass
class ControllerStats:
    elections_won: int = 0
    elections_deferred: int = 0
    resignations: int = 0
    demotions: int = 0
    follows: int = 0
    sss_changes: int = 0
    sss_change_failures: int = 0
    session_losses: int = 0
    suspensions: int = 0
    fenced_writes: int = 0
    lease_lapses: int = 0  # a master's lease ran out while it was master, then was renewed
    switchovers: int = 0
    unclean_elections: int = 0
    pass_failures: int = 0  # parts of a pass that raised (each tried again at the next one)


@dataclasses.dataclass
class _Proposal:
    change: cc.SetChange
    based_on_epoch: int  # the state's syncStateSetEpoch it changes
    done: Callable[[bool, GroupState | None], None]


class Controller:
    """The kazoo driver of one broker (see the module docstring)."""

    def __init__(self, cfg: BrokerConfig, broker: ControlledBroker,
                 client_factory: Callable[..., Any] | None = None):
        self.cfg = cfg
        self.broker = broker
        self.member_id = cfg.brokerId
        hosts, chroot = parse_controller_addr(cfg.controllerAddr)
        self.hosts = hosts + chroot
        self.cluster_path = f"/replog/{cfg.brokerClusterName}"
        base = f"{self.cluster_path}/{cfg.brokerName}"
        self.state_path = f"{base}/state"
        self.members_path = f"{base}/brokers"
        self.member_path = f"{self.members_path}/{self.member_id}"
        self.switchover_path = f"{base}/switchover"
        self.session_s = cfg.controllerSessionTimeoutMs / 1000.0
        self.call_timeout_s = self.session_s / CALL_TIMEOUT_FRACTION
        self.poll_s = cfg.controllerPollIntervalMs / 1000.0
        self.incarnation = secrets.token_hex(8)
        self._digest = read_digest(cfg.controllerAuthFile) if cfg.controllerAuthFile else None
        self.stats = ControllerStats()
        self.lease = cc.Lease(cfg.controller_lease_ms)
        self._client_factory = client_factory
        self._zk: Any = None
        self._events: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # the fields below, read by status and the I/O thread
        self.state: GroupState | None = None
        self._state_version = -1
        self.members: dict[int, MemberRecord] = {}
        self.connected = False
        self._session: tuple[int, bytes] | None = None
        self._mastered: tuple[int, int] | None = None  # (session id, epoch) this process won
        self._following: tuple[str, int] | None = None  # (master HA address, epoch)
        self._no_master_reason = ""
        self._known_max_offset = 0
        self._proposal: _Proposal | None = None
        self._switchover_wait: threading.Event | None = None
        self._asked: tuple[int, int] | None = None  # switchover to this broker: (session, epoch)
        self.granted_session_ms = 0  # what ZooKeeper granted (0: not connected yet)
        # every group of brokerClusterName, which routes are answered from: the driver's
        # other half (common/broker/cluster_routes.py), its calls made through this thread's
        self.routes = ClusterRoutes(self.cluster_path, cfg.brokerName, self._call,
                                    self._on_cluster_watch)
        self._member_due = 0.0
        self._renew_due = 0.0
        self._poll_due = 0.0
        self._registered = False
        self._last_error = ""
        self._part_errors: dict[str, str] = {}  # part of the pass -> its last error
        # why this broker may not lead (it failed to take over), kept over restarts until an
        # operator clears it (``clear_fault``): published in its member record
        self._fault_path = cfg.store_root / "config" / FAULT_FILE
        self.fault = self._load_fault()

    # ---- the fault that keeps this member from standing -------------------------------------
    def _load_fault(self) -> str:
        try:
            return self._fault_path.read_text(encoding="utf-8", errors="replace")[:cc.MAX_FAULT_CHARS]
        except FileNotFoundError:
            return ""

    def _set_fault(self, reason: str) -> None:
        """This broker failed to take over: it stands in no election until ``clear_fault``
        (its record says so, so the others elect among themselves instead of waiting)."""
        self.fault = reason[:cc.MAX_FAULT_CHARS] or "failed to take over"
        try:
            self._fault_path.parent.mkdir(parents=True, exist_ok=True)
            write_atomically(self._fault_path, self.fault.encode())
        except OSError as e:
            log_event(log, "controller_fault_not_saved", logging.ERROR, error=str(e))
        log_event(log, "controller_fault_set", logging.ERROR, reason=self.fault,
                  clear="replog controller clear-fault, once the store is mended")
        self._member_due = 0.0  # published at once

    def clear_fault(self) -> str:
        """An operator says this broker may lead again; returns the fault it had."""
        had, self.fault = self.fault, ""
        self._fault_path.unlink(missing_ok=True)
        if had:
            log_event(log, "controller_fault_cleared", had=had)
        self._events.put(("watch", None))
        return had

    def _record(self) -> MemberRecord:
        record = self.broker.local_record(self.incarnation)
        return dataclasses.replace(record, fault=self.fault) if self.fault else record

    # ---- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        """Connect (in the background: a broker starts and serves reads without ZooKeeper)."""
        from kazoo.client import KazooClient
        from kazoo.retry import KazooRetry

        factory = self._client_factory or KazooClient
        auth: dict[str, Any] = {}
        if self._digest is not None:
            from kazoo.security import make_digest_acl

            user, password = self._digest
            auth = {"auth_data": [("digest", f"{user}:{password}")],
                    "default_acl": [make_digest_acl(user, password, all=True)]}
        self._zk = factory(
            hosts=self.hosts,
            timeout=self.session_s,
            handler=connect_capped_handler(self.session_s / max(1, self.hosts.count(",") + 1)),
            connection_retry=KazooRetry(max_tries=-1, delay=0.1, backoff=1.5, max_delay=1.0),
            command_retry=None,
            logger=_kazoo_logger(self._on_negotiated),
            **auth,
        )
        if self._digest is None:
            log_event(log, "controller_without_auth", logging.WARNING,
                      risk="anyone who reaches ZooKeeper can change this group's state or "
                           "delete its members' znodes", fix="set controllerAuthFile")
        self._zk.add_listener(self._on_connection)
        self._thread = threading.Thread(target=self._run, name="replog-controller", daemon=True)
        self._thread.start()
        self._zk.start_async()
        log_event(log, "controller_started", hosts=self.hosts, member=self.member_id,
                  session_ms=self.cfg.controllerSessionTimeoutMs,
                  lease_ms=self.cfg.controller_lease_ms)

    def stop(self) -> None:
        """Leave: the member znode goes with the session, so an election starts at once
        instead of a session timeout later (a clean shutdown is a switchover to the best)."""
        self._stop.set()
        self._events.put(("stop", None))
        if self._thread is not None:
            self._thread.join(STOP_JOIN_S)
        self.lease.expire()
        zk = self._zk
        if zk is not None:
            try:
                zk.stop()
                zk.close()
            except Exception as e:  # noqa: BLE001 - stopping: report, go on
                log_event(log, "controller_close_failed", logging.WARNING, error=repr(e))
        log_event(log, "controller_stopped")

    # ---- what other threads ask ------------------------------------------------------------
    def is_master(self) -> bool:
        mastered = self._mastered
        return mastered is not None

    def write_refusal(self) -> str:
        """"" while this broker may acknowledge writes; else why not (the remark of a
        SERVICE_NOT_AVAILABLE). Called on the I/O thread for every write: no lock, no call."""
        if self._mastered is None:
            return self._not_master_remark()
        if not self.lease.fresh(time.monotonic()):
            self.stats.fenced_writes += 1
            return ("this master's controller lease is not fresh (ZooKeeper unreachable, or "
                    "the session was suspended): writes are fenced until it is confirmed"
                    + self._newer_master_hint())
        if self._switchover_wait is not None:
            self.stats.fenced_writes += 1
            return "a switchover is under way: writes pause until the new master answers"
        return ""

    def topics_changed(self) -> None:
        """A topic was made or grown here: publish it (routes) on the next pass, not a poll
        interval later."""
        self._events.put(("watch", None))

    def stale_master_seen(self, epoch: int) -> None:
        """The HA service met a slave of a newer epoch: this master was replaced. Writes stop
        now; the state is read at once (the demotion follows from it)."""
        mastered = self._mastered
        if mastered is not None and epoch > mastered[1]:
            self._lose_mastership(f"a slave follows epoch {epoch}")
        self._events.put(("watch", None))

    def acknowledge_ok(self) -> bool:
        """Whether a SEND_OK may still leave now (the last check, right before the answer)."""
        return self._mastered is not None and self.lease.fresh(time.monotonic())

    def committed_sync_state_set(self) -> tuple[frozenset[int], int] | None:
        state = self.state
        if state is None or state.master != self.member_id:
            return None
        return state.sync_state_set, state.sync_state_set_epoch

    def propose(self, change: cc.SetChange, based_on_epoch: int,
                done: Callable[[bool, GroupState | None], None]) -> None:
        """The HA service (I/O thread) asks for a SyncStateSet change; ``done(ok, state)`` is
        called on this thread once it is committed or refused."""
        self._events.put(("propose", _Proposal(change, based_on_epoch, done)))

    def request_switchover(self, target: int, timeout_s: float) -> GroupState | None:
        """Ask the master to hand over to member ``target`` (``replog promote`` in controller
        mode); returns the new state once ``target`` is named master, None on timeout."""
        done = threading.Event()
        self._events.put(("switchover_request", (target, done)))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            state = self.state
            if state is not None and state.master == target and done.is_set():
                return state
            self._stop.wait(0.05)
            if self._stop.is_set():
                break
        return None

    def cluster_view(self) -> dict[str, GroupView]:
        """Every broker group of this cluster as last read from ZooKeeper (routes)."""
        return self.routes.view()

    def status(self) -> dict[str, Any]:
        with self._lock:
            state = self.state
            members = {str(m): r.to_json() for m, r in sorted(self.members.items())}
        age = self.lease.age_s(time.monotonic())
        return {
            "enabled": True,
            "address": self.hosts,
            "connected": self.connected,
            "memberId": self.member_id,
            "isMaster": self._mastered is not None,
            "leaseFresh": self._mastered is not None and self.lease.fresh(time.monotonic()),
            "leaseAgeMs": None if age is None else round(age * 1000),
            "leaseMs": round(self.lease.duration_s * 1000),
            "sessionMs": self.granted_session_ms,
            "masterId": state.master if state else None,
            "masterEpoch": state.master_epoch if state else 0,
            "masterAddress": state.master_address if state else "",
            "syncStateSet": sorted(state.sync_state_set) if state else [],
            "syncStateSetEpoch": state.sync_state_set_epoch if state else 0,
            "noMasterReason": self._no_master_reason,
            "members": members,
            "lastError": self._last_error,
            "fault": self.fault,  # why this broker may not lead ("": it may)
            "stats": dataclasses.asdict(self.stats),
        }

    def _on_negotiated(self, session_ms: int) -> None:
        """ZooKeeper grants a session between 2 and 20 of its tickTimes: one shorter than
        asked would let it expire the session while the lease still runs, so the lease
        shrinks to half of what was granted (kazoo's connection thread; a plain assignment)."""
        self.granted_session_ms = session_ms
        if session_ms < self.cfg.controllerSessionTimeoutMs:
            lease_ms = min(self.cfg.controller_lease_ms, session_ms // 2)
            self.lease.duration_s = min(self.lease.duration_s, lease_ms / 1000.0)
            log_event(log, "controller_session_shortened", logging.ERROR, asked_ms=(
                self.cfg.controllerSessionTimeoutMs), granted_ms=session_ms, lease_ms=lease_ms,
                fix="raise the servers' maxSessionTimeout (20 tickTimes) or lower "
                    "controllerSessionTimeoutMs")

    # ---- kazoo callbacks (kazoo's threads: post, never call) ---------------------------------
    def _on_connection(self, state: str) -> None:
        if state != "CONNECTED":
            self.lease.expire()  # fence first: no ZooKeeper call may run here
            self.connected = False
        self._events.put(("connection", state))

    def _on_watch(self, *_args: Any) -> None:
        self._events.put(("watch", None))

    def _on_cluster_watch(self, *_args: Any) -> None:
        """Another group's ``state`` or ``topics`` changed: only the cluster view is read."""
        self._events.put(("cluster", None))

    # ---- the controller thread -------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                kind, payload = self._events.get(timeout=TICK_S)
            except queue.Empty:
                kind, payload = "tick", None
            try:
                self._handle(kind, payload)
            except Exception as e:  # noqa: BLE001 - a ZooKeeper or role error: retry next pass
                self._last_error = repr(e)
                log_event(log, "controller_pass_failed", logging.WARNING, during=kind,
                          error=repr(e))
                self._poll_due = 0.0
                self._stop.wait(0.2)

    def _handle(self, kind: str, payload: Any) -> None:
        if kind == "stop":
            return
        if kind == "connection":
            self._on_connection_change(payload)
        elif kind == "propose":
            self._proposal = payload
        elif kind == "switchover_request":
            self._ask_switchover(*payload)
        elif kind == "watch":
            self._poll_due = 0.0
        elif kind == "member_gone":
            self._member_node_gone()
        elif kind == "cluster" and self.connected and self._registered:
            self._read_cluster()
            return
        if not self.connected:
            return
        self._renew_lease()
        now = time.monotonic()
        if not self._registered or now >= self._member_due:
            self._publish_member()
        if not self._registered:
            return  # not a member (its id is taken, or a new session): decide nothing
        # Each part on its own: one that fails (a ZooKeeper call timing out, a record that
        # cannot be written) is logged and tried again next pass, and never keeps the others
        # from running (a SyncStateSet change must go through whatever the routes do).
        failed = False
        if now >= self._poll_due or kind in ("connection", "watch"):
            self._poll_due = time.monotonic() + self.poll_s
            failed |= not self._part("group", self._read_and_reconcile)
            if self._mastered is not None:
                failed |= not self._part("topics", self._publish_topics)
            failed |= not self._part("cluster", self._read_cluster)
        if self._proposal is not None:
            failed |= not self._part("proposal", self._carry_out_proposal)
        if self._mastered is not None:
            failed |= not self._part("switchover", self._maybe_switch_over)
        if failed:
            self._poll_due = 0.0  # read everything again at the next pass
            self._stop.wait(0.2)

    def _read_and_reconcile(self) -> None:
        self._read_group()
        if self.member_id not in self.members:
            self._member_node_gone()
            return
        self._reconcile()

    def _member_node_gone(self) -> None:
        """``brokers/<id>`` is gone while this session lives (deleted by someone else): the
        others see no such member, and may elect another master. A master stops at once;
        then it registers again, as a member like any other."""
        if self._mastered is not None:
            self._lose_mastership("its member znode was deleted")
            self.broker.stand_by("its member znode was deleted: registering again")
        self._registered = False

    def _part(self, name: str, run: Callable[[], None]) -> bool:
        """Run one part of a pass; False (logged when its error changes) if it raised."""
        try:
            run()
        except Exception as e:  # noqa: BLE001 - a ZooKeeper or role error: next pass
            error = repr(e)
            self._last_error = f"{name}: {error}"
            if self._part_errors.get(name) != error:
                log_event(log, "controller_pass_failed", logging.WARNING, part=name,
                          error=error)
            self._part_errors[name] = error
            self.stats.pass_failures += 1
            return False
        if self._part_errors.pop(name, None) is not None:
            log_event(log, "controller_part_recovered", part=name)
        return True

    def _on_connection_change(self, state: str) -> None:
        zk = self._zk
        if state == "CONNECTED":
            client_id = zk.client_id
            if client_id != self._session:
                if self._session is not None:
                    self.stats.session_losses += 1
                self._session = client_id
                self._registered = False
                if self._mastered is not None and self._mastered[0] != client_id[0]:
                    self._lose_mastership("the ZooKeeper session was lost (expired)")
            self.connected = True
            log_event(log, "controller_connected", session=hex(client_id[0]) if client_id else "")
            return
        self.connected = False
        if state == "SUSPENDED":
            self.stats.suspensions += 1
            log_event(log, "controller_suspended", logging.WARNING,
                      master=self._mastered is not None)
        else:  # LOST: the session is gone; this broker leads no more, whatever state says
            self.stats.session_losses += 1
            self._session = None
            self._registered = False
            if self._mastered is not None:
                self._lose_mastership("the ZooKeeper session expired (LOST)")
            log_event(log, "controller_session_lost", logging.WARNING)

    def _lose_mastership(self, reason: str) -> None:
        self._mastered = None
        self.lease.expire()
        log_event(log, "controller_master_fenced", logging.WARNING, reason=reason)

    # -- ZooKeeper calls ----------------------------------------------------------------------
    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        self._renew_lease()  # a due renewal goes first: a long pass must not starve it
        return getattr(self._zk, method + "_async")(*args, **kwargs).get(
            timeout=self.call_timeout_s)

    def _renew_lease(self) -> None:
        """A master whose renewal is due writes its member record and goes on: the answer
        confirms the lease on kazoo's callback thread (``_renewed``). Due every third of the
        lease, counted from when the last one was sent, so the lease lapses only if ZooKeeper
        (or this process) takes two thirds of it to answer."""
        mastered, session = self._mastered, self._session
        if mastered is None or session is None or not self._registered or not self.connected:
            return
        if time.monotonic() < self._renew_due:
            return
        raw = self._record().to_bytes()
        generation = self.lease.generation
        sent_at = time.monotonic()
        self._renew_due = sent_at + self.lease.duration_s / RENEWALS_PER_LEASE
        self._member_due = sent_at + MEMBER_REFRESH_S
        self._zk.set_async(self.member_path, raw).rawlink(
            lambda result: self._renewed(result, session, mastered, generation, sent_at))

    def _renewed(self, result: Any, session: tuple[int, bytes], mastered: tuple[int, int],
                 generation: int, sent_at: float) -> None:
        """kazoo's callback thread: a renewal's answer. Confirms the lease if this broker is
        still the master it was, in the same session, with no suspension since it was sent;
        posts an event (never a call) when the member znode is gone."""
        from kazoo.exceptions import NoNodeError

        try:
            result.get_nowait()
        except NoNodeError:
            self._events.put(("member_gone", None))
            return
        except Exception:  # noqa: BLE001 - a connection loss: the listener fences, not this
            return
        if self._mastered != mastered or self._zk.client_id != session or not self.connected:
            return
        now = time.monotonic()
        age = self.lease.age_s(now)
        if self.lease.confirm(sent_at, generation) and age is not None and \
                age >= self.lease.duration_s:
            self.stats.lease_lapses += 1
            log_event(log, "controller_lease_lapsed", logging.WARNING,
                      stale_ms=round((age - self.lease.duration_s) * 1000),
                      write_ms=round((now - sent_at) * 1000),
                      lease_ms=round(self.lease.duration_s * 1000))

    def _publish_member(self) -> None:
        """Create or refresh ``brokers/<id>``; a write that succeeds renews the lease."""
        from kazoo.exceptions import NodeExistsError, NoNodeError

        record = self._record()
        raw = record.to_bytes()
        session = self._session
        generation = self.lease.generation
        sent_at = time.monotonic()
        if not self._registered:
            try:
                self._call("create", self.member_path, raw, ephemeral=True, makepath=True)
            except NodeExistsError:
                self._claim_member_node(record)
                return
            self._registered = True
            self._watch_group()
            log_event(log, "controller_registered", member=self.member_id,
                      role=record.role, maxOffset=record.max_offset)
        else:
            try:
                self._call("set", self.member_path, raw)
            except NoNodeError:
                self._member_node_gone()
                return
        if self._mastered is not None and session is not None and \
                self._zk.client_id == session and self._mastered[0] == session[0] and \
                self.lease.confirm(sent_at, generation):
            self._renew_due = sent_at + self.lease.duration_s / RENEWALS_PER_LEASE
        self._member_due = time.monotonic() + MEMBER_REFRESH_S

    def _claim_member_node(self, record: MemberRecord) -> None:
        """``brokers/<id>`` exists: our own from a session that died with an earlier process
        (same address: it is ours, delete it now rather than wait out its timeout), or another
        broker configured with the same id (refuse loudly; it keeps its node)."""
        from kazoo.exceptions import NoNodeError

        try:
            raw, stat = self._call("get", self.member_path)
        except NoNodeError:
            return
        try:
            other = MemberRecord.from_bytes(raw)
        except cc.RecordError:
            other = None
        session = self._session
        if session is not None and stat.ephemeralOwner == session[0]:
            self._registered = True  # ours already (a create retried after ConnectionLoss)
            return
        # Our own node from an earlier process of this very store (the store's lock lets
        # only one process hold it, so that process is dead): deleted now rather than a
        # session timeout later. Another store at the same address (a DNS alias, a recreated
        # pod) may be live: its node stays until its session ends.
        if other is not None and other.store_id and other.store_id == record.store_id and \
                other.incarnation != self.incarnation:
            log_event(log, "controller_stale_member_removed", member=self.member_id,
                      owner=hex(stat.ephemeralOwner))
            try:
                self._call("delete", self.member_path, version=stat.version)
            except NoNodeError:
                pass
            return
        self._last_error = (f"member id {self.member_id} is registered by another broker "
                            f"({other.address if other else 'unreadable record'}, store "
                            f"{other.store_id if other else '?'}): waiting for its session "
                            "to end")
        log_event(log, "controller_member_id_taken", logging.ERROR, member=self.member_id,
                  other=other.address if other else "?")
        self._member_due = time.monotonic() + MEMBER_REFRESH_S

    def _watch_group(self) -> None:
        """Watches on ``state`` and the members; they fire once each and are set again on
        every read. The poll covers a watch lost with a connection."""
        self._poll_due = 0.0

    def _read_group(self) -> None:
        from kazoo.exceptions import NoNodeError

        try:
            raw, stat = self._call("get", self.state_path, watch=self._on_watch)
            state: GroupState | None = GroupState.from_bytes(raw)
            version = stat.version
        except NoNodeError:
            self._call("exists", self.state_path, watch=self._on_watch)
            state, version = None, -1
        except cc.RecordError as e:
            self._last_error = f"state znode unreadable: {e}"
            log_event(log, "controller_state_unreadable", logging.ERROR, error=str(e))
            raise
        try:
            names = self._call("get_children", self.members_path, watch=self._on_watch)
        except NoNodeError:
            names = []
        members: dict[int, MemberRecord] = {}
        for name in names:
            if not name.isdigit():
                continue
            try:
                raw, _ = self._call("get", f"{self.members_path}/{name}")
                record = MemberRecord.from_bytes(raw)
            except NoNodeError:
                continue
            except cc.RecordError as e:
                log_event(log, "controller_member_unreadable", logging.WARNING, member=name,
                          error=str(e))
                continue
            members[record.member_id] = record
            self._known_max_offset = max(self._known_max_offset, record.max_offset)
        with self._lock:
            self.state, self._state_version, self.members = state, version, members

    def _publish_topics(self) -> None:
        self.routes.publish_topics(self.broker.topic_table(), self.broker.topic_perms())

    def _read_cluster(self) -> None:
        with self._lock:
            state, members = self.state, dict(self.members)
        self.routes.read(state, members)

    def _cas_state(self, new: GroupState) -> bool:
        """Compare-and-set ``state`` from the version read last; True if it is now ``new``.

        Whatever the answer (done, a version conflict, a lost connection), ``state`` is read
        again and compared: a conflict may be this very write, applied by an earlier try
        whose call timed out on this side (the version it was based on is then gone), and a
        lost connection leaves the outcome unknown. ``new`` names this broker's own epoch or
        set epoch, so a state equal to it is this controller's write."""
        from kazoo.exceptions import BadVersionError, ConnectionLoss, NodeExistsError

        raw = new.to_bytes()
        try:
            if self._state_version < 0:
                self._call("create", self.state_path, raw, makepath=True)
            else:
                self._call("set", self.state_path, raw, version=self._state_version)
        except (BadVersionError, NodeExistsError, ConnectionLoss):
            pass
        self._read_group()
        return self.state == new

    # -- decisions ------------------------------------------------------------------------------
    def _reconcile(self) -> None:
        state = self.state
        me = self.member_id
        if self._mastered is not None:
            if state is None or state.master != me or state.master_epoch != self._mastered[1]:
                self._demote(state)
            return
        if state is not None and state.master == me and self._handed_over(state):
            # the master handed the group over, as this broker asked in this session
            self._mastered = (self._session[0], state.master_epoch)  # type: ignore[index]
            self._asked = None
            self.lease.expire()
            self.stats.elections_won += 1
            log_event(log, "controller_took_over", epoch=state.master_epoch, member=me)
            self._serve_as_master(state)
            return
        if state is not None and state.master == me:
            # named master by a session this process never won in (an earlier process, or a
            # session that expired): give the claim up, then elect like everyone else
            if self._cas_state(state.without_master()):
                self.stats.resignations += 1
                log_event(log, "controller_resigned", epoch=state.master_epoch,
                          reason="this process did not win the claim")
            state = self.state
        if state is not None and state.master is not None and state.master in self.members:
            self._no_master_reason = ""
            self._follow(state)
            return
        self._elect()

    def _handed_over(self, state: GroupState) -> bool:
        """The state names this broker master because the master handed over as this broker
        asked, in this very session (a switchover), not an earlier process's claim."""
        asked, session = self._asked, self._session
        return (asked is not None and session is not None and asked[0] == session[0]
                and state.master_epoch > asked[1])

    def _elect(self) -> None:
        # publish the offsets we would be ranked by, then rank on what everyone published
        self._publish_member()
        if self._stop.wait(ELECTION_SETTLE_S):
            return
        self._read_group()
        state = self.state
        if state is not None and state.master is not None and state.master in self.members:
            self._follow(state)
            return
        decision = cc.decide_election(state, self.members, self.member_id,
                                      self.cfg.enableElectUncleanMaster, self._known_max_offset)
        if isinstance(decision, cc.NoMaster):
            if decision.reason != self._no_master_reason:
                log_event(log, "controller_no_master", logging.ERROR, reason=decision.reason)
            self._no_master_reason = decision.reason
            self.broker.stand_by(decision.reason)
            return
        if isinstance(decision, cc.Defer):
            self.stats.elections_deferred += 1
            self._no_master_reason = f"waiting for member {decision.to} to take over"
            self._poll_due = min(self._poll_due, time.monotonic() + 0.2)
            return
        if not isinstance(decision, cc.Elect):
            return
        session = self._session
        before = state
        if session is None or not self._cas_state(decision.state):
            return
        self._mastered = (session[0], decision.state.master_epoch)
        self.lease.expire()
        self._no_master_reason = ""
        self.stats.elections_won += 1
        if decision.unclean:
            self.stats.unclean_elections += 1
            log_event(log, "controller_unclean_election", logging.ERROR,
                      epoch=decision.state.master_epoch, lost_from=decision.lost_from,
                      lost_to=decision.lost_to,
                      lost_bytes=decision.lost_to - decision.lost_from)
        log_event(log, "controller_elected", epoch=decision.state.master_epoch,
                  member=self.member_id, unclean=decision.unclean)
        self._serve_as_master(decision.state, before)

    def _serve_as_master(self, state: GroupState, before: GroupState | None = None) -> None:
        """Take the group as the master ``state`` names; on failure stand aside for good
        (``_set_fault``) and give the group back: no master, and the set it had before this
        term as well (nothing was acknowledged in a term that never began, so every member of
        the old set still holds everything: a healthy one can be elected)."""
        try:
            self.broker.act_as_master(state)
        except Exception as e:  # noqa: BLE001 - could not serve: let another member lead
            log_event(log, "controller_promotion_failed", logging.ERROR, error=repr(e))
            self._mastered = None
            self.lease.expire()
            self._set_fault(f"failed to take over as master: {e!r}")
            self._publish_member()  # the others see it before they look for a new master
            resigned = state.without_master()
            if before is not None and not before.sync_state_set <= state.sync_state_set:
                resigned = resigned.with_sync_state_set(
                    state.sync_state_set | before.sync_state_set, before.stores)
            if self._cas_state(resigned):
                self.stats.resignations += 1
            return
        self._following = None
        self._publish_member()  # renews the lease: writes open

    def _demote(self, state: GroupState | None) -> None:
        self._lose_mastership("the state names another master"
                              if state is not None and state.master is not None
                              else "the state names no master")
        self.stats.demotions += 1
        if state is not None and state.master is not None and state.master in self.members:
            self._follow(state)
        else:
            self.broker.stand_by("this broker is no longer the master")

    def _follow(self, state: GroupState) -> None:
        target = (state.master_ha_address, state.master_epoch)
        if self._following == target:
            return
        log_event(log, "controller_follows", master=state.master, epoch=state.master_epoch,
                  ha=state.master_ha_address)
        self.broker.act_as_slave(state)
        self._following = target
        self.stats.follows += 1

    def _not_master_remark(self) -> str:
        state = self.state
        if state is not None and state.master is not None and state.master != self.member_id:
            return (f"member {self.member_id} is not the master: the controller names member "
                    f"{state.master} at {state.master_address} (epoch {state.master_epoch})")
        reason = self._no_master_reason or "no master is elected yet"
        return f"member {self.member_id} is not the master: {reason}"

    def _newer_master_hint(self) -> str:
        state = self.state
        if state is not None and state.master not in (None, self.member_id):
            return f"; the newer master is member {state.master} at {state.master_address}"
        return ""

    # -- the SyncStateSet (proposed by the master's HA service) --------------------------------
    def _carry_out_proposal(self) -> None:
        """Compare-and-set the proposed SyncStateSet, and answer the HA service.

        A ZooKeeper call that fails here (a time-out, an expired session) leaves the outcome
        unknown: the proposal is kept and tried again at the next pass, after the group is read
        again (``_run`` makes the next pass read it). Found committed by then (this master's
        set, one epoch on, with the proposed members: only the master changes its set), it is
        answered committed. So the HA service, which proposes one change at a time and counts
        acks against both sets meanwhile, is always answered, and never told "not committed"
        about a set that ZooKeeper holds."""
        proposal, self._proposal = self._proposal, None
        assert proposal is not None
        state = self.state
        ok = False
        if self._mastered is not None and state is not None and state.master == self.member_id:
            if state.sync_state_set_epoch == proposal.based_on_epoch:
                joining = {m: self.members[m].store_id for m in proposal.change.added
                           if m in self.members}
                try:
                    ok = self._cas_state(state.with_sync_state_set(proposal.change.members,
                                                                   joining))
                except Exception:
                    self._proposal = proposal  # outcome unknown: find out at the next pass
                    raise
            elif (state.sync_state_set_epoch == proposal.based_on_epoch + 1
                  and state.sync_state_set == proposal.change.members):
                ok = True  # an earlier try committed it; its answer was lost
        if ok:
            self.stats.sss_changes += 1
            log_event(log, "controller_sync_state_set", members=sorted(proposal.change.members),
                      epoch=self.state.sync_state_set_epoch if self.state else -1,
                      reason=proposal.change.reason)
        else:
            self.stats.sss_change_failures += 1
        proposal.done(ok, self.state)

    # -- switchover ---------------------------------------------------------------------------
    def _ask_switchover(self, target: int, done: threading.Event) -> None:
        from kazoo.exceptions import NodeExistsError

        if not self.connected:
            return
        raw = Switchover(target, int(time.time() * 1000)).to_bytes()
        state, session = self.state, self._session
        if target == self.member_id and session is not None:
            # the state that will name this broker is the master's doing: take it then
            self._asked = (session[0], state.master_epoch if state is not None else 0)
        try:
            self._call("create", self.switchover_path, raw, makepath=True)
        except NodeExistsError:
            self._call("set", self.switchover_path, raw)
        done.set()
        log_event(log, "controller_switchover_asked", target=target)

    def _maybe_switch_over(self) -> None:
        from kazoo.exceptions import NoNodeError

        try:
            raw, stat = self._call("get", self.switchover_path)
        except NoNodeError:
            return
        try:
            ask = Switchover.from_bytes(raw)
        except cc.RecordError as e:
            log_event(log, "controller_switchover_unreadable", logging.ERROR, error=str(e))
            self._call("delete", self.switchover_path)
            return
        self._switch_over(ask, stat.version)

    def _switch_over(self, ask: Switchover, version: int) -> None:
        """Planned handover: fence writes, wait (bounded) until the target holds everything,
        then name it master with a new epoch in one transaction that also removes the ask."""
        state = self.state
        target = self.members.get(ask.target)
        problem = ""
        if state is None or target is None:
            problem = f"member {ask.target} is not live"
        elif ask.target not in state.sync_state_set:
            problem = (f"member {ask.target} is not in the SyncStateSet "
                       f"{sorted(state.sync_state_set)}")
        elif ask.target == self.member_id:
            problem = "it is the master already"
        elif target.fault:
            problem = f"member {ask.target} failed to take over before ({target.fault})"
        if problem:
            log_event(log, "controller_switchover_refused", logging.WARNING, target=ask.target,
                      reason=problem)
            self._delete_switchover(version)
            return
        assert state is not None
        self._switchover_wait = threading.Event()  # write_refusal: writes pause from here
        started = time.monotonic()
        deadline = started + self.cfg.switchoverTimeoutMs / 1000.0
        try:
            held = self.broker.local_record(self.incarnation).max_offset
            caught_up = False
            while time.monotonic() < deadline and not self._stop.is_set():
                acked = self._target_ack(ask.target)
                if acked is not None and acked >= held:
                    caught_up = True
                    break
                self._stop.wait(0.01)
            if not caught_up:
                log_event(log, "controller_switchover_aborted", logging.WARNING,
                          target=ask.target, held=held, waited_ms=round(
                              (time.monotonic() - started) * 1000))
                self._delete_switchover(version)
                return
            record = self.members[ask.target]
            epoch = cc.ep.next_epoch(max(state.master_epoch, record.last_epoch), ask.target)
            # every member holds all that was acknowledged, and this master, fenced, holds no
            # more than the target: the set stays whole (an election shrinks it to the winner)
            new = GroupState(ask.target, epoch, record.address, record.ha_address,
                             state.sync_state_set, state.sync_state_set_epoch + 1)
            if self._commit_switchover(new, version):
                self.stats.switchovers += 1
                log_event(log, "controller_switchover", target=ask.target, epoch=epoch,
                          paused_ms=round((time.monotonic() - started) * 1000))
                self._demote(self.state)
        finally:
            self._switchover_wait = None

    def _target_ack(self, target: int) -> int | None:
        return self.broker.slave_acks().get(target)

    def _commit_switchover(self, new: GroupState, switchover_version: int) -> bool:
        """``state`` compare-and-set and the ask's removal in one transaction; every result is
        inspected (a failed check does not raise in kazoo)."""
        from kazoo.exceptions import ConnectionLoss

        tx = self._zk.transaction()
        tx.set_data(self.state_path, new.to_bytes(), version=self._state_version)
        tx.delete(self.switchover_path, version=switchover_version)
        try:
            results = tx.commit_async().get(timeout=self.call_timeout_s)
        except ConnectionLoss:
            self._read_group()
            return self.state == new
        failed = [r for r in results if isinstance(r, Exception)]
        self._read_group()
        if failed:
            log_event(log, "controller_switchover_conflict", logging.WARNING,
                      errors=[type(r).__name__ for r in failed])
            return False
        return self.state == new

    def _delete_switchover(self, version: int) -> None:
        from kazoo.exceptions import BadVersionError, NoNodeError

        try:
            self._call("delete", self.switchover_path, version=version)
        except (NoNodeError, BadVersionError):
            pass


def read_digest(path: str) -> tuple[str, str]:
    """``controllerAuthFile``: one line ``user:password`` (ZooKeeper's digest scheme), in a
    file only its owner may read; ValueError naming the file otherwise (the broker refuses to
    start)."""
    import os
    import stat

    try:
        mode = os.stat(path).st_mode
        text = open(path, encoding="utf-8").read(4096).strip()  # noqa: SIM115 - read at once
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"controllerAuthFile {path}: cannot read it: {e}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ValueError(f"controllerAuthFile {path}: others may read it (chmod 600)")
    user, sep, password = text.partition(":")
    if not sep or not user or not password or "\n" in text:
        raise ValueError(f"controllerAuthFile {path}: expected one line user:password")
    return user, password


def connect_capped_handler(connect_s: float) -> Any:
    """kazoo's threading handler, whose TCP connect to a server gives up after ``connect_s``
    (the session timeout over the number of servers, the Java client's connectTimeout).

    kazoo itself waits a whole session timeout for the TCP connect, though its handshake then
    waits only session / servers. A server that is down with no host at its address answers
    nothing (the SYN is lost, no reset comes back), so a reconnect that tries it first waited
    4 s of a 4 s session: past the 2 s lease, so a master cut off by the ZooKeeper leader's loss
    refused writes for seconds after the ensemble had already elected a new leader (measured in
    the compose cluster: 4.1-4.7 s write pauses, the kazoo connect to the dead node's address
    spanning 4.0 s of them)."""
    from kazoo.handlers.threading import SequentialThreadingHandler

    class ConnectCappedHandler(SequentialThreadingHandler):  # type: ignore[misc]
        def create_connection(self, *args: Any, **kwargs: Any) -> Any:
            timeout = kwargs.get("timeout")
            if timeout is not None and timeout > connect_s:
                kwargs["timeout"] = connect_s
            return super().create_connection(*args, **kwargs)

    return ConnectCappedHandler()


class _KazooLog(logging.Handler):
    """kazoo logs the session timeout ZooKeeper granted only at its BLATHER level: take it from
    there, and hand kazoo's INFO and above to the usual ``kazoo.client`` logger."""

    def __init__(self, on_session: Callable[[int], None]):
        super().__init__(level=1)
        self.on_session = on_session

    def emit(self, record: logging.LogRecord) -> None:
        msg = str(record.msg)
        if msg.startswith("Session created") and isinstance(record.args, tuple) \
                and len(record.args) >= 3:
            try:
                self.on_session(int(record.args[2]))  # type: ignore[call-overload]
            except (TypeError, ValueError):
                pass
        elif record.levelno >= logging.INFO:
            logging.getLogger("kazoo.client").handle(record)


def _kazoo_logger(on_session: Callable[[int], None]) -> logging.Logger:
    logger = logging.getLogger(f"replog.kazoo.{secrets.token_hex(4)}")
    logger.setLevel(1)
    logger.propagate = False
    logger.addHandler(_KazooLog(on_session))
    return logger
