"""The controller's decisions, pure: who may lead the group, who wins, when a lease holds.

ZooKeeper is only the store these decisions are made over (``common/broker/controller.py``
drives it; this module never sees it). Under ``<chroot>/replog/<cluster>/<group>/``:

| znode          | kind       | content (JSON, UTF-8, at most ``MAX_RECORD_BYTES``)            |
|----------------|------------|-----------------------------------------------------------------|
| ``state``      | persistent | ``GroupState``: master id and epoch, the SyncStateSet and its   |
|                |            | epoch, the master's addresses; changed only by compare-and-set |
| ``brokers/<id>`` | ephemeral | ``MemberRecord``: a live broker (its session), refreshed      |
|                |            | about once a second with its offsets                           |
| ``switchover`` | persistent | ``Switchover``: a planned handover asked of the master         |
| ``topics``     | persistent | the master's topics, queue counts and odd permissions (routes: |
|                |            | ``encode_topics``; every broker of the cluster reads them all) |

Rules (RocketMQ 5's controller, Kafka's ISR, Patroni; ``docs/guarantees.md``):

* **One source of truth.** ``state`` names the master; a broker serves writes only while it won
  the compare-and-set that named it, in its current session, and its lease is fresh.
* **Election** (``decide_election``) when the master's member znode is gone (its session
  expired) or ``state`` names no master: only live members of the SyncStateSet are eligible,
  ranked by last epoch, then max offset (both descending), then ``brokerElectionPriority`` and
  id (ascending). The winner opens a new epoch numbered after every epoch the group has seen
  (``epochs.next_epoch``, which also names the winner in its low bits). Its SyncStateSet is
  itself and the live members of the old one: each holds every acknowledged message, and a put
  of the new term counts a member's ack only once it holds that put, so keeping them is safe,
  and it spares clients a burst of SLAVE_NOT_AVAILABLE while they re-point (a member that does
  not connect within the keeper's grace leaves). RocketMQ 5 starts from the winner alone. With no eligible member there is no master, unless ``enableElectUncleanMaster``: then
  the best live member wins and the bytes it may lack are reported as a range.
* **SyncStateSet upkeep** (``SyncStateSetKeeper``, run by the master): a member not heard
  from, or not caught up for ``haMaxTimeSlaveNotCatchup``, leaves; a connected slave whose ack
  reaches the offset already acknowledged to clients joins. The master commits each change to
  ``state`` before it counts on it (a removal before any put the member lacks is acknowledged).
* **Lease** (``Lease``): a master acknowledges only within ``controllerLeaseMs`` of the start
  of its last confirmed ZooKeeper write. ZooKeeper cannot expire the session sooner than one
  session timeout after that write reached it, and the lease is at most 2/3 of that, so the
  master has stopped before anyone else can be elected.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple, TypeAlias

from common.format.tables import PERM_READ_WRITE
from common.ha import epochs as ep

MAX_RECORD_BYTES = 16 * 1024
MAX_MEMBER_ID = ep.MAX_BROKER_ID
MAX_ADDRESS_CHARS = 255
MAX_OFFSET = (1 << 63) - 1
NO_PRIORITY = 2**31 - 1
MAX_TOPICS_BYTES = 1000 * 1024  # within ZooKeeper's default znode limit (jute.maxbuffer, 1 MiB)
MAX_TOPIC_CHARS = 255
MAX_QUEUES = 1024
ROLES = ("MASTER", "SLAVE", "STARTING")
MAX_FAULT_CHARS = 512


class RecordError(ValueError):
    """A znode's content is not a record of the expected shape (names the field)."""


