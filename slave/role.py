"""The slave role: refuses every write, runs the HA client, serves reads (through the server).

Every SEND, SEND_BATCH and CREATE_TOPIC is answered SERVICE_NOT_AVAILABLE with a remark naming
the SLAVE role, this broker and its master's addresses (the client one its master told it, and
``haMasterAddress``), before anything reaches the store: a slave's CommitLog only grows by replication. Promotion (``Broker.promote``)
stops this role, records a new epoch and starts a master role in its place.

Hook for replication (slave/ha_client.py): an ``ha_client`` (``HaClient`` below). Hook for the
master's tables (slave/config_sync.py): a ``config_sync`` (``ConfigSyncer``); it is stopped
first, so a promoted broker's tables change no more once the role is stopped.
"""

from __future__ import annotations

from typing import Any, Protocol

from common.broker.replies import reply
from common.core.config import BrokerConfig
from common.core.errors import ResponseCode
from common.format.protocol import Request, Response


class HaClient(Protocol):
    def start(self) -> None: ...

    def stop(self) -> bool: ...  # False: its thread did not end in time (the store fences it)

    def master_address(self) -> str: ...  # the master's client address ("" before it answered)

    def status(self) -> dict[str, Any]: ...  # haState, lagBytes, resyncs...

    def health(self) -> dict[str, Any]: ...  # state, failures, restarts, lastError

    def require_epoch(self, epoch: int) -> None: ...  # refuse masters of older epochs

    def replicating(self) -> bool: ...  # bytes arrive from the master now (TRANSFER)


class ConfigSyncer(Protocol):
    def start(self) -> None: ...

    def stop(self) -> None: ...

    def status(self) -> dict[str, Any]: ...


class SlaveRole:
    """brokerRole SLAVE."""

    def __init__(self, cfg: BrokerConfig, ha_client: HaClient | None = None,
                 config_sync: ConfigSyncer | None = None):
        self.cfg = cfg
        self.ha_client = ha_client
        self.config_sync = config_sync
        self.refused = 0
        self.replication_stopped = True  # False: the HA client's stop timed out

    @property
    def name(self) -> str:
        return "SLAVE"

    def start(self) -> None:
        if self.ha_client is not None:
            self.ha_client.start()
        if self.config_sync is not None:
            self.config_sync.start()

    def stop(self) -> None:
        if self.config_sync is not None:
            self.config_sync.stop()
        if self.ha_client is not None:
            self.replication_stopped = bool(self.ha_client.stop())

    def master_address(self) -> str:
        """The master's client address, as the master told it ("" until it has answered)."""
        return self.ha_client.master_address() if self.ha_client is not None else ""

    def slave_acks(self) -> dict[int, int]:
        return {}  # a slave has none

    def replicating(self) -> bool:
        return self.ha_client is not None and self.ha_client.replicating()

    def require_epoch(self, epoch: int) -> None:
        if self.ha_client is not None:
            self.ha_client.require_epoch(epoch)

    def status_fields(self) -> dict[str, Any]:
        replication = self.ha_client.status() if self.ha_client is not None else {}
        return {
            "masterAddress": self.master_address(),
            "haMasterAddress": self.cfg.haMasterAddress,
            "slaves": [],
            "refusedWrites": self.refused,
            "replication": replication,
            "configSync": self.config_sync.status() if self.config_sync is not None else {},
            "health": self._health(),
        }

    def _health(self) -> dict[str, Any]:
        return {"haClient": self.ha_client.health()} if self.ha_client is not None else {}

    def refusal(self, req: Request) -> Response:
        """Every write: refused before anything reaches the store (a slave's CommitLog grows
        by replication only)."""
        self.refused += 1
        master = self.master_address()
        where = f"at {master}" if master else "(not heard from yet)"
        remark = (
            f"broker {self.cfg.brokerName} id {self.cfg.brokerId} is a SLAVE and refuses "
            f"{req.code.name}; send to its master {where} (haMasterAddress "
            f"{self.cfg.haMasterAddress})"
        )
        return reply(req, ResponseCode.SERVICE_NOT_AVAILABLE, remark)
