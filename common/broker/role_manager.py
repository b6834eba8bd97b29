"""The role manager: the one sequence by which a broker changes role, and the running role.

Every change goes through ``become_master`` or ``follow`` (and the first role through
``start``), under one lock, in one order:

1. **stop** the current role (a slave's replication ends, a master's HA service closes);
2. **fence** the store against replication (to a master only: an HA client whose stop timed
   out, a thread stalled on the disk, can append nothing more, neither log bytes nor epochs);
3. **become** a master's or a slave's store (a master's indexes everything replicated and
   continues the queue offsets past it; every queue it holds becomes a routed topic);
4. **epoch** (to a master only): the term opens at the log's end, in the epoch history;
5. **start** the new role (its HA service binds the HA port, which a slave keeps held while
   it has no listener there: ``common/broker/port_hold.py``).

The store becomes a master's before the epoch is written: a store that cannot (a corrupt
record it cannot index) opens no term. A master role that fails to start undoes the change:
the epoch history goes back to what it was (a slave that offered a master an epoch no master
held would be told to truncate what it shares with it), a promotion record is forgotten, and
the broker is a slave again, following what it followed before (nothing, standing by, if it
was a master). The caller learns why from the exception.

The running role is state of its own (``RoleState``): the configuration is frozen after
load, and each role object is built with ``RoleState.view(cfg)``, the loaded configuration
with the running role's name, id and master, a copy of its own.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable
from typing import Any, Protocol

from common.broker.port_hold import PortHold
from common.core.config import BrokerConfig
from common.core.logs import log_event
from common.format.protocol import Request, Response
from common.ha import epochs, promotion
from common.store.api import Store

log = logging.getLogger("replog.broker")

MASTER_ROLES = ("SYNC_MASTER", "ASYNC_MASTER")


class Role(Protocol):
    """What a broker's current role does (``master/role.py``, ``slave/role.py``)."""

    @property
    def name(self) -> str: ...  # SYNC_MASTER | ASYNC_MASTER | SLAVE

    # False: a slave's HA client did not stop in time (the store's fence keeps it out)
    replication_stopped: bool

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def refusal(self, req: Request) -> Response | None: ...  # a write refused now, or None

    def status_fields(self) -> dict[str, Any]: ...  # masterAddress, slaves

    def slave_acks(self) -> dict[int, int]: ...  # a master: slave id -> acked offset

    def replicating(self) -> bool: ...  # a slave: bytes arrive from its master now

    def require_epoch(self, epoch: int) -> None: ...  # a slave: follow only that term's master


@dataclasses.dataclass(frozen=True)
class RoleState:
    """The running role: what this broker is now, whatever its file said at load."""

    name: str  # SYNC_MASTER | ASYNC_MASTER | SLAVE
    broker_id: int
    master_ha_address: str = ""  # a slave's master ("" on a master, or a slave standing by)

    @property
    def is_master(self) -> bool:
        return self.name in MASTER_ROLES

    def view(self, cfg: BrokerConfig) -> BrokerConfig:
        """``cfg`` as this role runs it: the running name, id and master in a frozen copy."""
        return dataclasses.replace(cfg, brokerRole=self.name, brokerId=self.broker_id,
                                   haMasterAddress=self.master_ha_address)


RoleFactory = Callable[[RoleState], Role]
OpenTerm = Callable[[epochs.EpochHistory, int], epochs.EpochHistory]  # history, log end