# ---- records ---------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class GroupState:
    """The ``state`` znode: which member is the master, in which epoch, and who is in sync."""

    master: int | None  # member id; None: no master (none eligible, or one resigned)
    master_epoch: int
    master_address: str
    master_ha_address: str
    sync_state_set: frozenset[int]
    sync_state_set_epoch: int
    # member -> the storeId it had when it entered the set (a wiped or replaced disk comes
    # back with another one: not the replica that holds what was acknowledged). A member
    # without one (a state written before store ids) is taken on its word.
    stores: Mapping[int, str] = dataclasses.field(default_factory=dict, compare=False)

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, GroupState) and self._key() == other._key()
                and dict(self.stores) == dict(other.stores))

    def __hash__(self) -> int:
        return hash(self._key())

    def _key(self) -> tuple[Any, ...]:
        return (self.master, self.master_epoch, self.master_address, self.master_ha_address,
                self.sync_state_set, self.sync_state_set_epoch)

    def to_bytes(self) -> bytes:
        doc: dict[str, Any] = {
            "masterId": self.master,
            "masterEpoch": self.master_epoch,
            "masterAddress": self.master_address,
            "masterHaAddress": self.master_ha_address,
            "syncStateSet": sorted(self.sync_state_set),
            "syncStateSetEpoch": self.sync_state_set_epoch,
        }
        if self.stores:
            doc["syncStateSetStores"] = {str(m): self.stores[m] for m in sorted(self.stores)}
        return _dump(doc)

    @classmethod
    def from_bytes(cls, raw: bytes) -> GroupState:
        doc = _load(raw, "state", {"masterId", "masterEpoch", "masterAddress", "masterHaAddress",
                                   "syncStateSet", "syncStateSetEpoch"},
                    optional={"syncStateSetStores"})
        master = doc["masterId"]
        if master is not None:
            master = _int(master, "state.masterId", 1, MAX_MEMBER_ID)
        members = doc["syncStateSet"]
        if not isinstance(members, list) or len(members) > MAX_MEMBER_ID:
            raise RecordError("state.syncStateSet: not a list of member ids")
        sss = frozenset(_int(m, "state.syncStateSet[]", 1, MAX_MEMBER_ID) for m in members)
        if len(sss) != len(members):
            raise RecordError("state.syncStateSet: a member is listed twice")
        if master is not None and master not in sss:
            raise RecordError(f"state: master {master} is not in its SyncStateSet {sorted(sss)}")
        return cls(
            master=master,
            master_epoch=_int(doc["masterEpoch"], "state.masterEpoch", 0, MAX_OFFSET),
            master_address=_address(doc["masterAddress"], "state.masterAddress"),
            master_ha_address=_address(doc["masterHaAddress"], "state.masterHaAddress"),
            sync_state_set=sss,
            sync_state_set_epoch=_int(doc["syncStateSetEpoch"], "state.syncStateSetEpoch", 0,
                                      MAX_OFFSET),
            stores=_stores(doc.get("syncStateSetStores", {}), sss),
        )

    def with_sync_state_set(self, members: Iterable[int],
                            stores: Mapping[int, str] | None = None) -> GroupState:
        """The set ``members`` one set epoch on; each member keeps the storeId recorded for
        it, or takes the one ``stores`` gives (a member joining: its record's)."""
        members = frozenset(members)
        kept = {m: sid for m, sid in {**dict(self.stores), **dict(stores or {})}.items()
                if m in members and sid}
        return dataclasses.replace(self, sync_state_set=members,
                                   sync_state_set_epoch=self.sync_state_set_epoch + 1,
                                   stores=kept)

    def same_store(self, record: MemberRecord) -> bool:
        """Whether ``record`` is the replica that entered the set (its storeId, where one
        was recorded for it and it says one)."""
        recorded = self.stores.get(record.member_id)
        return not recorded or not record.store_id or recorded == record.store_id

    def without_master(self) -> GroupState:
        """The master resigns (or lost its session before a restart): no one serves writes
        until an election. The SyncStateSet stays: it still says who holds everything."""
        return dataclasses.replace(self, master=None, master_address="", master_ha_address="")


