"""Which producers of each group are alive, and on which connection (RocketMQ's
ProducerManager): what a transaction check-back, or any request the broker sends a producer,
is addressed by.

A ``Producer`` made with a ``group`` sends PRODUCER_HEARTBEAT to each master it knows every
``heartbeat_ms`` (and at once when it first talks to one), on its I/O thread's connection:
the request server records that connection's ROUTER identity with the producer's id. A
producer not heard from for ``PRODUCER_EXPIRY_S`` (RocketMQ's channel expiry, 120 s) is
dropped, one that closes says so (``leave``) and is dropped at once; a heartbeat on a new
connection (a reconnect) replaces the old one. A producer that did not answer a request
(``silent``: killed, or hung) is passed over by ``pick`` until its next heartbeat, as long as
another of its group is not. Memory only, as RocketMQ's: after a failover
the producers are known again after one heartbeat each. Bounded: at most MAX_GROUPS groups
and MAX_PRODUCERS_PER_GROUP producers in each (the oldest heartbeat goes first).
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
from collections.abc import Callable

PRODUCER_EXPIRY_S = 120.0
MAX_GROUPS = 10_000
MAX_PRODUCERS_PER_GROUP = 1_000


@dataclasses.dataclass(frozen=True)
class ProducerChannel:
    """One live producer: its id, the connection it heartbeats on, and when it last did."""

    group: str
    client_id: str
    identity: bytes  # the ROUTER identity of its connection (what a request to it goes on)
    address: str  # host:port of that connection, as the broker sees it
    last_seen: float  # the registry clock's time of its last heartbeat
    # the ACL account its connection authenticated as (its CURVE key; "" with the ACL off):
    # what it may be asked is checked against the ACL in force when it is asked
    account: str = ""

    def to_json(self, now: float) -> dict[str, object]:
        return {"clientId": self.client_id, "address": self.address,
                "lastHeartbeatAgoMs": int(max(0.0, now - self.last_seen) * 1000)}


class ProducerGroups:
    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 expiry_s: float = PRODUCER_EXPIRY_S):
        self._clock = clock
        self._expiry_s = expiry_s
        self._lock = threading.Lock()
        self._groups: dict[str, dict[str, ProducerChannel]] = {}
        self._turns = itertools.count()  # round robin over a group's producers (``pick``)
        self._silent: set[tuple[str, str]] = set()  # (group, client id) since a request

    def heartbeat(self, group: str, client_id: str, identity: bytes, address: str,
                  leave: bool = False, account: str = "") -> int:
        """Record (or, with ``leave``, drop) a producer; returns the group's live producers."""
        now = self._clock()
        with self._lock:
            self._expire(now)
            members = self._groups.get(group)
            if leave:
                self._silent.discard((group, client_id))
                if members is not None:
                    members.pop(client_id, None)
                    if not members:
                        del self._groups[group]
                return len(members or ())
            if members is None:
                if len(self._groups) >= MAX_GROUPS:
                    return 0  # refused quietly: the table is bounded against invented groups
                members = self._groups[group] = {}
            if client_id not in members and len(members) >= MAX_PRODUCERS_PER_GROUP:
                oldest = min(members.values(), key=lambda c: c.last_seen)
                del members[oldest.client_id]
            members[client_id] = ProducerChannel(group, client_id, identity, address, now,
                                                 account)
            self._silent.discard((group, client_id))
            return len(members)

    def silent(self, channel: ProducerChannel) -> None:
        """``channel`` did not answer a request: ``pick`` passes it over until it heartbeats
        again (a killed producer stays listed until its expiry)."""
        with self._lock:
            current = self._groups.get(channel.group, {}).get(channel.client_id)
            if current is not None and current.identity == channel.identity \
                    and current.last_seen <= channel.last_seen:
                self._silent.add((channel.group, channel.client_id))

    def now(self) -> float:
        """The registry's clock (``ProducerChannel.last_seen`` is on it)."""
        return self._clock()

    def live(self, group: str) -> list[ProducerChannel]:
        """The group's live producers, by client id."""
        now = self._clock()
        with self._lock:
            self._expire(now)
            return sorted(self._groups.get(group, {}).values(), key=lambda c: c.client_id)

    def pick(self, group: str,
             allowed: Callable[[ProducerChannel], bool] | None = None) -> ProducerChannel | None:
        """One live producer of the group, in turn (who a check-back goes to): one that did
        not fall silent, if there is one; given ``allowed``, only one it passes."""
        live = self.live(group)
        if allowed is not None:
            live = [c for c in live if allowed(c)]
        with self._lock:
            answering = [c for c in live if (group, c.client_id) not in self._silent]
        live = answering or live
        return live[next(self._turns) % len(live)] if live else None

    def groups(self) -> dict[str, int]:
        """Group -> live producers (status)."""
        now = self._clock()
        with self._lock:
            self._expire(now)
            return {g: len(m) for g, m in self._groups.items()}

    def _expire(self, now: float) -> None:
        limit = now - self._expiry_s
        for group in list(self._groups):
            members = self._groups[group]
            for cid in [c for c, ch in members.items() if ch.last_seen < limit]:
                del members[cid]
                self._silent.discard((group, cid))
            if not members:
                del self._groups[group]