class RoleManager:
    def __init__(self, cfg: BrokerConfig, store: Store, factory: RoleFactory,
                 on_master_store: Callable[[], None]):
        """``factory`` builds a role for a state; ``on_master_store`` runs once the store is
        a master's (the broker routes every queue the store holds)."""
        self.cfg = cfg
        self.store = store
        self.factory = factory
        self._on_master_store = on_master_store
        self.lock = threading.RLock()  # one change at a time (the controller's thread, PROMOTE)
        self.state = RoleState(cfg.brokerRole, cfg.brokerId, cfg.haMasterAddress)
        self.role: Role | None = None
        self._port_hold: PortHold | None = None
        self.changes = 0

    # ---- the sequence -------------------------------------------------------------------------
    def start(self, state: RoleState) -> Role:
        """The first role: a master resumes its term (no new epoch), a slave its replication."""
        with self.lock:
            if state.is_master:
                self._become_master_store()
            else:
                # held from the start: a broker whose HA port is taken does not start
                self._port_hold = PortHold(self.cfg.ha_bind_host, self.cfg.ha_port)
                self.store.become_slave()
            role = self.factory(state)
            role.start()
            self.role, self.state = role, state
            return role

    def become_master(self, name: str, open_term: OpenTerm,
                      record_term: Callable[[epochs.EpochHistory], None] | None = None) -> Role:
        """Stop, fence, become a master's store, open the term (``open_term`` returns the
        history to save, given the one truncated at the log's end; ``record_term`` is told
        the saved one), start ``name``. On a failure the broker is a slave again (see the
        module) and the exception is raised."""
        if name not in MASTER_ROLES:
            raise ValueError(f"not a master role: {name}")
        with self.lock:
            before = self.state
            current = self._stop_current()
            self.store.fence_replication()
            if current is not None and not current.replication_stopped:
                log_event(log, "promotion_with_stuck_replication", logging.ERROR,
                          action="fenced: its late writes are refused")
            root = self.cfg.store_root
            history_before: epochs.EpochHistory | None = None
            target = dataclasses.replace(before, name=name, master_ha_address="")
            role: Role | None = None
            try:
                root.mkdir(parents=True, exist_ok=True)
                history_before = epochs.load(root)
                self._become_master_store()
                max_phy = int(self.store.max_phy_offset)
                history = open_term(epochs.truncate_beyond(history_before, max_phy), max_phy)
                epochs.save(root, history)
                if record_term is not None:
                    record_term(history)
                role = self.factory(target)
                self._release_port()  # the HA service binds it now
                role.start()
            except Exception:
                follow = before.master_ha_address if not before.is_master else ""
                self._fall_back(role, history_before, dataclasses.replace(
                    before, name="SLAVE", master_ha_address=follow))
                raise
            self.role, self.state = role, target
            self.changes += 1
            return role

    def follow(self, master_ha_address: str, broker_id: int | None = None,
               epoch: int | None = None) -> Role:
        """Stop, become a slave's store (from a master), start a slave of ``master_ha_address``
        ("": standing by, nothing to follow), replicating only from ``epoch``'s master."""
        with self.lock:
            current = self._stop_current()
            if current is not None and self.state.is_master:
                self.store.become_slave()
            target = RoleState("SLAVE", self.state.broker_id if broker_id is None else broker_id,
                               master_ha_address)
            self._hold_port()
            role = self.factory(target)
            if epoch is not None:
                role.require_epoch(epoch)
            role.start()
            self.role, self.state = role, target
            self.changes += 1
            return role

    def stop(self) -> None:
        """Shutdown: stop the role and let the HA port go."""
        with self.lock:
            self._stop_current()
            self._release_port()

    # ---- the steps ------------------------------------------------------------------------------
    def _stop_current(self) -> Role | None:
        current = self.role
        if current is not None:
            current.stop()
        return current

    def _become_master_store(self) -> None:
        self.store.become_master()
        self._on_master_store()

    def _fall_back(self, failed: Role | None, history: epochs.EpochHistory | None,
                   state: RoleState) -> None:
        """A master that could not start: back to a replicating (or standing-by) slave, with
        the epoch history as it was and no promotion record for a restart to resume."""
        if failed is not None:
            try:
                failed.stop()
            except Exception as e:  # noqa: BLE001 - a half-started role: stop what can stop
                log_event(log, "promotion_role_stop_failed", logging.ERROR, error=repr(e))
        self.store.become_slave()
        root = self.cfg.store_root
        try:
            if history is not None:
                epochs.restore(root, history)
        except OSError as e:
            log_event(log, "epoch_restore_failed", logging.ERROR, error=repr(e))
        try:
            promotion.forget(root)  # written or not: no master term to resume
        except OSError as e:
            log_event(log, "promotion_record_not_removed", logging.ERROR, error=repr(e))
        self._hold_port()
        role = self.factory(state)
        role.start()
        self.role, self.state = role, state
        log_event(log, "broker_slave_resumed", master=state.master_ha_address)

    def _hold_port(self) -> None:
        if self._port_hold is None:
            try:
                self._port_hold = PortHold(self.cfg.ha_bind_host, self.cfg.ha_port)
            except OSError as e:
                log_event(log, "ha_port_hold_failed", logging.WARNING, error=str(e))

    def _release_port(self) -> None:
        if self._port_hold is not None:
            self._port_hold.release()
            self._port_hold = None