@dataclasses.dataclass(frozen=True)
class MemberRecord:
    """A ``brokers/<id>`` znode: one live broker of the group."""

    member_id: int
    address: str  # client address (brokerIP1:listenPort)
    ha_address: str
    role: str  # MASTER | SLAVE | STARTING
    last_epoch: int  # the newest epoch in its epoch file
    max_offset: int  # its CommitLog's max physical offset
    confirm_offset: int  # a master: the offset acknowledged to clients; a slave: its max
    priority: int = NO_PRIORITY  # brokerElectionPriority: lower wins among equals
    incarnation: str = ""  # one per process start: tells this process's record from an old one
    store_id: str = ""  # its store's identity (config/storeId): a new disk, a new one
    fault: str = ""  # why it may not lead (it failed to take over): "" while it may

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.member_id, "address": self.address, "haAddress": self.ha_address,
            "role": self.role, "lastEpoch": self.last_epoch, "maxOffset": self.max_offset,
            "confirmOffset": self.confirm_offset, "priority": self.priority,
            "incarnation": self.incarnation, "storeId": self.store_id, "fault": self.fault,
        }

    def to_bytes(self) -> bytes:
        return _dump(self.to_json())

    @classmethod
    def from_bytes(cls, raw: bytes) -> MemberRecord:
        doc = _load(raw, "member", {"id", "address", "haAddress", "role", "lastEpoch",
                                    "maxOffset", "confirmOffset", "priority", "incarnation"},
                    optional={"storeId", "fault"})
        role = doc["role"]
        if role not in ROLES:
            raise RecordError(f"member.role: {role!r} is not one of {', '.join(ROLES)}")
        incarnation = doc["incarnation"]
        if not isinstance(incarnation, str) or len(incarnation) > 64:
            raise RecordError("member.incarnation: not a short string")
        store_id = doc.get("storeId", "")
        if not isinstance(store_id, str) or len(store_id) > 64:
            raise RecordError("member.storeId: not a short string")
        fault = doc.get("fault", "")
        if not isinstance(fault, str) or len(fault) > MAX_FAULT_CHARS:
            raise RecordError(f"member.fault: not a string of at most {MAX_FAULT_CHARS}")
        return cls(
            member_id=_int(doc["id"], "member.id", 1, MAX_MEMBER_ID),
            address=_address(doc["address"], "member.address"),
            ha_address=_address(doc["haAddress"], "member.haAddress"),
            role=role,
            last_epoch=_int(doc["lastEpoch"], "member.lastEpoch", 0, MAX_OFFSET),
            max_offset=_int(doc["maxOffset"], "member.maxOffset", 0, MAX_OFFSET),
            confirm_offset=_int(doc["confirmOffset"], "member.confirmOffset", 0, MAX_OFFSET),
            priority=_int(doc["priority"], "member.priority", -(2**31), 2**31 - 1),
            incarnation=incarnation,
            store_id=store_id,
            fault=fault,
        )


@dataclasses.dataclass(frozen=True)
class Switchover:
    """The ``switchover`` znode: an operator asked the master to hand over to ``target``."""

    target: int
    requested_at_ms: int

    def to_bytes(self) -> bytes:
        return _dump({"target": self.target, "requestedAtMs": self.requested_at_ms})

    @classmethod
    def from_bytes(cls, raw: bytes) -> Switchover:
        doc = _load(raw, "switchover", {"target", "requestedAtMs"})
        return cls(_int(doc["target"], "switchover.target", 1, MAX_MEMBER_ID),
                   _int(doc["requestedAtMs"], "switchover.requestedAtMs", 0, MAX_OFFSET))


def _dump(doc: dict[str, Any]) -> bytes:
    raw = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    assert len(raw) <= MAX_RECORD_BYTES, len(raw)
    return raw


def _stores(value: Any, members: frozenset[int]) -> dict[int, str]:
    if not isinstance(value, dict):
        raise RecordError("state.syncStateSetStores: not an object")
    out = {}
    for key, store_id in value.items():
        member = _int(int(key) if isinstance(key, str) and key.isdigit() else key,
                      "state.syncStateSetStores", 1, MAX_MEMBER_ID)
        if member not in members or not isinstance(store_id, str) or len(store_id) > 64:
            raise RecordError(f"state.syncStateSetStores: member {key} is not in the set, or "
                              "its storeId is not a short string")
        out[member] = store_id
    return out


