"""The composition root: the one module that knows the role classes (``master/``, ``slave/``)
and hands them to ``common.broker.broker.Broker``; ``replog broker -c FILE`` runs here."""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from common.cli.output import EXIT_FAILED, EXIT_OK, err
from common.core.config import load_config
from common.core.errors import StoreError
from common.ha import promotion

if TYPE_CHECKING:
    from common.broker.broker import Broker
    from common.broker.role_manager import Role, RoleState

GIL_SWITCH_INTERVAL_S = 0.0005


def make_role(state: RoleState, broker: Broker) -> Role:
    """Build the role object for ``state`` (the broker hands itself in); the role runs with
    ``state.view(cfg)``: the loaded configuration with the running role's name, id and master."""
    cfg = state.view(broker.cfg)
    if not state.is_master:
        from slave.config_sync import ConfigSync
        from slave.ha_client import build_slave_replication
        from slave.role import SlaveRole

        keys = broker.security.peer_keys()  # None unless aclEnable
        ha_client = build_slave_replication(cfg, broker.store, curve=keys)
        sync = ConfigSync(cfg.slaveConfigSyncIntervalMs, ha_client.master_address,
                          broker.apply_master_document, curve=keys)
        return SlaveRole(cfg, ha_client=ha_client, config_sync=sync)
    from master.ha_service import build_master_replication
    from master.role import MasterRole
    from master.transaction_check import TransactionCheck

    # the request server's I/O thread drives the HA socket itself (no thread hand-off per put)
    service, waiter = build_master_replication(
        cfg, broker.store, state.name, host=broker.server, sync_state=broker.controller,
        security=broker.security,
    )
    check = TransactionCheck(cfg, broker.store, broker.producer_groups,
                             broker.server.client_requests.ask, broker.offsets,
                             gate=broker.write_refusal,
                             publisher_refusal=broker.security.publisher_refusal
                             if broker.security.enabled else None)
    gate = broker.write_refusal if broker.controller is not None else None
    return MasterRole(cfg, broker.store, broker.topics, state.name, waiter, service,
                      write_gate=gate, transaction_check=check)


def run_broker(config_path: str, overrides: Sequence[str]) -> int:
    from common.broker.broker import Broker
    from common.store.message_store import MessageStore

    cfg = load_config(config_path, overrides)
    # The I/O thread gives up the GIL on every socket call; with the default 5 ms switch
    # interval a busy store thread (reput, flush) can hold it that long each time (convoy).
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s level=%(levelname)s logger=%(name)s %(message)s",
        stream=sys.stderr,
    )
    try:
        replica = promotion.repairs_from_master(cfg.is_slave, cfg.store_root)
        # delay delivery writes to the log: the broker turns it on once it knows it is master
        store = MessageStore(cfg, repair_from_master=replica, start_master_services=False)
        broker = Broker(cfg, store, make_role)
        status = broker.serve_forever()  # non-zero: its I/O thread died (logged at ERROR)
    except (StoreError, ValueError, OSError) as e:
        logging.getLogger("replog.broker").error("event=broker_start_failed error=%r", str(e))
        err.print(f"replog broker: cannot start: {e}", soft_wrap=True)
        return EXIT_FAILED
    return status or EXIT_OK