def _load(raw: bytes, what: str, keys: set[str],
          optional: set[str] = frozenset()) -> dict[str, Any]:  # type: ignore[assignment]
    if not isinstance(raw, bytes | bytearray) or len(raw) > MAX_RECORD_BYTES:
        raise RecordError(f"{what}: not a record of at most {MAX_RECORD_BYTES} bytes")
    try:
        doc = json.loads(bytes(raw).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise RecordError(f"{what}: not JSON: {e}") from None
    if not isinstance(doc, dict):
        raise RecordError(f"{what}: not a JSON object")
    missing, extra = keys - doc.keys(), doc.keys() - keys - optional
    if missing or extra:
        raise RecordError(f"{what}: missing {sorted(missing)}, unknown {sorted(extra)}")
    return doc


def _int(value: Any, field: str, lo: int, hi: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise RecordError(f"{field}: {value!r} is not an integer in {lo}..{hi}")
    return value


def _address(value: Any, field: str) -> str:
    if not isinstance(value, str) or len(value) > MAX_ADDRESS_CHARS:
        raise RecordError(f"{field}: not an address")
    if value:
        host, sep, port = value.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise RecordError(f"{field}: {value!r} is not host:port")
    return value


def encode_topics(topics: dict[str, int], perms: Mapping[str, int] | None = None) -> bytes:
    """A group's ``topics`` znode: the topics its master holds, their queue counts and, for
    topics whose permission is not read|write (6), their ``perm`` (RocketMQ's TopicRouteData
    queue data: what routes are made of). ``{"topics": {name: queues}, "perms": {name: p}}``."""
    odd = {t: p for t, p in sorted((perms or {}).items()) if t in topics and p != PERM_READ_WRITE}
    doc: dict[str, Any] = {"topics": dict(sorted(topics.items()))}
    if odd:
        doc["perms"] = odd
    raw = json.dumps(doc, separators=(",", ":")).encode()
    if len(raw) > MAX_TOPICS_BYTES:
        raise RecordError(f"topics: {len(raw)} bytes, more than {MAX_TOPICS_BYTES}")
    return raw


def topics_room(topics: dict[str, int], perms: Mapping[str, int] | None = None) -> str:
    """"" if a group's ``topics`` record of these topics fits in its znode (a master refuses
    to create a topic past it, so no producer's auto-created topics can make the record
    unpublishable); else why not."""
    try:
        encode_topics(topics, perms)
    except RecordError as e:
        return (f"the group's route record would be {e}: at most {MAX_TOPICS_BYTES} bytes "
                f"fit in the ZooKeeper node that publishes them (ZooKeeper's jute.maxbuffer), "
                f"about {len(topics) - 1} topics of these names; delete topics, or create "
                f"fewer or shorter ones")
    return ""


def decode_topics(raw: bytes) -> dict[str, int]:
    return decode_topic_routes(raw)[0]


def decode_topic_routes(raw: bytes) -> tuple[dict[str, int], dict[str, int]]:
    """A ``topics`` znode -> (topic -> queue count, topic -> perm for every topic)."""
    if not isinstance(raw, bytes | bytearray) or len(raw) > MAX_TOPICS_BYTES:
        raise RecordError(f"topics: not a record of at most {MAX_TOPICS_BYTES} bytes")
    try:
        doc = json.loads(bytes(raw).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise RecordError(f"topics: not JSON: {e}") from None
    if not isinstance(doc, dict) or not {"topics"} <= set(doc) <= {"topics", "perms"} \
            or not isinstance(doc["topics"], dict) or not isinstance(doc.get("perms", {}), dict):
        raise RecordError("topics: not {\"topics\": {name: queues}, \"perms\": {name: perm}}")
    out = {}
    for name, nums in doc["topics"].items():
        if not isinstance(name, str) or not name or len(name) > MAX_TOPIC_CHARS:
            raise RecordError(f"topics: bad topic name {name!r}")
        out[name] = _int(nums, f"topics[{name}]", 1, MAX_QUEUES)
    perms = dict.fromkeys(out, PERM_READ_WRITE)
    for name, perm in doc.get("perms", {}).items():
        if name not in out:
            raise RecordError(f"perms: {name!r} is not among the topics")
        perms[name] = _int(perm, f"perms[{name}]", 0, 7)
    return out, perms


@dataclasses.dataclass(frozen=True)
class GroupView:
    """One broker group as the controller sees it in ZooKeeper (the cluster view every broker
    keeps, which routes are answered from)."""

    name: str
    state: GroupState | None
    members: dict[int, MemberRecord]
    topics: dict[str, int]
    perms: dict[str, int] = dataclasses.field(default_factory=dict)  # read|write when absent

    def perm(self, topic: str) -> int:
        return self.perms.get(topic, PERM_READ_WRITE)

    @property
    def master_address(self) -> str:
        """The master's client address, if it is elected and live ("" otherwise)."""
        s = self.state
        if s is None or s.master is None or s.master not in self.members:
            return ""
        return s.master_address

    def slave_addresses(self) -> list[str]:
        master = self.state.master if self.state is not None else None
        return [m.address for i, m in sorted(self.members.items()) if i != master]

    def to_json(self) -> dict[str, Any]:
        s = self.state
        return {
            "brokerName": self.name,
            "master": self.master_address,
            "masterId": s.master if s is not None else None,
            "masterEpoch": s.master_epoch if s is not None else 0,
            "syncStateSet": sorted(s.sync_state_set) if s is not None else [],
            "slaves": self.slave_addresses(),
            "members": {str(i): m.to_json() for i, m in sorted(self.members.items())},
            "topics": dict(self.topics),
            "perms": {t: self.perm(t) for t in sorted(self.topics)},
        }


# ---- election --------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class MasterAlive:
    """The master named in ``state`` still has a session: nothing to elect."""


@dataclasses.dataclass(frozen=True)
class Elect:
    """This broker wins: compare-and-set ``state`` to ``state`` (then serve as master)."""

    state: GroupState
    unclean: bool = False
    lost_from: int = 0  # unclean: bytes [lost_from, lost_to) may be gone for good
    lost_to: int = 0


@dataclasses.dataclass(frozen=True)
class Defer:
    """Another live candidate ranks higher: it should win; wait and look again."""

    to: int


@dataclasses.dataclass(frozen=True)
class NoMaster:
    """No member may lead; ``reason`` says why (status and logs show it)."""

    reason: str


ElectionDecision: TypeAlias = MasterAlive | Elect | Defer | NoMaster


def rank_key(m: MemberRecord) -> tuple[int, int, int, int]:
    """Best first: newest epoch, longest log, lowest priority number, lowest id."""
    return (-m.last_epoch, -m.max_offset, m.priority, m.member_id)


def decide_election(state: GroupState | None, live: Mapping[int, MemberRecord], me: int,
                    unclean_enabled: bool, known_max_offset: int = 0) -> ElectionDecision:
    """What member ``me`` should do about the group's master.

    ``state`` None: the group has never had one (its first start): every live member is
    eligible. ``known_max_offset``: the longest log any member was last seen with (for the
    loss an unclean election reports)."""
    if state is not None and state.master is not None and state.master in live:
        return MasterAlive()
    if me not in live:
        return NoMaster(f"member {me} is not registered")
    unclean = False
    # a member that failed to take over stands no more (until an operator clears it): the
    # others elect among themselves instead of deferring to it for ever
    standing = {i: m for i, m in live.items() if not m.fault}
    barred = sorted(i for i, m in live.items() if m.fault)
    if state is None:
        eligible = list(standing.values())
    else:
        # a member whose store is not the one that entered the set (a wiped or replaced
        # disk) does not hold what was acknowledged: it is no candidate
        replaced = sorted(i for i, m in standing.items()
                          if i in state.sync_state_set and not state.same_store(m))
        eligible = [m for m in standing.values()
                    if m.member_id in state.sync_state_set and state.same_store(m)]
        if not eligible:
            if not unclean_enabled:
                held = ", ".join(map(str, sorted(state.sync_state_set))) or "none"
                why = ""
                if replaced:
                    why += f"; members {replaced} came back with another store"
                if barred:
                    why += f"; members {barred} failed to take over (a fault to clear)"
                return NoMaster(
                    f"no live member of the SyncStateSet [{held}] to elect (live: "
                    f"{', '.join(map(str, sorted(live))) or 'none'}{why}); electing another "
                    "could lose acknowledged messages: bring a member back, or set "
                    "enableElectUncleanMaster")
            eligible = list(standing.values())
            unclean = True
    if not eligible:
        return NoMaster(f"every live member failed to take over: {barred} (clear the fault "
                        "with replog controller clear-fault once the store is mended)")
    best = min(eligible, key=rank_key)
    if best.member_id != me:
        return Defer(best.member_id)
    mine = live[me]
    newest = max([mine.last_epoch, *(m.last_epoch for m in live.values())]
                 + ([state.master_epoch] if state is not None else []))
    epoch = ep.next_epoch(newest, me)
    sss_epoch = state.sync_state_set_epoch + 1 if state is not None else 1
    own = {me: mine.store_id} if mine.store_id else {}
    if unclean:
        new = GroupState(me, epoch, mine.address, mine.ha_address, frozenset({me}), sss_epoch,
                         own)
        return Elect(new, True, mine.max_offset, max(mine.max_offset, known_max_offset))
    kept = frozenset(m.member_id for m in eligible)
    stores = {m: sid for m, sid in (state.stores if state else {}).items() if m in kept}
    return Elect(GroupState(me, epoch, mine.address, mine.ha_address, kept | {me}, sss_epoch,
                            {**stores, **own}))


# ---- SyncStateSet upkeep ---------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class SlaveProgress:
    """One connected slave as the master's HA service sees it."""

    member_id: int
    ack_offset: int


@dataclasses.dataclass(frozen=True)
class SetChange:
    """Propose ``members`` (a removal, or an addition whose member holds ``confirm_offset``)."""

    members: frozenset[int]
    removed: frozenset[int]
    added: frozenset[int]
    reason: str


@dataclasses.dataclass(frozen=True)
class Join:
    """A slave joining the SyncStateSet: puts wait for it from ``since_ms``; ``change`` is
    proposed once its ack reaches ``mark`` (the log's end when the join began)."""

    member: int
    mark: int
    since_ms: int
    change: SetChange
    pending: frozenset[int]  # the set puts wait for meanwhile: the committed one and it


class KeeperStep(NamedTuple):
    propose: SetChange | None = None  # to the controller now
    joined: bool = False  # a join began: puts wait for ``pending()`` from now
    cancelled: str = ""  # a join was called off: why


class SyncStateSetKeeper:
    """The master's view of who is caught up, the one change it would make next, and the
    two-step join of a slave.

    ``check`` is called every check interval (the HA service's timer) with the committed set,
    the connected slaves and the master's max offset. A member is *caught up* at a check if its
    ack reached the master's max of the previous check (under a steady load an active slave is
    always one round trip behind the current max). A removal is proposed at once. A slave
    joins in two steps, so that it holds every acknowledged put: first it is only *pending*
    (``pending()``: puts wait for it too) from a mark, the log's end then (``mark_of``, which
    also bounds what consumers see there); the change is proposed at a later check once its
    ack reaches the mark, or the join is called off when it disconnects or does not within
    ``join_timeout_ms``. ``settled`` ends a join when the controller answered its proposal.
    Pure: no clock, no I/O (the seeded simulation drives it, ``tests/sim/``)."""

    def __init__(self, me: int, max_not_caught_up_ms: int, connect_grace_ms: int = 0,
                 started_ms: int = 0, join_timeout_ms: int = 3000):
        self.me = me
        self.max_not_caught_up_ms = max_not_caught_up_ms
        self.join_timeout_ms = join_timeout_ms
        # a member kept from the last term has this long to connect to the new master
        self.connect_grace_until_ms = started_ms + connect_grace_ms
        self._caught_up_ms: dict[int, int] = {}
        self._previous_max = 0
        self._check_max = 0  # the log's end at the last check that looked for a change
        self.joining: Join | None = None

    def pending(self) -> frozenset[int] | None:
        """The set puts wait for while a slave joins (None: no join under way)."""
        return self.joining.pending if self.joining is not None else None

    def settled(self) -> None:
        """The controller answered a proposal (committed or not): no join is under way."""
        self.joining = None

    def check(self, committed: frozenset[int], slaves: Sequence[SlaveProgress],
              master_max: int, epoch_start: int, now_ms: int, confirmed: int = 0,
              mark_of: Callable[[], int] | None = None) -> KeeperStep:
        """One check (see the class). ``mark_of``: the log's end now, called when a join
        begins (the master's HA service binds what consumers see there); default
        ``master_max``."""
        join = self.joining
        if join is not None:
            ack = next((s.ack_offset for s in slaves if s.member_id == join.member), None)
            if ack is not None and ack >= join.mark:
                return KeeperStep(propose=join.change)
            if ack is None or now_ms - join.since_ms > self.join_timeout_ms:
                self.joining = None
                return KeeperStep(cancelled=(
                    f"member {join.member} {'disconnected' if ack is None else 'held ' + str(ack)}"
                    f" and did not reach {join.mark} within {now_ms - join.since_ms} ms"))
            return KeeperStep()
        change = self.observe(committed, slaves, master_max, self._check_max, epoch_start,
                              now_ms, confirmed)
        self._check_max = master_max
        if change is None:
            return KeeperStep()
        if not change.added:
            return KeeperStep(propose=change)
        member = min(change.added)
        mark = mark_of() if mark_of is not None else master_max
        self.joining = Join(member, max(mark, master_max), now_ms, change,
                            frozenset(committed | {member, self.me}))
        return KeeperStep(joined=True)

    def observe(self, committed: frozenset[int], slaves: Sequence[SlaveProgress],
                master_max: int, confirm_offset: int, epoch_start: int,
                now_ms: int, confirmed: int = 0) -> SetChange | None:
        """``confirmed``: what every member of the set held when last counted (the master's
        confirmed offset): a member first seen holding less lost data (a wiped or replaced
        disk) and leaves at once; any other member counts as caught up on first sight."""
        acks = {s.member_id: s.ack_offset for s in slaves if s.member_id != self.me}
        lost = {}
        for member, ack in acks.items():
            first_seen = member not in self._caught_up_ms
            if first_seen and member in committed and ack < confirmed:
                lost[member] = ack
            elif first_seen or ack >= min(self._previous_max, master_max):
                self._caught_up_ms[member] = now_ms
        for gone in [m for m in self._caught_up_ms if m not in acks]:
            del self._caught_up_ms[gone]
        self._previous_max = master_max
        removed = set()
        reasons = []
        for member in sorted(committed - {self.me}):
            if member in lost:
                removed.add(member)
                reasons.append(f"member {member} came back holding {lost[member]}, less than "
                               f"the {confirmed} every member held: its log lost data")
            elif member not in acks:
                if now_ms < self.connect_grace_until_ms:
                    continue  # re-pointing to this new master: its puts wait meanwhile
                removed.add(member)
                reasons.append(f"member {member} is not connected")
            elif now_ms - self._caught_up_ms[member] > self.max_not_caught_up_ms:
                removed.add(member)
                reasons.append(f"member {member} has not caught up for "
                               f"{now_ms - self._caught_up_ms[member]} ms (ack {acks[member]}, "
                               f"master {master_max})")
        if removed:
            return SetChange(frozenset(committed - removed) | {self.me}, frozenset(removed),
                             frozenset(), "; ".join(reasons))
        for member in sorted(acks):
            ack = acks[member]
            if member not in committed and ack >= confirm_offset and ack >= epoch_start:
                return SetChange(frozenset(committed | {member, self.me}), frozenset(),
                                 frozenset({member}),
                                 f"member {member} holds {ack} >= {confirm_offset} acknowledged")
        return None


# ---- the master's lease ----------------------------------------------------------------------
class Lease:
    """Writes are acknowledged only while ``fresh(now)``: within ``duration_ms`` of the start
    of the last ZooKeeper write that succeeded in the session the master was elected in.
    Monotonic seconds in, never the wall clock.

    ``expire`` starts a new generation: a write sent before it (before a suspension, before
    mastership was lost or won again) confirms nothing when its answer comes in after it.
    Confirmations come from the controller thread and from kazoo's callback thread, so
    ``confirm`` and ``expire`` take a lock; ``fresh`` (every write, on the I/O thread) reads
    one float and takes none."""

    def __init__(self, duration_ms: int):
        if duration_ms <= 0:
            raise ValueError(f"lease of {duration_ms} ms")
        self.duration_s = duration_ms / 1000.0
        self._confirmed_at = float("-inf")
        self._generation = 0
        self._lock = threading.Lock()

    @property
    def generation(self) -> int:
        """Read before sending the write that is to confirm the lease."""
        return self._generation

    def confirm(self, sent_at: float, generation: int) -> bool:
        """A write sent at ``sent_at``, when the lease's generation was ``generation``,
        succeeded: the session was alive when it arrived. False (nothing changes) when the lease
        was expired since."""
        with self._lock:
            if generation != self._generation:
                return False
            self._confirmed_at = max(self._confirmed_at, sent_at)
            return True

    def expire(self) -> None:
        with self._lock:
            self._generation += 1
            self._confirmed_at = float("-inf")

    def fresh(self, now: float) -> bool:
        return now - self._confirmed_at < self.duration_s

    def age_s(self, now: float) -> float | None:
        """Seconds since the last confirmed write started (None: never confirmed)."""
        return None if self._confirmed_at == float("-inf") else now - self._confirmed_at
